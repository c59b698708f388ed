// Key expiry on the control plane's side. Nodes refuse an expired key on their own (they hold its
// expires_at_ms); this then revokes it through the ordinary revocation path, so its record says
// revoked with revoked_reason "expired", and warns (key.expiring webhook) 7 days ahead.
import type { ControlState } from '../state/control-state.js';
import { expiredActiveKeys, keysExpiringBetween } from '../store/key-expiry-repo.js';
import type { WebhookEvents } from '../webhooks/webhook-events.js';

export const EXPIRING_WARNING_MS = 7 * 86_400_000;
/** How often the warnings are looked for (expired keys: every sweep). */
const WARN_EVERY_MS = 10_000;

export class KeyExpirySweeper {
  private readonly revoking = new Set<string>();
  private lastWarnAtMs = -Infinity;

  constructor(
    private readonly state: ControlState,
    private readonly revoke: (keyId: string, reason: 'expired') => Promise<unknown>,
    private readonly events: WebhookEvents | null,
    private readonly log: (line: string) => void,
  ) {}

  private sweeping = false;

  /** Revokes the keys that have expired, and warns of those about to; one sweep at a time. */
  async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      await this.sweepOnce();
    } finally {
      this.sweeping = false;
    }
  }

  private async sweepOnce(): Promise<void> {
    const now = this.state.now();
    for (const { id } of await expiredActiveKeys(this.state.db, now)) {
      if (this.revoking.has(id)) continue;
      this.revoking.add(id);
      this.revoke(id, 'expired')
        .then(() => this.log(`key ${id} expired: revoked`))
        .catch((err: Error) => this.log(`key ${id} expired but was not revoked: ${err.message}`))
        .finally(() => this.revoking.delete(id));
    }
    if (this.events && now - this.lastWarnAtMs >= WARN_EVERY_MS) {
      this.lastWarnAtMs = now;
      for (const k of await keysExpiringBetween(this.state.db, now, now + EXPIRING_WARNING_MS)) {
        await this.events.keyExpiring({ id: k.id, projectId: k.project_id, orgId: k.org_id, keyPrefix: k.key_prefix, expiresAtMs: k.expires_at_ms });
      }
    }
  }
}
