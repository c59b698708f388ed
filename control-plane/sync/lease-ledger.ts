// Leases: the control plane's account of what each node connection may admit. Pure: no I/O, no
// timers; sync-service.ts sends the reclaims it asks for and calls it again when they are answered.
//
// Keys: per (key, minute) a pool of the key's rpm and tpm. Each connection holds what it was granted
// (plus, on its first request for a pool, what it says it already holds: the whole budget of a
// former lone node, or grants from before a control-plane restart). A grant never lets the sum held
// pass the limit. When a node needs more than the pool has free (a request waits on it), the ledger
// names the connections holding some of it; the service reclaims their unused allowance and asks
// again with `afterReclaim`; only then is a shortfall final (the key's minute is really spent).
//
// Money: per organisation, each connection holds a signed balance: granted, minus returned, minus
// the cost of its reported usage. It goes below zero when a node spent more than it held (requests in
// flight cost more than their estimate); that debt is already in the organisation's spend, so only
// positive balances are outstanding. The node keeps the same arithmetic, so both sides agree on what
// it holds (design.md).
//
// A connection that closes without giving back (its node was killed, or cut off) leaves what it said
// it used (KeyMinuteUsed, sent at most every 100 ms) as a ghost in each pool and frees the rest, so
// the other nodes can serve the rest of the minute. The ghost is replaced when the same node instance
// reconnects and says what it holds. What the node admitted after it last said is the only error.
import type { KeyLeaseReturn, KeyLeaseWant, KeyMinuteUsed, SlotHeld, SlotWant } from '../../proto/gen/tollgate/v1/sync.js';

export interface KeyLimitsForLease {
  rpm: number;
  tpm: number;
}

interface Held {
  requests: number;
  tokens: number;
  /** What the node last said it used of this pool (-1: it never said, so all it holds may be used). */
  usedRequests: number;
  usedTokens: number;
}

interface Pool {
  minute: number;
  totalRequests: number;
  totalTokens: number;
  held: Map<string, Held>;
  /** Closed connections' last known use, by node instance (still counted in the totals). */
  gone: Map<string, Held>;
}

export interface KeyGrant {
  requests: number;
  tokens: number;
  finalRequests: boolean;
  finalTokens: boolean;
  freeRequests: number;
  freeTokens: number;
}

export type KeyGrantResult = { kind: 'grant'; grant: KeyGrant } | { kind: 'reclaim'; from: string[] };

export class KeyLeaseLedger {
  private pools = new Map<string, Pool>();
  private newestMinute = 0;

  /**
   * Grants what it can of `want` to connection `connId`, never past the key's limits. `suspects` are
   * other connections that may hold allowance of this pool without having said so (a former lone
   * node that has not yet answered its reclaim): nothing is granted before they answer. When what is
   * needed does not fit and other connections hold some of the pool, answers `reclaim` (unless
   * `afterReclaim`): the caller reclaims from them and asks again.
   */
  grant(connId: string, want: KeyLeaseWant, limits: KeyLimitsForLease, suspects: readonly string[] = [], afterReclaim = false): KeyGrantResult {
    const pool = this.poolFor(want.keyId, want.minute);
    const rpm = limitOf(limits.rpm);
    const tpm = limitOf(limits.tpm);
    if (!pool.held.has(connId)) this.register(pool, connId, want.heldRequests, want.heldTokens);
    if (!afterReclaim) {
      const unknown = suspects.filter((c) => c !== connId && !pool.held.has(c));
      if (unknown.length > 0) return { kind: 'reclaim', from: unknown };
    }
    const mine = pool.held.get(connId)!;
    const freeReq = rpm - pool.totalRequests;
    const freeTok = tpm - pool.totalTokens;
    const shortReq = want.needRequests > 0 && want.needRequests > freeReq;
    const shortTok = want.needTokens > 0 && want.needTokens > freeTok;
    if ((shortReq || shortTok) && !afterReclaim) {
      const from: string[] = [];
      for (const [c, h] of pool.held) {
        if (c === connId) continue;
        if ((shortReq && h.requests > 0) || (shortTok && h.tokens > 0)) from.push(c);
      }
      if (from.length > 0) return { kind: 'reclaim', from };
    }
    // A dimension whose need does not fit gets nothing (a part would only strand budget here).
    const requests = shortReq ? 0 : clamp(Math.max(want.requests, want.needRequests), freeReq);
    const tokens = shortTok ? 0 : clamp(Math.max(want.tokens, want.needTokens), freeTok);
    pool.totalRequests += requests;
    pool.totalTokens += tokens;
    mine.requests += requests;
    mine.tokens += tokens;
    return {
      kind: 'grant',
      grant: {
        requests,
        tokens,
        finalRequests: shortReq,
        finalTokens: shortTok,
        freeRequests: finite(rpm - pool.totalRequests),
        freeTokens: finite(tpm - pool.totalTokens),
      },
    };
  }

