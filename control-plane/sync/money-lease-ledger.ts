// The money ledger (lease-ledger.ts). Pure: no I/O, no timers; the lease service (lease-service.ts)
// sends the reclaims it asks for and calls it again when they are answered.
//
// Money: per organisation, each connection holds a signed balance: granted, minus returned, minus
// the cost of its reported usage. It goes below zero when a node spent more than it held (requests in
// flight cost more than their estimate); that debt is already in the organisation's spend, so only
// positive balances are outstanding. The node keeps the same arithmetic, so both sides agree on what
// it holds (docs/design.md#money-and-limits-across-nodes).

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
