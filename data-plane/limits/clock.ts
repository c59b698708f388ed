// Time for the limit modules. Everything that counts per window or per minute reads an injected Clock,
// so tests drive minutes with a ManualClock instead of waiting for them.

export interface Clock {
  /** Milliseconds since the Unix epoch (UTC). */
  now(): number;
}

export const systemClock: Clock = { now: () => Date.now() };

/** 2025-01-01T00:00:00Z: aligned to a minute, so `advance(60_000)` lands on the next minute's top. */
const DEFAULT_MANUAL_START_MS = Date.UTC(2025, 0, 1, 0, 0, 0);

/** A clock that only moves when told to. For tests and benchmarks. */
export class ManualClock implements Clock {
  private ms: number;

  constructor(startMs: number = DEFAULT_MANUAL_START_MS) {
    this.ms = startMs;
  }

  now(): number {
    return this.ms;
  }

  set(ms: number): void {
    this.ms = ms;
  }

  advance(ms: number): void {
    this.ms += ms;
  }
}

export const MINUTE_MS = 60_000;

/** The UTC clock minute a timestamp falls in, as an integer (minutes since the epoch). */
export function minuteOf(ms: number): number {
  return Math.floor(ms / MINUTE_MS);
}

/**
 * Seconds from `ms` to the top of the next clock minute, rounded up, at least 1 (the gateway's
 * `retry-after`). At exactly the top of a minute the whole minute remains: 60.
 */
export function secondsToNextMinute(ms: number): number {
  const intoMinute = ((ms % MINUTE_MS) + MINUTE_MS) % MINUTE_MS;
  return Math.max(1, Math.ceil((MINUTE_MS - intoMinute) / 1000));
}
