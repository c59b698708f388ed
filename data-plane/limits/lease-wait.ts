// How long a request short of this node's lease waits for the control plane: the same bounds for a
// key's minute (request/admission.ts) and a deployment's (proxy/providers/pooled-upstreams.ts).

/**
 * The longest a request short of this node's lease waits for the control plane's answer (which
 * includes reclaiming unused allowance from other nodes) before it is refused, or sent in advance.
 */
export const LEASE_WAIT_MS = 250;
/** The longest a request waits when the control plane said its answer waits for reclaims (it is alive and counting: exactness first). */
export const LEASE_WAIT_RECLAIMING_MS = 5000;
