// The money ledger (lease-ledger.ts). Pure: no I/O, no timers; the lease service (lease-service.ts)
// sends the reclaims it asks for and calls it again when they are answered.
//
// Money: per pool (an organisation, or a project's or key's period), each connection holds a signed
// balance: granted, minus returned, minus the cost of its reported usage. The node keeps the same
// arithmetic, so both sides agree on what it holds. A node's slice goes below zero when it spent more
// than it held (a request cost more than its estimate); it says so (its debt) with its wants and
// reclaim answers, and what it holds or spent unseen, balance plus debt, is outstanding until
// reported (docs/design.md#money-the-last-dollars).

export type MoneyGrantResult = { kind: 'grant'; micros: number; exhausted: boolean } | { kind: 'reclaim'; from: string[] };

/** How a node asked (OrgLeaseWant): what it is short of, and whether a request waits for it. */
export interface MoneyWant {
  micros: number;
  /** How far below zero its slice is (spent past it, perhaps not reported yet). */
  debtMicros?: number;
  /** Asked ahead of need: only free money, never a reclaim, never "exhausted". */
  ahead?: boolean;
  /** What a waiting request is short of (default 1): less than this free makes a reclaim. */
  needMicros?: number;
  /** What the node's slice held when it asked, if positive: taken back from when the pool is overspent. */
  heldMicros?: number;
}

export class MoneyLeaseLedger {
  /** org → connection → signed balance (granted − returned − reported cost). */
  private balances = new Map<string, Map<string, number>>();
  /**
   * org → connection → how far below zero its slice was when it last said (a want's debt), less
   * what was granted since: spent past its slice and perhaps not reported, so still outstanding.
   */
  private debts = new Map<string, Map<string, number>>();
  /**
   * org → connection → money other nodes gave back to a reclaim made for that connection's want:
   * kept for it until its want is answered, so no other want takes it in between.
   */
  private earmarks = new Map<string, Map<string, number>>();

  /**
   * What nodes may still spend, or spent without the control plane having seen it: each
   * connection's balance plus its debt, when positive.
   */
  outstandingFor(orgId: string, except?: string): number {
    const debts = this.debts.get(orgId);
    let sum = 0;
    for (const [c, v] of this.balances.get(orgId) ?? []) {
      const held = v + (debts?.get(c) ?? 0);
      if (c !== except && held > 0) sum += held;
    }
    return sum;
  }

  balanceOf(connId: string, orgId: string): number {
    return this.balances.get(orgId)?.get(connId) ?? 0;
  }

  /**
   * Grants a slice of what the organisation may still spend (`spendableMicros`, from balance and cap)
   * minus what every connection holds or spent unseen (docs/money-limits.md#exact-across-nodes):
   * - asked ahead of need: only what is free, never a reclaim or "exhausted", so two nodes do not
   *   take a pool's last dollars from each other before either needs them;
   * - asked for a waiting request: when less than it needs is free and other connections hold
   *   money, answers `reclaim` (unless `afterReclaim`); after that, what is left is granted, with
   *   `exhausted` when it is less than the need (the node holds the last of the pool).
   */
  grant(connId: string, orgId: string, spendableMicros: number, connectedNodes: number, want: MoneyWant = { micros: 0 }, afterReclaim = false): MoneyGrantResult {
    this.setDebt(connId, orgId, want.debtMicros ?? 0);
    const leasable = spendableMicros - this.outstandingFor(orgId) - this.earmarkedFor(orgId, connId);
    // What was kept for this connection is in `leasable` now: granted below, or free again.
    this.mapDelete(this.earmarks, orgId, connId);
    const need = Math.max(1, want.needMicros ?? 0);
    if (!want.ahead && leasable < need && !afterReclaim && spendableMicros > 0) {
      const from = [...(this.balances.get(orgId) ?? [])].filter(([c, v]) => c !== connId && v > 0).map(([c]) => c);
      if (from.length > 0) return { kind: 'reclaim', from };
    }
    if (leasable <= 0) {
      if (want.ahead) return { kind: 'grant', micros: 0, exhausted: false };
      // Spent past the limit already (a request cost more than its estimate): part of what this
      // node holds is not the pool's any more. It is taken back, so the node does not spend it too.
      const back = Math.min(Math.max(0, want.heldMicros ?? 0), -leasable);
      if (back > 0) this.add(connId, orgId, -back);
      return { kind: 'grant', micros: back > 0 ? -back : 0, exhausted: true };
    }
    // What the node asked for (what it is short plus a few of its costliest requests), at least a
    // share that leaves room for the other nodes, and small remainders whole; never more than is
    // leasable. A lone node gets everything (a node that joins later reclaims its share). After a
    // reclaim, money is short: the need and a share only, so the others' needs are met too.
    const share = connectedNodes <= 1 ? leasable : Math.floor(leasable / (2 * connectedNodes));
    const asked = afterReclaim && !want.ahead ? need : want.micros;
    const slice = Math.min(leasable, Math.max(asked, share, Math.min(leasable, 10_000)));
    this.add(connId, orgId, slice);
    this.setDebt(connId, orgId, Math.max(0, (want.debtMicros ?? 0) - slice));
    return { kind: 'grant', micros: slice, exhausted: !want.ahead && leasable < need };
  }

