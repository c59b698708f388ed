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
// it holds (docs/design.md#money-and-limits-across-nodes).
//
// A connection that closes without giving back (its node was killed, or cut off) leaves what it said
// it used (KeyMinuteUsed, sent at most every 100 ms) as a ghost in each pool and frees the rest, so
// the other nodes can serve the rest of the minute. The ghost is replaced when the same node instance
// reconnects and says what it holds. What the node admitted after it last said is the only error.
import type { KeyLeaseReturn, KeyLeaseWant, KeyMinuteUsed, KeyShare, SlotHeld, SlotWant } from '../../proto/gen/tollgate/v1/sync.js';
import { standingShare } from '../../proto/lib/leases.js';

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
  /**
   * Registered from a bulk standing share, the node not having asked for this pool yet: it was
   * granted nothing else here, so what it says it holds is exact (a reclaim's answer sets it).
   */
  implicit?: boolean;
}

/** A connection's standing shares of a minute (BulkShare). */
interface BulkHolder {
  nodes: number;
  instance: string;
  closed: boolean;
  /** What it said it used of keys whose pools did not exist yet (KeyMinuteUsed). */
  declared: Map<string, { requests: number; tokens: number }>;
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
  /** minute → connection → its standing shares of every key of that minute. */
  private bulk = new Map<number, Map<string, BulkHolder>>();

  /** `limitsOf`: a key's limits (from the snapshot), to size standing shares in pools made later. */
  constructor(private readonly limitsOf: (keyId: string) => KeyLimitsForLease | undefined = () => undefined) {}

  /**
   * Grants connection `connId` its standing share of every key's budget of `minute` (docs/leases.md),
   * `nodes` being the number of nodes connected now. In pools of the minute that exist already it is
   * counted at once: where the connection is registered already, or the pool has not that much free,
   * the answer lists what it holds instead (`exceptions`). Null: it holds the minute's shares already.
   */
  grantBulk(connId: string, minute: number, nodes: number): KeyShare[] | null {
    let holders = this.bulk.get(minute);
    if (!holders) {
      holders = new Map();
      this.bulk.set(minute, holders);
    }
    if (holders.has(connId)) return null;
    holders.set(connId, { nodes, instance: instanceOf(connId), closed: false, declared: new Map() });
    const exceptions: KeyShare[] = [];
    for (const [id, pool] of this.pools) {
      if (pool.minute !== minute) continue;
      const keyId = id.slice(0, id.lastIndexOf(':'));
      if (pool.held.has(connId)) {
        exceptions.push({ keyId, requests: 0, tokens: 0 });
        continue;
      }
      const limits = this.limitsOf(keyId);
      const shareReq = limits ? standingShare(limits.rpm, nodes) : 0;
      const shareTok = limits ? standingShare(limits.tpm, nodes) : 0;
      const requests = limits ? clamp(shareReq, limitOf(limits.rpm) - pool.totalRequests) : 0;
      const tokens = limits ? clamp(shareTok, limitOf(limits.tpm) - pool.totalTokens) : 0;
      this.register(pool, connId, requests, tokens, true);
      if (requests !== shareReq || tokens !== shareTok) exceptions.push({ keyId, requests, tokens });
    }
    return exceptions;
  }

  /** Connections holding standing shares of a minute (for tests). */
  bulkHolders(minute: number): string[] {
    return [...(this.bulk.get(minute)?.entries() ?? [])].filter(([, h]) => !h.closed).map(([c]) => c);
  }

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
    mine.implicit = false;
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
  applyReturn(connId: string, r: KeyLeaseReturn): string[] {
    const pool = this.poolFor(r.keyId, r.minute);
    const mine = pool.held.get(connId);
    if (!mine) {
      this.register(pool, connId, r.heldRequests, r.heldTokens);
      return this.overLimit(r.keyId, pool);
    }
    // Held only from the standing share: what the node says it holds is exact (it forfeits an
    // untouched share by answering 0).
    const req = mine.implicit ? mine.requests - Math.max(0, r.heldRequests) : Math.min(Math.max(0, r.requests), mine.requests);
    const tok = mine.implicit ? mine.tokens - Math.max(0, r.heldTokens) : Math.min(Math.max(0, r.tokens), mine.tokens);
    mine.implicit = false;
    mine.requests -= req;
    mine.tokens -= tok;
    pool.totalRequests -= req;
    pool.totalTokens -= tok;
    // What it still holds is what it used or reserved (KeyLeaseReturn): newer than its last KeyMinuteUsed.
    mine.usedRequests = mine.requests;
    mine.usedTokens = mine.tokens;
    return [];
  }