  /**
   * A node gave back unused allowance (answering a reclaim, or when it left gracefully). A connection
   * not yet registered in the pool (a former lone node) is registered with what it still holds.
   */
  applyReturn(connId: string, r: KeyLeaseReturn): void {
    const pool = this.poolFor(r.keyId, r.minute);
    const mine = pool.held.get(connId);
    if (!mine) {
      this.register(pool, connId, r.heldRequests, r.heldTokens);
      return;
    }
    const req = Math.min(Math.max(0, r.requests), mine.requests);
    const tok = Math.min(Math.max(0, r.tokens), mine.tokens);
    mine.requests -= req;
    mine.tokens -= tok;
    pool.totalRequests -= req;
    pool.totalTokens -= tok;
    // What it still holds is what it used or reserved (KeyLeaseReturn): newer than its last KeyMinuteUsed.
    mine.usedRequests = mine.requests;
    mine.usedTokens = mine.tokens;
  }

  /**
   * A node admitted in advance of a late answer (docs/leases.md): what it took counts as held by it.
   * The pool may pass the limit by that much; nothing more is granted until it is back under.
   */
  applyTaken(connId: string, t: KeyMinuteUsed): void {
    const pool = this.poolFor(t.keyId, t.minute);
    if (!pool.held.has(connId)) this.register(pool, connId, 0, 0);
    const h = pool.held.get(connId)!;
    const req = Math.max(0, t.requests);
    const tok = Math.max(0, t.tokens);
    h.requests += req;
    h.tokens += tok;
    pool.totalRequests += req;
    pool.totalTokens += tok;
  }

  /** A node says what it used of pools it holds (ignored for pools it is not registered in). */
  recordUsed(connId: string, u: KeyMinuteUsed): void {
    const pool = this.pools.get(`${u.keyId}:${u.minute}`);
    const h = pool?.held.get(connId);
    if (!pool || !h) return;
    h.usedRequests = Math.max(0, u.requests);
    h.usedTokens = Math.max(0, u.tokens);

  }

  /**
   * A connection closed without giving back: in each pool it held, what it said it used stays
   * counted (as a ghost of its instance) and the rest is freed. Answers the pools that grew.
   */
  release(connId: string): Array<{ keyId: string; minute: number }> {
    const grown: Array<{ keyId: string; minute: number }> = [];
    const instance = instanceOf(connId);
    for (const [id, pool] of this.pools) {
      const h = pool.held.get(connId);
      if (!h) continue;
      pool.held.delete(connId);
      // The same instance already back on a newer connection (it reconnected before this close was
      // seen) said there all it holds, what it used here included: nothing stays as a ghost.
      let back = false;
      for (const c of pool.held.keys()) if (instanceOf(c) === instance) back = true;
      const freeReq = back ? h.requests : h.usedRequests < 0 ? 0 : Math.max(0, h.requests - h.usedRequests);
      const freeTok = back ? h.tokens : h.usedTokens < 0 ? 0 : Math.max(0, h.tokens - h.usedTokens);
      h.requests -= freeReq;
      h.tokens -= freeTok;
      pool.totalRequests -= freeReq;
      pool.totalTokens -= freeTok;
      const ghost = pool.gone.get(instance);
      if (ghost) {
        ghost.requests += h.requests;
        ghost.tokens += h.tokens;
      } else if (!back) pool.gone.set(instance, h);
      if (freeReq > 0 || freeTok > 0) grown.push({ keyId: id.slice(0, id.lastIndexOf(':')), minute: pool.minute });
    }
    return grown;
  }

  /** What a connection holds of a pool (for tests). */
  heldBy(connId: string, keyId: string, minute: number): Held | undefined {
    return this.pools.get(`${keyId}:${minute}`)?.held.get(connId);
  }

