// Entries of keys, by key hash: the bookkeeping under the node's one registry of what keys have open
// (open-streams.ts, which holds the policy). Pure, no I/O.

/** Something open of one key. */
export interface KeyEntry {
  readonly keyHash: string;
  readonly orgId: string;
}

export class KeyRegistry<E extends KeyEntry> {
  private readonly byKey = new Map<string, Set<E>>();
  private n = 0;

  /** Adds an entry (again: nothing). */
  add(e: E): void {
    let set = this.byKey.get(e.keyHash);
    if (!set) this.byKey.set(e.keyHash, (set = new Set()));
    if (set.has(e)) return;
    set.add(e);
    this.n++;
  }

  /** Removes an entry; false when it was not there (removing is idempotent). */
  remove(e: E): boolean {
    const set = this.byKey.get(e.keyHash);
    if (!set || !set.delete(e)) return false;
    if (set.size === 0) this.byKey.delete(e.keyHash);
    this.n--;
    return true;
  }

  /** How many are open. */
  get size(): number {
    return this.n;
  }

  /** How many one key has open. */
  countOf(keyHash: string): number {
    return this.byKey.get(keyHash)?.size ?? 0;
  }

  /** A copy of every entry. */
  list(): E[] {
    const all: E[] = [];
    for (const set of this.byKey.values()) for (const e of set) all.push(e);
    return all;
  }

  /** A copy of the keys with something open, each with its entries (safe to end entries while walking it). */
  byKeyHash(): Array<[string, E[]]> {
    return [...this.byKey].map(([k, set]) => [k, [...set]]);
  }
}
