// Time for the limit modules. Everything that counts per window or per minute reads an injected Clock,
// so tests drive minutes with a ManualClock instead of waiting for them.

export interface Clock {
  /** Milliseconds since the Unix epoch (UTC). */
  now(): number;
  /**
   * Present on a clock that moves only when told (ManualClock): `listener` runs after each move, as
   * no timer can follow such a clock. Absent on the system clock, which timers follow.
   */
  onMove?(listener: () => void): void;
}

export const systemClock: Clock = { now: () => Date.now() };

/** 2025-01-01T00:00:00Z: aligned to a minute, so `advance(60_000)` lands on the next minute's top. */
const DEFAULT_MANUAL_START_MS = Date.UTC(2025, 0, 1, 0, 0, 0);

/** A clock that only moves when told to. For tests and benchmarks. */
export class ManualClock implements Clock {
  private ms: number;
  private readonly listeners: Array<() => void> = [];

  constructor(startMs: number = DEFAULT_MANUAL_START_MS) {
    this.ms = startMs;
  }

  now(): number {
    return this.ms;
  }

  set(ms: number): void {
    this.ms = ms;
    this.moved();
  }

  advance(ms: number): void {
    this.ms += ms;
    this.moved();
  }

  onMove(listener: () => void): void {
    this.listeners.push(listener);
  }

  private moved(): void {
    for (const l of this.listeners) l();
  }
}

/** Longest a timer waits at once (setTimeout's own bound is about 24.8 days); an early ring re-arms. */
const MAX_TIMER_MS = 3_600_000;

/**
 * One timer for a deadline on a Clock: `ring` runs once the clock reaches it, always from a timer
 * callback (never inside `set` or inside the clock's move), so whoever sets it is never re-entered.
 * On a clock that moves only when told, it follows the clock's moves instead of the wall.
 */
export class Alarm {
  private at = Infinity;
  private timer: ReturnType<typeof setTimeout> | null = null;

  constructor(
    private readonly clock: Clock,
    private readonly ring: () => void,
  ) {
    clock.onMove?.(() => this.arm());
  }

  /** When it rings next (Infinity: never). */
  get deadline(): number {
    return this.at;
  }

  /** Rings at `ms` on the clock (Infinity: never), replacing any earlier setting. */
  set(ms: number): void {
    if (ms === this.at) return;
    this.at = ms;
    this.arm();
  }

  private arm(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.at === Infinity) return;
    const wait = this.at - this.clock.now();
    if (wait > 0 && this.clock.onMove) return;
    this.timer = setTimeout(() => this.fire(), Math.min(Math.max(0, wait), MAX_TIMER_MS));
    this.timer.unref?.();
  }

  private fire(): void {
    this.timer = null;
    if (this.clock.now() < this.at) return this.arm();
    this.at = Infinity;
    this.ring();
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
