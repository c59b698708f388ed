// The slot ledger (lease-ledger.ts): parallel-request slots of each key, held by node connections.
// Pure: no I/O, no timers; the lease service (lease-service.ts) sends the reclaims it asks for.
import type { KeyShare, SlotHeld, SlotWant } from '../../proto/gen/tollgate/v1/sync.js';
import { standingShare } from '../../proto/lib/leases.js';
import { clamp, limitOfN } from './lease-math.js';

export type SlotGrantResult = { kind: 'grant'; slots: number; final: boolean } | { kind: 'reclaim'; from: string[] };

/**
 * Parallel-request slots: per key a pool of its max_parallel_requests, held by node connections (a
 * slot is held while the node keeps it, not per minute). A node admits a request only into a slot it
 * holds; when it has none free it asks, and the ledger takes idle slots back from the other nodes
 * before it says every slot is in use; when fewer are free than it needs, it gets those (and `final`:
 * the requests it cannot seat are refused). A node not yet counted in a pool is registered with what
 * it says it holds (a want's `held`, a return's `held`); once counted, a return takes off what it gave
 * back (a grant on its way to it stays counted), never below what it says it holds. A connection
 * holding nothing is forgotten, and so is a pool nobody holds. A closed connection's slots are freed:
 * its requests died with it (a node cut off but alive counts locally, fail-static).
 */
interface SlotPool {
  limit: number;
  total: number;
  held: Map<string, number>;
  /** Share holders that gave their standing share of this key back (a reclaim's answer of 0). */
  forfeit: Set<string>;
}

export class SlotLedger {
  private pools = new Map<string, SlotPool>();
  /**
   * Connections holding a standing share of every key's slots (SlotShare), with the node count it
   * was sized by. A share holder not in a pool's `held` nor its `forfeit` holds its share there.
   */
  private shareHolders = new Map<string, number>();

  constructor(private readonly limitOf: (keyId: string) => number | undefined = () => undefined) {}

  /**
   * Grants a connection its standing share of every key's slots for as long as it lasts. In pools
   * that exist already, where it is registered or the pool has not that much free, the answer lists
   * what it holds instead. Null: it holds them already.
   */
  grantShare(connId: string, nodes: number): KeyShare[] | null {
    if (this.shareHolders.has(connId)) return null;
    const exceptions: KeyShare[] = [];
    for (const [keyId, pool] of this.pools) {
      if (pool.held.has(connId)) {
        exceptions.push({ keyId, requests: 0, tokens: 0 });
        continue;
      }
      const share = standingShare(pool.limit, nodes);
      const free = limitOfN(pool.limit) - pool.total - this.implicitTotal(keyId, pool);
      if (free < share) {
        const slots = Math.max(0, free);
        exceptions.push({ keyId, requests: slots, tokens: 0 });
        if (slots > 0) this.setHeld(keyId, pool, connId, slots);
        else pool.forfeit.add(connId);
      }
    }
    this.shareHolders.set(connId, nodes);
    return exceptions;
  }

  grant(connId: string, w: SlotWant, limit: number, suspects: readonly string[] = [], afterReclaim = false): SlotGrantResult {
    const max = limitOfN(limit);
    const pool = this.poolFor(w.keyId, limit);
    // A share holder asking for the first time holds its share (the node may not have heard of the
    // share yet when it asked, but will add it when it does); anyone else holds what it says.
    if (!pool.held.has(connId)) this.setHeld(w.keyId, pool, connId, this.implicitOf(connId, pool) ?? w.held);
    if (!afterReclaim) {
      const unknown = suspects.filter((c) => c !== connId && !pool.held.has(c));
      if (unknown.length > 0) return { kind: 'reclaim', from: unknown };
    }
    const mine = pool.held.get(connId) ?? 0;
    const free = max - pool.total - this.implicitTotal(w.keyId, pool);
    // Wants are totals: what the connection already holds (granted while this want was on its way) counts.
    const short = w.need > mine && w.need - mine > free;
    if (short && !afterReclaim) {
      const from = [...pool.held].filter(([c, h]) => c !== connId && h > 0).map(([c]) => c);
      for (const c of this.shareHolders.keys()) if (c !== connId && (this.implicitOf(c, pool) ?? 0) > 0) from.push(c);
      if (from.length > 0) return { kind: 'reclaim', from };
    }
    // Short: the free slots still seat some of the waiting requests (each needs one, unlike a budget).
    const slots = clamp(Math.max(w.want, w.need) - mine, free);
    this.setHeld(w.keyId, pool, connId, (pool.held.get(connId) ?? 0) + slots);
    return { kind: 'grant', slots, final: short };
  }

