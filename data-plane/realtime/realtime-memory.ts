// The node-wide bound on what realtime sessions hold (docs/hardening.md). Each session is bounded on
// its own (a paused upstream, a closed client); this bounds them together: the bytes uWS holds for
// clients plus the bytes upstream links hold unsent, summed over every open session. Past
// `maxBytes` a new session is refused (503), a session that receives from its upstream pauses it, and
// a client that sends while its upstream has a backlog is closed (1013). Paused sessions resume when
// the node is back under three quarters of it. Pure bookkeeping: the sessions measure themselves.

/** What a session offers the bound. */
export interface MemoryMember {
  /** Measures what the session holds now and reports it (update). */
  remeasure(): void;
  /** The node is back under its bound: resume an upstream paused for it (if nothing else holds it). */
  roomAgain(): void;
}

export class RealtimeMemory {
  /** Bytes held by every open session together (as last measured). */
  held = 0;
  /** The most `held` was since start (or the last reset of the figures). */
  peak = 0;
  private readonly members = new Set<MemoryMember>();
  private readonly waiting = new Set<MemoryMember>();

  constructor(readonly maxBytes: number) {}

  get full(): boolean {
    return this.held >= this.maxBytes;
  }

  join(m: MemoryMember): void {
    this.members.add(m);
  }

  /** A session's figure changed from `before` to `after`; returns the node's total. */
  update(before: number, after: number): number {
    this.held += after - before;
    if (this.held > this.peak) this.peak = this.held;
    return this.held;
  }

  /** `m` paused its upstream because the node is full: told by `roomAgain` when it is not. */
  waitForRoom(m: MemoryMember): void {
    this.waiting.add(m);
  }

  leave(m: MemoryMember, heldBytes: number): void {
    this.members.delete(m);
    this.waiting.delete(m);
    this.held -= heldBytes;
    this.relieve();
  }

  /** After bytes left: wakes the sessions waiting for room once the node is under three quarters. */
  relieve(): void {
    if (this.waiting.size === 0 || this.held >= (this.maxBytes * 3) / 4) return;
    const woken = [...this.waiting];
    this.waiting.clear();
    for (const m of woken) m.roomAgain();
  }

  /** Every session measured again (bytes leave without an event on some paths), then relieve. */
  remeasureAll(): void {
    for (const m of this.members) m.remeasure();
    this.relieve();
  }
}