  /**
   * A node registered what it holds (after a control-plane restart, or the lone node) in a pool where
   * standing shares were counted already, past the limit: the holders of untouched shares are to be
   * asked for them back (a reclaim), so the pool is back under before anyone is granted more.
   */
  private overLimit(keyId: string, pool: Pool): string[] {
    const limits = this.limitsOf(keyId);
    if (!limits || (pool.totalRequests <= limitOf(limits.rpm) && pool.totalTokens <= limitOf(limits.tpm))) return [];
    return [...pool.held].filter(([, h]) => h.implicit && (h.requests > 0 || h.tokens > 0)).map(([c]) => c);
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
    if (!pool || !h) {
      this.bulk.get(u.minute)?.get(connId)?.declared.set(u.keyId, { requests: Math.max(0, u.requests), tokens: Math.max(0, u.tokens) });
      return;
    }
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
      // A standing share the node never said it used of is free (it says what it used of every key it
      // touched, every 100 ms: what it admitted after it last said is the only error, as for leases).
      const freeReq = back ? h.requests : h.usedRequests < 0 ? (h.implicit ? h.requests : 0) : Math.max(0, h.requests - h.usedRequests);
      const freeTok = back ? h.tokens : h.usedTokens < 0 ? (h.implicit ? h.tokens : 0) : Math.max(0, h.tokens - h.usedTokens);
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
    // Pools made later count what it said it used of their key as a ghost.
    for (const holders of this.bulk.values()) {
      const b = holders.get(connId);
      if (b) b.closed = true;
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
    for (const m of this.bulk.keys()) if (m < minMinute) this.bulk.delete(m);
  }

  /**
   * A node that stops said what it used of every key minute it touched (its returns): its standing
   * shares of keys it did not touch are free, now and in pools made later.
   */
  leave(connId: string): void {
    for (const holders of this.bulk.values()) holders.delete(connId);
    for (const pool of this.pools.values()) {
      const h = pool.held.get(connId);
      if (!h?.implicit) continue;
      pool.held.delete(connId);
      pool.totalRequests -= h.requests;
      pool.totalTokens -= h.tokens;
    }
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
      // Every connection holding the minute's standing shares holds this key's (docs/leases.md).
      const holders = this.bulk.get(minute);
      const limits = holders && holders.size > 0 ? this.limitsOf(keyId) : undefined;
      if (holders && limits) {
        for (const [c, b] of holders) {
          if (!b.closed) this.register(pool, c, standingShare(limits.rpm, b.nodes), standingShare(limits.tpm, b.nodes), true);
          else {
            const d = b.declared.get(keyId);
            if (!d || pool.gone.has(b.instance) || [...holders.values()].some((x) => !x.closed && x.instance === b.instance)) continue;
            pool.gone.set(b.instance, { requests: d.requests, tokens: d.tokens, usedRequests: d.requests, usedTokens: d.tokens });
            pool.totalRequests += d.requests;
            pool.totalTokens += d.tokens;
          }
        }
      }
      if (minute > this.newestMinute) {
        this.newestMinute = minute;
        this.prune(minute - 2);
      }
    }
    return pool;
  }

  private register(pool: Pool, connId: string, requests: number, tokens: number, implicit = false): void {
    // The same node instance back on a new connection says all it holds: its ghost is replaced.
    const instance = instanceOf(connId);
    const ghost = pool.gone.get(instance);
    if (ghost) {
      pool.gone.delete(instance);
      pool.totalRequests -= ghost.requests;
      pool.totalTokens -= ghost.tokens;
    }
    const h: Held = { requests: Math.max(0, requests), tokens: Math.max(0, tokens), usedRequests: -1, usedTokens: -1, implicit };
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
  grant(connId: string, orgId: string, spendableMicros: number, connectedNodes: number, wantMicros = 0, afterReclaim = false, debtMicros = 0): MoneyGrantResult {
    // What this node committed beyond what was reported is its balance plus its debt (its slice below
    // zero, said with the want): counted instead of the positive part of its balance alone, so money
    // spent past its slice and not reported yet is not leased again.
    const own = this.balanceOf(connId, orgId);
    const unseen = debtMicros > 0 ? Math.max(0, own + debtMicros) - Math.max(0, own) : 0;
    const leasable = spendableMicros - this.outstandingFor(orgId) - unseen;
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

  /** A pool no longer leased (a project's or key's period that ended: money-pools.ts) is forgotten. */
  dropPool(poolId: string): void {
    this.balances.delete(poolId);
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

const limitOfN = limitOf;

function finite(n: number): number {
  return Number.isFinite(n) ? Math.max(0, n) : 0;
}

function clamp(want: number, available: number): number {
  return Math.max(0, Math.min(Math.max(0, want), available));
}
