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

/**
 * A node's standing share of a key's budget when several nodes are connected (docs/leases.md): what
 * it may admit of a key in a minute (or hold of its parallel slots) without asking, granted in bulk
 * for every key at once. A quarter of the limit split over the nodes, so that nodes joining one after
 * another within a minute never hold more than the limit between them; the control plane counts the
 * shares in its pools and takes unused ones back before it says a key is spent.
 */
export function standingShare(limit: number, nodes: number): number {
  if (!Number.isFinite(limit) || limit <= 0 || nodes <= 1) return 0;
  return Math.floor(limit / (4 * nodes));
}

/**
 * Minute pools by id (docs/leases.md#minute-pools-by-id): the key-minute leases hold a key's rpm and
 * tpm under its key id, and a pooled model's deployment's (the upstream account's own limits) under
 * "deployment:MODEL/ID". Key ids never hold ":" ("key_…"), deployment ids never "/" (the config's rule).
 */
const DEPLOYMENT = 'deployment:';

export function deploymentPoolId(modelId: string, deploymentId: string): string {
  return `${DEPLOYMENT}${modelId}/${deploymentId}`;
}

/** The model and deployment a minute pool id names, or null for a key's. */
export function deploymentOfPool(poolId: string): { modelId: string; deploymentId: string } | null {
  if (!poolId.startsWith(DEPLOYMENT)) return null;
  const slash = poolId.lastIndexOf('/');
  if (slash <= DEPLOYMENT.length) return null;
  return { modelId: poolId.slice(DEPLOYMENT.length, slash), deploymentId: poolId.slice(slash + 1) };
}
