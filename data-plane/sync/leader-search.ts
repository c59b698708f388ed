// Where a node's next sync stream goes after one ended, and after how long: the first address given,
// then the leader a standby names, else the next address, each attempt after a capped exponential
// back-off with jitter (docs/design.md#several-control-planes-on-one-database). Pure: the clock and
// the randomness are given.
import { status as GrpcStatus } from '@grpc/grpc-js';
import { isStandbyRefusal, leaderFromDetails } from '../../proto/lib/leader-hint.js';

/** How a stream ended: its gRPC status code and details. */
export interface StreamEnd {
  code: number;
  details?: string;
}

export interface NextAttempt {
  address: string;
  delayMs: number;
  /** Set when a standby named the leader and the next attempt goes there. */
  leaderNamed: string | null;
}

export interface LeaderSearchOptions {
  minBackoffMs: number;
  maxBackoffMs: number;
  now(): number;
  /** In [0, 1): the jitter. */
  random(): number;
}

export class LeaderSearch {
  private current: string;
  private attempt = 0;

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

  /** A stream was accepted: the back-off starts again from the bottom. */
  connected(): void {
    this.attempt = 0;
  }

  /** The stream to `address` ended so: where the next goes, and after how long. */
  ended(end: StreamEnd): NextAttempt {
    let leaderNamed: string | null = null;
    if (end.code !== GrpcStatus.ALREADY_EXISTS) {
      const leader = end.code === GrpcStatus.UNAVAILABLE && isStandbyRefusal(end.details) ? leaderFromDetails(end.details) : null;
      if (leader !== null && leader !== this.current) {
        leaderNamed = leader;
        this.current = leader;
      } else if (this.addresses.length > 1) {
        this.current = this.addresses[(this.addresses.indexOf(this.current) + 1) % this.addresses.length];
      }
    }
    const base = Math.min(this.opts.maxBackoffMs, this.opts.minBackoffMs * 2 ** this.attempt);
    this.attempt = Math.min(this.attempt + 1, 20);
    return { address: this.current, delayMs: Math.round(base / 2 + this.opts.random() * (base / 2)), leaderNamed };
  }
}
