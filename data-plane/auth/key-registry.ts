// What keys have open on this node, by key hash and by organisation: the one registry behind the open
// HTTP requests and streams (open-streams.ts) and the open realtime sockets (realtime/open-sockets.ts),
// so revoking a key or blocking its organisation can find everything of it. Pure bookkeeping, no I/O.

/** Something open of one key. */
export interface KeyEntry {
  readonly keyHash: string;
  readonly orgId: string;
}

/** Counts what is open, for a metric (metrics.ts openStreamGauge). */
export interface OpenGauge {
  opened(): void;
  closed(): void;
}

export class KeyRegistry<E extends KeyEntry> {
  private readonly byKey = new Map<string, Set<E>>();
  private readonly byOrg = new Map<string, Set<E>>();
  private n = 0;

  constructor(private readonly gauge?: OpenGauge) {}

  /** Adds an entry (again: nothing). */
  add(e: E): void {
    if (!addTo(this.byKey, e.keyHash, e)) return;
    addTo(this.byOrg, e.orgId, e);
    this.n++;
    this.gauge?.opened();
  }

  /** Removes an entry; false when it was not there (removing is idempotent). */
  remove(e: E): boolean {
    if (!deleteFrom(this.byKey, e.keyHash, e)) return false;
    deleteFrom(this.byOrg, e.orgId, e);
    this.n--;
    this.gauge?.closed();
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

  /** A copy of one key's entries (safe to close while walking it). */
  ofKey(keyHash: string): E[] {
    const set = this.byKey.get(keyHash);
    return set ? [...set] : [];
  }

  /** A copy of one organisation's entries. */
  ofOrg(orgId: string): E[] {
    const set = this.byOrg.get(orgId);
    return set ? [...set] : [];
  }

  /** A copy of every entry. */
  list(): E[] {
    const all: E[] = [];
    for (const set of this.byKey.values()) for (const e of set) all.push(e);
    return all;
  }

  /** A copy of the keys with something open, each with its entries. */
  byKeyHash(): Array<[string, E[]]> {
    return [...this.byKey].map(([k, set]) => [k, [...set]]);
  }
}

function addTo<E>(m: Map<string, Set<E>>, k: string, e: E): boolean {
  let s = m.get(k);
  if (!s) m.set(k, (s = new Set()));
  if (s.has(e)) return false;
  s.add(e);
  return true;
}

function deleteFrom<E>(m: Map<string, Set<E>>, k: string, e: E): boolean {
  const s = m.get(k);
  if (!s || !s.delete(e)) return false;
  if (s.size === 0) m.delete(k);
  return true;
}