  /** The node gave back `returned` slots and holds `held` (its requests in flight). */
  applyHeld(connId: string, r: SlotHeld): string[] {
    let pool = this.pools.get(r.keyId);
    const limit = pool?.limit ?? this.limitOf(r.keyId);
    if (!pool) {
      if (r.held <= 0 && !this.shareHolders.has(connId)) return [];
      // (A limit not known here is learnt from the next want.)
      pool = this.poolFor(r.keyId, limit ?? Infinity);
    }
    const counted = pool.held.get(connId);
    if (r.held < 0) {
      // The node forgot the key (idle for a minute) and gave back all it held: it holds nothing, or
      // its standing share again when it has one (as its next use of the key starts from it).
      pool.total -= counted ?? 0;
      pool.held.delete(connId);
      pool.forfeit.delete(connId);
      this.dropIfEmpty(r.keyId, pool);
      return [];
    }
    if (counted === undefined && this.implicitOf(connId, pool) !== undefined) {
      // It held only its standing share, so what it says it holds is exact; 0 gives the share back.
      if (r.held > 0) this.setHeld(r.keyId, pool, connId, r.held);
      else pool.forfeit.add(connId);
      this.dropIfEmpty(r.keyId, pool);
      return this.overLimit(connId, r.keyId, pool);
    }
    // A negative `returned`: slots the node took in advance of a late answer (docs/leases.md).
    const held = counted === undefined ? r.held : Math.max(counted - r.returned, r.held);
    this.setHeld(r.keyId, pool, connId, held);
    return counted === undefined ? this.overLimit(connId, r.keyId, pool) : [];
  }

  /**
   * Registered past the limit where standing shares were counted (after a control-plane restart the
   * nodes say what they hold one by one): the holders of untouched shares are asked for them back.
   */
  private overLimit(connId: string, keyId: string, pool: SlotPool): string[] {
    if (!this.pools.has(keyId) || pool.total + this.implicitTotal(keyId, pool) <= limitOfN(pool.limit)) return [];
    return [...this.shareHolders.keys()].filter((c) => c !== connId && (this.implicitOf(c, pool) ?? 0) > 0);
  }

  heldBy(connId: string, keyId: string): number {
    const pool = this.pools.get(keyId);
    if (!pool) return standingShare(this.limitOf(keyId) ?? 0, this.shareHolders.get(connId) ?? 1);
    return pool.held.get(connId) ?? this.implicitOf(connId, pool) ?? 0;
  }

  dropConnection(connId: string): void {
    this.shareHolders.delete(connId);
    for (const [keyId, pool] of this.pools) {
      pool.forfeit.delete(connId);
      if (pool.held.has(connId)) this.setHeld(keyId, pool, connId, 0);
      else this.dropIfEmpty(keyId, pool);
    }
  }

  get size(): number {
    return this.pools.size;
  }

  /** The standing share a holder holds in a pool it is not registered in (undefined: none). */
  private implicitOf(connId: string, pool: SlotPool): number | undefined {
    const nodes = this.shareHolders.get(connId);
    if (nodes === undefined || pool.held.has(connId) || pool.forfeit.has(connId)) return undefined;
    return standingShare(pool.limit, nodes);
  }

  private implicitTotal(keyId: string, pool: SlotPool): number {
    let sum = 0;
    for (const c of this.shareHolders.keys()) sum += this.implicitOf(c, pool) ?? 0;
    return sum;
  }

  private poolFor(keyId: string, limit: number): SlotPool {
    let pool = this.pools.get(keyId);
    if (!pool) {
      pool = { limit, total: 0, held: new Map(), forfeit: new Set() };
      this.pools.set(keyId, pool);
    }
    pool.limit = limit;
    return pool;
  }

  /** A connection holding 0 is forgotten (its next want says what it holds); so is an empty pool. */
  private setHeld(keyId: string, pool: SlotPool, connId: string, held: number): void {
    const before = pool.held.get(connId) ?? 0;
    const after = Number.isFinite(held) ? Math.max(0, held) : 0;
    pool.total += after - before;
    if (after > 0) pool.held.set(connId, after);
    else {
      pool.held.delete(connId);
      // A share holder that holds none stays counted at none until it forgets the key.
      if (this.shareHolders.has(connId)) pool.forfeit.add(connId);
    }
    this.dropIfEmpty(keyId, pool);
  }

  private dropIfEmpty(keyId: string, pool: SlotPool): void {
    if (pool.held.size === 0 && pool.forfeit.size === 0) this.pools.delete(keyId);
    else this.pools.set(keyId, pool);
  }
}