  /** Connections registered in a pool (holding some or not), other than `except`. */
  members(keyId: string, minute: number, except: string): string[] {
    const pool = this.pools.get(`${keyId}:${minute}`);
    return pool ? [...pool.held.keys()].filter((c) => c !== except) : [];
  }

  /** What a pool has left unleased. */
  freeOf(keyId: string, minute: number, limits: KeyLimitsForLease): { requests: number; tokens: number } {
    const pool = this.pools.get(`${keyId}:${minute}`);
    const used = pool ? { r: pool.totalRequests, t: pool.totalTokens } : { r: 0, t: 0 };
    return { requests: finite(limitOf(limits.rpm) - used.r), tokens: finite(limitOf(limits.tpm) - used.t) };
  }

  /** Drops pools of minutes before `minMinute`. */
  prune(minMinute: number): void {
    for (const [id, pool] of this.pools) if (pool.minute < minMinute) this.pools.delete(id);
  }

  get size(): number {
    return this.pools.size;
  }

  private poolFor(keyId: string, minute: number): Pool {
    const id = `${keyId}:${minute}`;
    let pool = this.pools.get(id);
    if (!pool) {
      pool = { minute, totalRequests: 0, totalTokens: 0, held: new Map(), gone: new Map() };
      this.pools.set(id, pool);
      if (minute > this.newestMinute) {
        this.newestMinute = minute;
        this.prune(minute - 2);
      }
    }
    return pool;
  }

  private register(pool: Pool, connId: string, requests: number, tokens: number): void {
    // The same node instance back on a new connection says all it holds: its ghost is replaced.
    const instance = instanceOf(connId);
    const ghost = pool.gone.get(instance);
    if (ghost) {
      pool.gone.delete(instance);
      pool.totalRequests -= ghost.requests;
      pool.totalTokens -= ghost.tokens;
    }
    const h = { requests: Math.max(0, requests), tokens: Math.max(0, tokens), usedRequests: -1, usedTokens: -1 };
    pool.held.set(connId, h);
    pool.totalRequests += h.requests;
    pool.totalTokens += h.tokens;
  }
}

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
export class SlotLedger {
  private pools = new Map<string, { total: number; held: Map<string, number> }>();

  grant(connId: string, w: SlotWant, limit: number, suspects: readonly string[] = [], afterReclaim = false): SlotGrantResult {
    const max = limitOf(limit);
    let pool = this.pools.get(w.keyId);
    if (!pool) {
      pool = { total: 0, held: new Map() };
      this.pools.set(w.keyId, pool);
    }
    if (!pool.held.has(connId)) this.setHeld(w.keyId, pool, connId, w.held);
    if (!afterReclaim) {
      const unknown = suspects.filter((c) => c !== connId && !pool.held.has(c));
      if (unknown.length > 0) return { kind: 'reclaim', from: unknown };
    }
    const mine = pool.held.get(connId) ?? 0;
    const free = max - pool.total;
    // Wants are totals: what the connection already holds (granted while this want was on its way) counts.
    const short = w.need > mine && w.need - mine > free;
    if (short && !afterReclaim) {
      const from = [...pool.held].filter(([c, h]) => c !== connId && h > 0).map(([c]) => c);
      if (from.length > 0) return { kind: 'reclaim', from };
    }
    // Short: the free slots still seat some of the waiting requests (each needs one, unlike a budget).
    const slots = clamp(Math.max(w.want, w.need) - mine, free);
    this.setHeld(w.keyId, pool, connId, (pool.held.get(connId) ?? 0) + slots);
    return { kind: 'grant', slots, final: short };
  }

  /** The node gave back `returned` slots and holds `held` (its requests in flight). */
  applyHeld(connId: string, r: SlotHeld): void {
    let pool = this.pools.get(r.keyId);
    if (!pool) {
      if (r.held <= 0) return;
      pool = { total: 0, held: new Map() };
    }
    const counted = pool.held.get(connId);
    // A negative `returned`: slots the node took in advance of a late answer (docs/leases.md).
    const held = counted === undefined ? r.held : Math.max(counted - r.returned, r.held);
    this.setHeld(r.keyId, pool, connId, held);
  }

  heldBy(connId: string, keyId: string): number {
    return this.pools.get(keyId)?.held.get(connId) ?? 0;
  }

