// The node's open realtime sockets by key (key-registry.ts), so a key removal, an organisation block or
// a narrowed scope reaches the sockets already open (docs/design.md#ending-what-a-key-has-open: "open realtime sockets and
// streams of the key are closed"). The sync client calls `enforce` after applying a snapshot or a
// delta and before it acknowledges it, so a control plane that waits for acks knows the sockets are
// closed. No I/O of its own: each socket closes itself through `closeForPolicy`.
import type { GatewayState } from '../auth/key-table.js';
import { KeyRegistry, type KeyEntry } from '../auth/key-registry.js';
import { openStreamGauge } from '../metrics.js';

/** A socket the registry can close: what it was opened for and how to end it. */
export interface OpenSocket extends KeyEntry {
  readonly modelId: string;
  /** Closes the client now with 1008 and `reason` (idempotent). */
  closeForPolicy(reason: string): void;
}

export class OpenSockets extends KeyRegistry<OpenSocket> {
  constructor() {
    super(openStreamGauge('realtime'));
  }

  /**
   * Closes every socket whose key no longer authenticates (revoked), whose organisation is blocked,
   * or whose model the key may no longer use. O(open sockets); nothing when none are open.
   */
  enforce(state: GatewayState): void {
    if (this.size === 0) return;
    const doomed: Array<[OpenSocket, string]> = [];
    for (const [hash, sockets] of this.byKeyHash()) {
      const key = state.keysByHash.get(hash);
      for (const s of sockets) {
        let why: string | null = null;
        if (!key) why = 'invalid_api_key: this API key was revoked';
        else if (key.org.blocked) why = `insufficient_quota: ${blockedReasonText(key.org.blockedReason)}`;
        else if (!state.mayUseModel(key, s.modelId)) why = `model_not_allowed: this API key may no longer use ${s.modelId}`;
        if (why) doomed.push([s, why]);
      }
    }
    // Closed after the walk: closing removes from the registry.
    for (const [s, why] of doomed) s.closeForPolicy(why);
  }

  /** Closes every open socket with 1008 (a node that may no longer vouch for any key). */
  closeAll(reason: string): void {
    for (const s of this.list()) s.closeForPolicy(reason);
  }
}

/** Short enough for a close reason (at most 123 bytes). */
export function blockedReasonText(reason: string): string {
  if (reason === 'monthly_cap_reached') return "the organisation's monthly spend cap was reached";
  if (reason === 'balance_exhausted') return "the organisation's balance is exhausted";
  return "the organisation's balance is exhausted or its monthly cap was reached";
}
