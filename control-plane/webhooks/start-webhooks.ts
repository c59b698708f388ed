// Assembles the webhook parts for main.ts: events (written in the transactions that cause them), the
// dispatcher that sends the outbox, the revoked-key watch on ingested logs, the console's admin view,
// and the node-disconnect report (after a grace, so a node that reconnects at once raises nothing).
import type { ControlState } from '../state/control-state.js';
import { redactedUrl } from '../gateway-config/webhook-url.js';
import { RevokedKeyWatch } from './revoked-key-watch.js';
import { redactStoredUrls } from './webhook-outbox.js';
import { WebhookAdmin } from './webhook-admin.js';
import { WebhookDispatcher } from './webhook-dispatcher.js';
import { WebhookEvents } from './webhook-events.js';

/** A node that has not come back after this is reported disconnected. */
export const NODE_DISCONNECT_GRACE_MS = 5_000;

export interface Webhooks {
  events: WebhookEvents;
  dispatcher: WebhookDispatcher;
  admin: WebhookAdmin;
  revokedKeys: RevokedKeyWatch;
  /** For SyncService's onNodeDisconnected; `isConnected` tells whether the node came back. */
  nodeDisconnected(node: { id: string; address: string; connectedAt: string; lastSeenAt: string }, isConnected: (id: string) => boolean): void;
  stop(): void;
}

export async function startWebhooks(state: ControlState, log: (line: string, fields?: Record<string, unknown>) => void): Promise<Webhooks> {
  const now = () => state.now();
  const settings = () => state.gateway.settings.webhooks;
  const dispatcher = new WebhookDispatcher(state.db, { now, settings, log });
  // An outbox written before URLs were stored redacted loses its queries now.
  const redacted = await redactStoredUrls(state.db, redactedUrl).catch((err: Error) => (log(`webhooks: outbox URLs not redacted: ${err.message}`), 0));
  if (redacted > 0) log(`webhooks: ${redacted} destination URL(s) in the outbox redacted (their queries removed)`);
  await dispatcher.prune().catch((err: Error) => log(`webhooks: prune failed: ${err.message}`));
  const events = await WebhookEvents.open(state.db, { now, settings, onEnqueued: () => dispatcher.kick() });
  const revokedKeys = new RevokedKeyWatch(events, log);
  await revokedKeys.load(state.db);
  state.orgObserver = (tx, org, before) => events.observeOrg(tx, org, before);
  const admin = new WebhookAdmin(state.db, dispatcher, { now, settings });
  const timers = new Set<NodeJS.Timeout>();
  const pruneTimer = setInterval(() => dispatcher.prune().catch((err: Error) => log(`webhooks: prune failed: ${err.message}`)), 3_600_000);
  pruneTimer.unref();
  dispatcher.kick();
  return {
    events,
    dispatcher,
    admin,
    revokedKeys,
    nodeDisconnected(node, isConnected) {
      const t = setTimeout(() => {
        timers.delete(t);
        if (isConnected(node.id)) return;
        events.nodeDisconnected(node).catch((err: Error) => log(`webhooks: node.disconnected not recorded: ${err.message}`));
      }, NODE_DISCONNECT_GRACE_MS);
      t.unref();
      timers.add(t);
    },
    stop() {
      clearInterval(pruneTimer);
      for (const t of timers) clearTimeout(t);
      timers.clear();
      dispatcher.stop();
    },
  };
}
