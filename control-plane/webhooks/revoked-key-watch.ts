// `key.revoked_used` from ingested request logs: nodes log every attempt made with a revoked key
// against its tombstone (401). This wraps the log store: after a report's blocks are written, the
// blocks that index a revoked key (known in memory, so other blocks cost one Set lookup per key) are
// decoded and their 401 rows since the revocation summed per key, with the client IPs seen. The
// event itself is limited to once per key per hour by WebhookEvents.
import { matchLogColumns } from '../../proto/lib/log-columns.js';
import { LogColumns } from '../../proto/gen/tollgate/v1/sync.js';
import type { Queryable } from '../store/db.js';
import type { LogPart, LogSource, LogStore } from '../store/log-store/log-store.js';
import type { WebhookEvents } from './webhook-events.js';

/** At most this many distinct IPs are named in one event. */
const MAX_IPS = 20;

interface Use {
  keyId: string;
  projectId: string;
  orgId: string;
  ips: Set<string>;
  attempts: number;
  firstAtMs: number;
  lastAtMs: number;
}

export class RevokedKeyWatch {
  /** Revoked key id → when its credential was deleted (ms). */
  private readonly revoked = new Map<string, number>();

  constructor(
    private readonly events: WebhookEvents,
    private readonly log: (line: string) => void = (l) => console.error(l),
  ) {}

  async load(q: Queryable): Promise<void> {
    for (const r of await q.all<{ key_id: string; revoked_at: string }>('SELECT key_id, revoked_at FROM key_tombstones')) {
      this.revoked.set(r.key_id, Date.parse(r.revoked_at) || 0);
    }
  }

  /** The credential of `keyId` was deleted at `atMs` (revocation step 1). */
  keyRevoked(keyId: string, atMs: number): void {
    this.revoked.set(keyId, atMs);
  }

  /** The log store, watched: every write goes through unchanged, then its revoked-key rows are looked at. */
  wrap(store: LogStore): LogStore {
    const watch = this;
    return {
      writeBlocks: async (source: LogSource, parts: readonly LogPart[]) => {
        const r = await store.writeBlocks(source, parts);
        if (!r.duplicate && watch.revoked.size > 0) {
          // Off the ingest path: the report is acknowledged without waiting for this.
          watch.observe(parts).catch((err: Error) => watch.log(`webhooks: revoked-key scan failed: ${err.message}`));
        }
        return r;
      },
      isPageToken: (t) => store.isPageToken(t),
      query: (f, l, p) => store.query(f, l, p),
      applyRetention: () => store.applyRetention(),
      close: () => store.close(),
    };
  }

  async observe(parts: readonly LogPart[]): Promise<void> {
    const uses = new Map<string, Use>();
    for (const part of parts) {
      for (const block of part.blocks) {
        const hits = block.keys.filter((k) => k.keyId !== '' && this.revoked.has(k.keyId));
        if (hits.length === 0) continue;
        let cols: LogColumns;
        try {
          cols = LogColumns.decode(block.columns);
        } catch {
          continue;
        }
        for (const k of hits) {
          for (const { row } of matchLogColumns(cols, { keyId: k.keyId, status: 401, sinceMs: this.revoked.get(k.keyId) })) {
            let use = uses.get(k.keyId);
            if (!use) {
              use = { keyId: k.keyId, projectId: k.projectId, orgId: k.orgId, ips: new Set(), attempts: 0, firstAtMs: row.atMs, lastAtMs: row.atMs };
              uses.set(k.keyId, use);
            }
            use.attempts++;
            if (use.ips.size < MAX_IPS && row.clientIp) use.ips.add(row.clientIp);
            use.firstAtMs = Math.min(use.firstAtMs, row.atMs);
            use.lastAtMs = Math.max(use.lastAtMs, row.atMs);
          }
        }
      }
    }
    for (const u of uses.values()) {
      await this.events.revokedKeyUsed({ keyId: u.keyId, projectId: u.projectId, orgId: u.orgId, clientIps: [...u.ips].sort(), attempts: u.attempts, firstAtMs: u.firstAtMs, lastAtMs: u.lastAtMs });
    }
  }
}
