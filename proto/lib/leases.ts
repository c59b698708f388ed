// The one rule both sides of the lease protocol must agree on (design.md, "Money and limits across
// nodes"): how much of a key's minute budget a node may use before it has asked for anything.
//
// With one node connected it is the whole budget, so a single node is exact without a round trip.
// With n > 1 each node starts a minute with floor(limit / 2n) and leases the rest from the control
// plane in chunks; the control plane reserves the cold share of every connected node that has not yet
// told it what it holds, so the sum of everything admitted in a minute stays within the limit.
export function coldShare(limit: number, connectedNodes: number): number {
  if (limit <= 0) return 0;
  if (connectedNodes <= 1) return limit;
  return Math.floor(limit / (2 * connectedNodes));
}

/** The chunk a node asks for when it runs low on a key's minute budget. */
export function leaseChunk(limit: number, connectedNodes: number): number {
  return Math.max(1, Math.ceil(limit / (4 * Math.max(1, connectedNodes))));
}