  dropConnection(connId: string): void {
    for (const [keyId, pool] of this.pools) if (pool.held.has(connId)) this.setHeld(keyId, pool, connId, 0);
  }

  get size(): number {
    return this.pools.size;
  }

  /** A connection holding 0 is forgotten (its next want says what it holds); so is an empty pool. */
  private setHeld(keyId: string, pool: { total: number; held: Map<string, number> }, connId: string, held: number): void {
    const before = pool.held.get(connId) ?? 0;
    const after = Number.isFinite(held) ? Math.max(0, held) : 0;
    pool.total += after - before;
    if (after > 0) pool.held.set(connId, after);
    else pool.held.delete(connId);
    if (pool.held.size === 0) this.pools.delete(keyId);
    else this.pools.set(keyId, pool);
  }
}

export type MoneyGrantResult = { kind: 'grant'; micros: number } | { kind: 'reclaim'; from: string[] };

export class MoneyLeaseLedger {
  /** org → connection → signed balance (granted − returned − reported cost). */
  private balances = new Map<string, Map<string, number>>();

  /** The sum of the positive balances: money nodes may still spend without asking. */
  outstandingFor(orgId: string, except?: string): number {
    let sum = 0;
    for (const [c, v] of this.balances.get(orgId) ?? []) if (c !== except && v > 0) sum += v;
    return sum;
  }

  balanceOf(connId: string, orgId: string): number {
    return this.balances.get(orgId)?.get(connId) ?? 0;
  }

  /**
   * Grants a slice of what the organisation may still spend (`spendableMicros`, from balance and cap)
   * minus every other connection's outstanding balance and this one's own. When nothing is leasable
   * but other connections hold some, answers `reclaim` (unless `afterReclaim`).
   */
  grant(connId: string, orgId: string, spendableMicros: number, connectedNodes: number, wantMicros = 0, afterReclaim = false): MoneyGrantResult {
    const leasable = spendableMicros - this.outstandingFor(orgId);
    if (leasable <= 0) {
      if (!afterReclaim && spendableMicros > 0) {
        const from = [...(this.balances.get(orgId) ?? [])].filter(([c, v]) => c !== connId && v > 0).map(([c]) => c);
        if (from.length > 0) return { kind: 'reclaim', from };
      }
      return { kind: 'grant', micros: 0 };
    }
    // What the node asked for (what it is short plus a few of its costliest requests), at least a
    // share that leaves room for the other nodes, and small remainders whole; never more than is
    // leasable. A lone node gets everything (a node that joins later reclaims its share).
    const share = connectedNodes <= 1 ? leasable : Math.floor(leasable / (2 * connectedNodes));
    const slice = Math.min(leasable, Math.max(wantMicros, share, Math.min(leasable, 10_000)));
    this.add(connId, orgId, slice);
    return { kind: 'grant', micros: slice };
  }

  /** Reported usage of a connection consumes its balance (it may go below zero: see above). */
  consume(connId: string, orgId: string, costMicros: number): void {
    if (costMicros !== 0) this.add(connId, orgId, -costMicros);
  }

  /** A node gave back unused money. */
  giveBack(connId: string, orgId: string, micros: number): void {
    if (micros > 0) this.add(connId, orgId, -micros);
  }

  /** A closed connection's balances are released (its usage still counts when its reports arrive). */
  dropConnection(connId: string): void {
    for (const [orgId, byConn] of this.balances) {
      byConn.delete(connId);
      if (byConn.size === 0) this.balances.delete(orgId);
    }
  }

  private add(connId: string, orgId: string, delta: number): void {
    let byConn = this.balances.get(orgId);
    if (!byConn) {
      byConn = new Map();
      this.balances.set(orgId, byConn);
    }
    byConn.set(connId, (byConn.get(connId) ?? 0) + delta);
  }
}

/** Connection ids are `instanceId#n` (sync-service.ts). */
function instanceOf(connId: string): string {
  const i = connId.lastIndexOf('#');
  return i < 0 ? connId : connId.slice(0, i);
}

function limitOf(n: number): number {
  return Number.isFinite(n) && n > 0 ? n : Infinity;
}

function finite(n: number): number {
  return Number.isFinite(n) ? Math.max(0, n) : 0;
}

function clamp(want: number, available: number): number {
  return Math.max(0, Math.min(Math.max(0, want), available));
}
