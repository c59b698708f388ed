// Leases: the control plane's account of what each node connection may admit.
//
// Keys: per (key, minute) a pool of the key's rpm and tpm. Each connection's first request for a pool
// registers what it already holds (its cold share plus anything leased before a control-plane
// restart), and the cold share of every connected node that has not registered yet is reserved, so
// grants never let the sum over nodes pass the limit. Pools are in memory: a minute is short, and after
// a restart the nodes' registrations rebuild them.
//
// Money: per organisation, each connection holds a slice. The leasable amount is what the
// organisation may still spend (balance and cap, computed by the caller from the ledger) minus every
// slice still outstanding. Usage reported on a connection consumes its slice; a closed connection's
// slices are released (its usage still counts when its reports arrive).
import { coldShare } from '../../proto/lib/leases.js';
import type { KeyLeaseWant } from '../../proto/gen/tollgate/v1/sync.js';

export interface KeyLimitsForLease {
  rpm: number;
  tpm: number;
}

interface Pool {
  minute: number;
  totalRequests: number;
  totalTokens: number;
  registered: Map<string, { requests: number; tokens: number }>;
}

export class KeyLeaseLedger {
  private pools = new Map<string, Pool>();
  private newestMinute = 0;

  /** Grants what it can of `want` to connection `connId`; never more than the pool has left. */
  grant(connId: string, want: KeyLeaseWant, limits: KeyLimitsForLease, connectedNodes: number): { requests: number; tokens: number } {
    const id = `${want.keyId}:${want.minute}`;
    let pool = this.pools.get(id);
    if (!pool) {
      pool = { minute: want.minute, totalRequests: 0, totalTokens: 0, registered: new Map() };
      this.pools.set(id, pool);
      if (want.minute > this.newestMinute) {
        this.newestMinute = want.minute;
        this.prune(want.minute - 2);
      }
    }
    let mine = pool.registered.get(connId);
    if (!mine) {
      mine = { requests: Math.max(0, want.heldRequests), tokens: Math.max(0, want.heldTokens) };
      pool.registered.set(connId, mine);
      pool.totalRequests += mine.requests;
      pool.totalTokens += mine.tokens;
    }
    const unregistered = Math.max(0, connectedNodes - pool.registered.size);
    const reserveRequests = unregistered * coldShare(limits.rpm, connectedNodes);
    const reserveTokens = unregistered * coldShare(limits.tpm, connectedNodes);
    const requests = clamp(want.requests, limits.rpm - pool.totalRequests - reserveRequests);
    const tokens = clamp(want.tokens, limits.tpm - pool.totalTokens - reserveTokens);
    pool.totalRequests += requests;
    pool.totalTokens += tokens;
    mine.requests += requests;
    mine.tokens += tokens;
    return { requests, tokens };
  }

  /** Drops pools of minutes before `minMinute`. */
  prune(minMinute: number): void {
    for (const [id, pool] of this.pools) if (pool.minute < minMinute) this.pools.delete(id);
  }

  get size(): number {
    return this.pools.size;
  }
}

export class MoneyLeaseLedger {
  /** org → connection → micros granted and not yet consumed by reported usage. */
  private outstanding = new Map<string, Map<string, number>>();

  outstandingFor(orgId: string): number {
    let sum = 0;
    for (const v of this.outstanding.get(orgId)?.values() ?? []) sum += v;
    return sum;
  }

  /**
   * Grants a slice of what the organisation may still spend (`spendableMicros`, from balance and cap)
   * minus every outstanding slice. Returns 0 when nothing is left.
   */
  grant(connId: string, orgId: string, spendableMicros: number, connectedNodes: number, wantMicros = 0): number {
    const leasable = spendableMicros - this.outstandingFor(orgId);
    if (leasable <= 0) return 0;
    // What the node asked for (what it is short plus a few of its costliest requests), at least a
    // share that leaves room for the other nodes, and small remainders whole; never more than is leasable.
    // A lone node gets everything, as with a key's cold share (proto/lib/leases.ts).
    const share = connectedNodes <= 1 ? leasable : Math.floor(leasable / (2 * connectedNodes));
    const slice = Math.min(leasable, Math.max(wantMicros, share, Math.min(leasable, 10_000)));
    let byConn = this.outstanding.get(orgId);
    if (!byConn) {
      byConn = new Map();
      this.outstanding.set(orgId, byConn);
    }
    byConn.set(connId, (byConn.get(connId) ?? 0) + slice);
    return slice;
  }

  /** Reported usage of a connection consumes its slice (never below zero). */
  consume(connId: string, orgId: string, costMicros: number): void {
    const byConn = this.outstanding.get(orgId);
    const held = byConn?.get(connId);
    if (byConn === undefined || held === undefined) return;
    const left = held - costMicros;
    if (left > 0) byConn.set(connId, left);
    else {
      byConn.delete(connId);
      if (byConn.size === 0) this.outstanding.delete(orgId);
    }
  }

  /** A closed connection's slices are released. */
  dropConnection(connId: string): void {
    for (const [orgId, byConn] of this.outstanding) {
      byConn.delete(connId);
      if (byConn.size === 0) this.outstanding.delete(orgId);
    }
  }
}

function clamp(want: number, available: number): number {
  return Math.max(0, Math.min(Math.max(0, want), available));
}
