// `tollgate key find` per caller: at most FIND_KEY_PER_MINUTE lookups in a fixed clock minute. Key values
// carry 256 random bits, so guessing is hopeless anyway; the limit bounds the hashing and database work
// one console token can cause and makes a scripted search visible (RESOURCE_EXHAUSTED, 429 in the CLI).
// Memory: one entry per caller seen this minute; the map is emptied when the minute changes.
import { CpError } from '../errors.js';

export const FIND_KEY_PER_MINUTE = 30;

export class FindKeyLimiter {
  private minute = -1;
  private readonly counts = new Map<string, number>();

  constructor(private readonly perMinute = FIND_KEY_PER_MINUTE) {}

  /** Counts one lookup of `callerId` at `nowMs`, or throws RATE_LIMITED naming when to retry. */
  take(callerId: string, nowMs: number): void {
    const minute = Math.floor(nowMs / 60_000);
    if (minute !== this.minute) {
      this.minute = minute;
      this.counts.clear();
    }
    const n = this.counts.get(callerId) ?? 0;
    if (n >= this.perMinute) {
      const retrySec = Math.max(1, Math.ceil(((minute + 1) * 60_000 - nowMs) / 1000));
      throw new CpError('RATE_LIMITED', `too many key lookups: at most ${this.perMinute} a minute; retry in ${retrySec}s`);
    }
    this.counts.set(callerId, n + 1);
  }
}
