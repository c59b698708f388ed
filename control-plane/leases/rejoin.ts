// The nodes a control plane waits for after it starts (docs/leases.md, "A control plane that
// restarts"). Its lease ledgers start empty, but the nodes that were connected to its predecessor
// still have requests in flight in slots and key minutes it knows nothing of. Until each of them is
// back (saying what it holds in its Hello) or the grace passed, the lease service answers no want and
// grants no standing share, and the roster counts the missing ones, so that no node back early is
// leased what a node not yet back is using, nor takes itself for a lone node.

export class Rejoin {
  private readonly absent: Set<string>;
  private timer: NodeJS.Timeout | undefined;
  private ended = false;
  private finish!: () => void;
  /** Resolves once every node is back or the grace passed. */
  readonly done: Promise<void>;

  constructor(
    expected: readonly string[],
    private readonly graceMs: number,
    /** Called once at the end with the nodes that did not come back (none when all did). */
    private readonly onEnd: (missing: string[]) => void,
  ) {
    this.absent = new Set(expected);
    this.done = new Promise((resolve) => (this.finish = resolve));
    if (this.absent.size === 0) this.end();
  }

  /** The grace starts when the nodes can connect (the server listens). */
  startGrace(): void {
    if (this.ended || this.timer) return;
    this.timer = setTimeout(() => this.end(), this.graceMs);
    this.timer.unref();
  }

  /** Still waiting for some node. */
  get pending(): boolean {
    return this.absent.size > 0;
  }

  /** Nodes waited for and not back yet (counted in the roster). */
  get missing(): number {
    return this.absent.size;
  }

  /** A node connected (what it holds is registered already). */
  arrived(nodeId: string): void {
    if (this.absent.delete(nodeId) && this.absent.size === 0) this.end();
  }

  /** Stops waiting (at shutdown, or when the grace passed). */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const missing = [...this.absent];
    this.absent.clear();
    this.finish();
    this.onEnd(missing);
  }
}
