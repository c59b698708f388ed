// Where a node's next sync stream goes after one ended, and after how long
// (docs/design.md#several-control-planes-on-one-database). Each address has its own back-off: one
// that refuses or does not answer is tried again after a capped exponential back-off (to 5 s), so a
// node never spins; one that answers as a standby is alive and may lead at any moment, so it is asked
// again within STANDBY_MAX_BACKOFF_MS; the leader a standby names is tried at once, unless it is
// down (the hint is stale: the leader that just went) or the attempt before was already such a jump.
// The next attempt goes to the address due first. Pure: the clock and the randomness are given.
import { status as GrpcStatus } from '@grpc/grpc-js';
import { isStandbyRefusal, leaderFromDetails } from '../../proto/lib/leader-hint.js';

/** How often at most a standby is asked again while it stands by (it answers at once, for almost nothing). */
export const STANDBY_MAX_BACKOFF_MS = 500;

/** How a stream ended: its gRPC status code and details. */
export interface StreamEnd {
  code: number;
  details?: string;
}

export interface NextAttempt {
  address: string;
  delayMs: number;
  /** Set when a standby named the leader and the next attempt goes there at once. */
  leaderNamed: string | null;
}

export interface LeaderSearchOptions {
  minBackoffMs: number;
  maxBackoffMs: number;
  now(): number;
  /** In [0, 1): the jitter. */
  random(): number;
}

interface AddressState {
  /** Attempts in a row that no control plane answered (refused, no answer, dropped). */
  failures: number;
  /** Standby answers in a row. */
  answers: number;
  /** Not tried again before. */
  readyAt: number;
}

export class LeaderSearch {
  private current: string;
  private readonly states = new Map<string, AddressState>();
  /** The leader the last standby named, when it is not among the addresses given. */
  private hinted: string | null = null;
  /** The attempt now under way went at once to a leader a standby named. */
  private jumped = false;

  constructor(
    private readonly addresses: readonly string[],
    private readonly opts: LeaderSearchOptions,
  ) {
    this.current = addresses[0];
  }

  /** Where the next stream goes. */
  get address(): string {
    return this.current;
  }

  /** A stream was accepted: every back-off starts again from the bottom. */
  connected(): void {
    this.states.clear();
    this.jumped = false;
  }

  /** The stream to `address` ended so: where the next goes, and after how long. */
  ended(end: StreamEnd): NextAttempt {
    const now = this.opts.now();
    const here = this.stateOf(this.current);
    const jumped = this.jumped;
    this.jumped = false;
    if (end.code === GrpcStatus.UNAVAILABLE && isStandbyRefusal(end.details)) {
      here.failures = 0;
      here.answers++;
      here.readyAt = now + this.jitter(Math.min(STANDBY_MAX_BACKOFF_MS, this.opts.maxBackoffMs, this.opts.minBackoffMs * 2 ** Math.min(here.answers - 1, 20)));
      const leader = leaderFromDetails(end.details);
      if (leader !== null) this.hinted = this.addresses.includes(leader) ? null : leader;
      if (leader !== null && leader !== this.current && !jumped && (this.states.get(leader)?.failures ?? 0) === 0) {
        this.current = leader;
        this.jumped = true;
        return { address: leader, delayMs: 0, leaderNamed: leader };
      }
    } else {
      here.answers = 0;
      here.failures++;
      here.readyAt = now + this.jitter(Math.min(this.opts.maxBackoffMs, this.opts.minBackoffMs * 2 ** Math.min(here.failures - 1, 20)));
    }
    // The node id still held by the stream before (a restart): the same control plane, when it lets go.
    if (end.code !== GrpcStatus.ALREADY_EXISTS) this.current = this.dueFirst();
    return { address: this.current, delayMs: Math.max(0, this.stateOf(this.current).readyAt - now), leaderNamed: null };
  }

  /** The address whose back-off ends first; on a tie, the first after the current one. */
  private dueFirst(): string {
    const candidates = this.hinted !== null ? [...this.addresses, this.hinted] : this.addresses;
    const from = Math.max(0, candidates.indexOf(this.current));
    let best = this.current;
    let bestAt = Infinity;
    for (let i = 1; i <= candidates.length; i++) {
      const a = candidates[(from + i) % candidates.length];
      const at = this.states.get(a)?.readyAt ?? 0;
      if (at < bestAt) {
        best = a;
        bestAt = at;
      }
    }
    return best;
  }

  private stateOf(address: string): AddressState {
    let s = this.states.get(address);
    if (!s) this.states.set(address, (s = { failures: 0, answers: 0, readyAt: 0 }));
    return s;
  }

  private jitter(baseMs: number): number {
    return Math.round(baseMs / 2 + this.opts.random() * (baseMs / 2));
  }
}
