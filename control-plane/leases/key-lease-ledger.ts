// The key ledger (lease-ledger.ts). Pure: no I/O, no timers; the lease service (lease-service.ts)
// sends the reclaims it asks for and calls it again when they are answered.
//
// Keys: per (key, minute) a pool of the key's rpm and tpm. Each connection holds what it was granted
// (plus, on its first request for a pool, what it says it already holds: the whole budget of a
// former lone node, or grants from before a control-plane restart). A grant never lets the sum held
// pass the limit. When a node needs more than the pool has free (a request waits on it), the ledger
// names the connections holding some of it; the service reclaims their unused allowance and asks
// again with `afterReclaim`; only then is a shortfall final (the key's minute is really spent).
//
// A connection that closes without giving back (its node was killed, or cut off) leaves what it said
// it used (KeyMinuteUsed, sent at most every 100 ms) as a ghost in each pool and frees the rest, so
// the other nodes can serve the rest of the minute. The ghost is replaced when the same node instance
// reconnects and says what it holds. What the node admitted after it last said is the only error.
import type { KeyLeaseReturn, KeyLeaseWant, KeyMinuteUsed, KeyShare } from '../../proto/gen/tollgate/v1/sync.js';
import { standingShare } from '../../proto/lib/leases.js';
import { clamp, finite, instanceOf, limitOf } from './lease-math.js';

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
  /** What the pool's other holders last said they used (for the node's rate headers, docs/leases.md). */
  othersUsedRequests: number;
  othersUsedTokens: number;
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
    const others = othersUsed(pool, connId);
    return {
      kind: 'grant',
      grant: {
        requests,
        tokens,
        finalRequests: shortReq,
        finalTokens: shortTok,
        freeRequests: finite(rpm - pool.totalRequests),
        freeTokens: finite(tpm - pool.totalTokens),
        othersUsedRequests: others.requests,
        othersUsedTokens: others.tokens,
      },
    };
  }

  /** What the other holders of a pool than `connId` (its node instance) last said they used. */
  othersUsedOf(keyId: string, minute: number, connId: string): { requests: number; tokens: number } {
    const pool = this.pools.get(`${keyId}:${minute}`);
    return pool ? othersUsed(pool, connId) : { requests: 0, tokens: 0 };
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
          if (!b.closed) {
            this.register(pool, c, standingShare(limits.rpm, b.nodes), standingShare(limits.tpm, b.nodes), true);
            // What it said it used of the key before the pool was made is what it used.
            const d = b.declared.get(keyId);
            const h = pool.held.get(c)!;
            if (d) [h.usedRequests, h.usedTokens] = [d.requests, d.tokens];
          } else {
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

/**
 * What the holders of a pool other than `connId`'s node instance last said they used, and what nodes
 * gone left counted: as far as the control plane knows, the rest of the key's use. A holder that
 * never said counts nothing (its untouched standing share is not used).
 */
function othersUsed(pool: Pool, connId: string): { requests: number; tokens: number } {
  const instance = instanceOf(connId);
  let requests = 0;
  let tokens = 0;
  for (const [c, h] of pool.held) {
    if (instanceOf(c) === instance) continue;
    requests += Math.max(0, h.usedRequests);
    tokens += Math.max(0, h.usedTokens);
  }
  for (const [i, g] of pool.gone) {
    if (i === instance) continue;
    requests += g.requests;
    tokens += g.tokens;
  }
  return { requests, tokens };
}
