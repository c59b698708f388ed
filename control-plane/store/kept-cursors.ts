// Node instances' cursors (the last report seq a store wrote for each), kept in memory once read: the
// control plane is its databases' only writer, so what it committed is what the tables hold, and
// telling a replay costs no statement (docs/design.md#a-report-is-one-statement). The state
// database's report cursors and the log store's each keep one. A node has one instance per process;
// the most recently kept are kept (every write keeps its cursor), and one not kept is read again.

/** How many node instances' cursors a store keeps. */
export const MAX_KEPT_CURSORS = 4096;

export class KeptCursors {
  /** By "node id\ninstance id" (neither holds a newline: proto/lib/node-ids.ts). */
  private readonly kept = new Map<string, number>();

  constructor(private readonly max = MAX_KEPT_CURSORS) {}

  static id(nodeId: string, instanceId: string): string {
    return `${nodeId}\n${instanceId}`;
  }

  /**
   * The instance's cursor: kept, or `read` (committed state, so kept at once). Null when it has none:
   * it has written nothing, so every report of it is new whatever its seq.
   */
  async get(id: string, read: () => Promise<number | null>): Promise<number | null> {
    const kept = this.kept.get(id);
    if (kept !== undefined) return kept;
    const cursor = await read();
    if (cursor !== null) this.keep(id, cursor);
    return cursor;
  }

  /** Keeps the cursor as committed (call after COMMIT), as the most recent. */
  keep(id: string, lastSeq: number): void {
    this.kept.delete(id);
    this.kept.set(id, lastSeq);
    if (this.kept.size > this.max) this.kept.delete(this.kept.keys().next().value!);
  }
}
