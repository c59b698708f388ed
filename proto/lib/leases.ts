// The rules both sides of the lease protocol must agree on (docs/design.md#money-and-limits-across-nodes):
// how much of a key's minute budget a node may use before it has asked for anything, and
// how much it asks for at a time.
//
// A lone node holds the whole budget, so a single node is exact without a round trip. With n > 1 a
// node holds nothing it did not lease: no idle node sits on a cold share another node could use.
// When the nodes go from one to several, the control plane asks the former lone node what it holds
// (a reclaim for all keys) before it leases anything of that key's minute to another node.
export function coldShare(limit: number, connectedNodes: number): number {
  if (limit <= 0) return 0;
  return connectedNodes <= 1 ? limit : 0;
}

/** The chunk a node asks for at a time (and prefetches when what it holds runs low). */
export function leaseChunk(limit: number, connectedNodes: number): number {
  return Math.max(1, Math.ceil(limit / (4 * Math.max(1, connectedNodes))));
}