  /**
   * What a connection may take of the pool in advance of a later answer that comes late (docs/leases.md,
   * "When the control plane answers late"): what no connection holds, owes or has kept for it, split
   * among the connected nodes, at least 0. Near a limit little is unleased, so a node takes little
   * before it waits for the answer; far from one a silent control plane does not hold requests back.
   */
  advanceFor(connId: string, orgId: string, spendableMicros: number, connectedNodes: number): number {
    const unleased = spendableMicros - this.outstandingFor(orgId) - this.earmarkedFor(orgId, connId);
    return Math.max(0, Math.floor(unleased / Math.max(1, connectedNodes)));
  }

  /** Reported usage of a connection consumes its balance (it may go below zero: see above). */
  consume(connId: string, orgId: string, costMicros: number): void {
    if (costMicros !== 0) this.add(connId, orgId, -costMicros);
  }

  /**
   * A node gave back unused money (`debtMicros`: how far below zero its slice is after it; `forConn`:
   * the connection whose want the reclaim it answers was made for, which it is kept for).
   */
  giveBack(connId: string, orgId: string, micros: number, debtMicros?: number, forConn?: string): void {
    if (debtMicros !== undefined) this.setDebt(connId, orgId, debtMicros);
    if (forConn !== undefined && micros > 0) this.mapAdd(this.earmarks, orgId, forConn, micros);
    if (micros > 0) this.add(connId, orgId, -micros);
  }

  /** A pool no longer leased (a project's or key's period that ended: money-pools.ts) is forgotten. */
  dropPool(poolId: string): void {
    this.balances.delete(poolId);
    this.debts.delete(poolId);
    this.earmarks.delete(poolId);
  }

  /** A closed connection's balances are released (its usage still counts when its reports arrive). */
  dropConnection(connId: string): void {
    for (const m of [this.balances, this.debts, this.earmarks]) {
      for (const [orgId, byConn] of m) {
        byConn.delete(connId);
        if (byConn.size === 0) m.delete(orgId);
      }
    }
  }

  private setDebt(connId: string, orgId: string, micros: number): void {
    if (micros <= 0) this.mapDelete(this.debts, orgId, connId);
    else this.mapAdd(this.debts, orgId, connId, micros - (this.debts.get(orgId)?.get(connId) ?? 0));
  }

  /** Money kept for other connections' wants (earmarks). */
  private earmarkedFor(orgId: string, except: string): number {
    let sum = 0;
    for (const [c, v] of this.earmarks.get(orgId) ?? []) if (c !== except) sum += v;
    return sum;
  }

  private mapDelete(m: Map<string, Map<string, number>>, orgId: string, connId: string): void {
    const byConn = m.get(orgId);
    if (byConn?.delete(connId) && byConn.size === 0) m.delete(orgId);
  }

  private add(connId: string, orgId: string, delta: number): void {
    this.mapAdd(this.balances, orgId, connId, delta);
  }

  private mapAdd(m: Map<string, Map<string, number>>, orgId: string, connId: string, delta: number): void {
    let byConn = m.get(orgId);
    if (!byConn) {
      byConn = new Map();
      m.set(orgId, byConn);
    }
    byConn.set(connId, (byConn.get(connId) ?? 0) + delta);
  }
}
