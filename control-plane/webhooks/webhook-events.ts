// Turns what happens in the control plane into webhook events, each written to the outbox in the
// transaction of the change that caused it (so an event exists exactly when its change committed).
// Threshold events fire once per threshold and period: a mark row per (event, subject, period), and
// an in-memory copy of the marks so the ingest path does no extra query unless something fires.
// Payloads carry ids, amounts and reasons: never a key value, a token or a secret.
import { redactedUrl } from '../gateway-config/webhook-url.js';
import { newId } from '../../proto/lib/keys.js';
import type { OrgState } from '../state/org-state.js';
import type { Db, Tx } from '../store/db.js';
import type { WebhookEventType, WebhookSettings } from '../gateway-config/webhook-config.js';
import { clearMark, insertEvent, loadMarks, refreshMarkIfOlder, setMark } from './webhook-outbox.js';

export const CAP_THRESHOLDS_PERCENT = [80, 100] as const;
const HOUR_MS = 3_600_000;

export interface WebhookEventsOptions {
  now(): number;
  /** The settings in force (they change with a config reload). */
  settings(): WebhookSettings;
  /** Called after COMMIT of a transaction that wrote events (the dispatcher looks at once). */
  onEnqueued?(): void;
}

/** What the organisation looked like before this change, as nodes know it (undefined: a new organisation). */
export interface OrgBefore {
  blocked: boolean;
  blockedReason: string;
}

export interface OrgNow {
  orgId: string;
  state: OrgState;
  monthSpendMicros: number;
  month: string;
}

/** What a project or key with a limit spent in its period, after a usage report (leases/money-pools.ts). */
export interface LimitSpend {
  kind: 'project' | 'key';
  id: string;
  projectId: string;
  orgId: string;
  limitMicros: number;
  reset: string;
  periodStartMs: number;
  periodEndMs: number;
  spentMicros: number;
}

function limitMark(t: LimitSpend, pct: number): string {
  return `${t.kind === 'project' ? 'project.cap.threshold' : 'key.limit.threshold'}:${t.id}:${t.periodStartMs}:${pct}`;
}

export class WebhookEvents {
  private readonly marks = new Map<string, number>();

  private constructor(
    private readonly db: Db,
    private readonly opts: WebhookEventsOptions,
  ) {}

  static async open(db: Db, opts: WebhookEventsOptions): Promise<WebhookEvents> {
    const events = new WebhookEvents(db, opts);
    for (const m of await loadMarks(db)) events.marks.set(m.mark, m.at_ms);
    return events;
  }

  /** Writes one event for every destination subscribed to `type`; none subscribed: nothing is written. */
  async enqueue(tx: Tx, type: WebhookEventType, orgId: string, data: Record<string, unknown>): Promise<string | null> {
    // The outbox knows a destination by its redacted URL (no query: it may hold a token).
    const urls = this.opts.settings().destinations.filter((d) => d.events.has(type)).map((d) => redactedUrl(d.url));
    if (urls.length === 0) return null;
    const atMs = this.opts.now();
    const id = newId('msg');
    const payload = JSON.stringify({ type, timestamp: new Date(atMs).toISOString(), data });
    await insertEvent(tx, { id, type, orgId, payload, atMs }, urls);
    if (this.opts.onEnqueued) tx.afterCommit(this.opts.onEnqueued);
    return id;
  }

  private async mark(tx: Tx, mark: string): Promise<boolean> {
    if (this.marks.has(mark)) return false;
    const atMs = this.opts.now();
    const fresh = await setMark(tx, mark, atMs);
    tx.afterCommit(() => this.marks.set(mark, atMs));
    return fresh;
  }

  private async unmark(tx: Tx, mark: string): Promise<void> {
    if (!this.marks.has(mark)) return;
    await clearMark(tx, mark);
    tx.afterCommit(() => this.marks.delete(mark));
  }

  /**
   * An organisation's money after a change (usage, credit, cap, tier, config): cap thresholds of the
   * month, the low balance, and blocked/unblocked transitions against what nodes held before.
   */
  observeOrg(tx: Tx, now: OrgNow, before: OrgBefore | undefined): Promise<void> | undefined {
    // Most organisations a report charges cross nothing: told from memory, with no promise made.
    return this.orgHasNews(now, before) ? this.announceOrg(tx, now, before) : undefined;
  }

  /** Whether announceOrg would enqueue or mark anything (marks as they are in memory). */
  private orgHasNews(now: OrgNow, before: OrgBefore | undefined): boolean {
    const { orgId, state, monthSpendMicros, month } = now;
    if (before !== undefined && before.blocked !== state.blocked) return true;
    const lowMarked = this.marks.has(`org.balance.low:${orgId}`);
    if (state.balanceMicros <= this.opts.settings().balanceLowMicros ? !lowMarked : lowMarked) return true;
    const cap = state.effectiveCapMicros;
    if (cap === null || cap <= 0) return false;
    return CAP_THRESHOLDS_PERCENT.some((pct) => monthSpendMicros * 100 >= cap * pct && !this.marks.has(`org.cap.threshold:${orgId}:${month}:${pct}`));
  }

  private async announceOrg(tx: Tx, now: OrgNow, before: OrgBefore | undefined): Promise<void> {
    const { orgId, state, monthSpendMicros, month } = now;
    const cap = state.effectiveCapMicros;
    if (cap !== null && cap > 0) {
      for (const pct of CAP_THRESHOLDS_PERCENT) {
        // Integers only: spend * 100 >= cap * pct.
        if (monthSpendMicros * 100 < cap * pct) continue;
        if (!(await this.mark(tx, `org.cap.threshold:${orgId}:${month}:${pct}`))) continue;
        await this.enqueue(tx, 'org.cap.threshold', orgId, { org_id: orgId, month, threshold_percent: pct, month_spend_micros: monthSpendMicros, cap_micros: cap });
      }
    }
    const low = this.opts.settings().balanceLowMicros;
    const lowMark = `org.balance.low:${orgId}`;
    if (state.balanceMicros <= low) {
      // A new organisation that starts low (a paid tier with no credit yet) is not an alert.
      if ((await this.mark(tx, lowMark)) && before !== undefined) {
        await this.enqueue(tx, 'org.balance.low', orgId, { org_id: orgId, balance_micros: state.balanceMicros, threshold_micros: low });
      }
    } else await this.unmark(tx, lowMark);
    if (before !== undefined && before.blocked !== state.blocked) {
      if (state.blocked) await this.enqueue(tx, 'org.blocked', orgId, { org_id: orgId, reason: state.blockedReason, balance_micros: state.balanceMicros, month_spend_micros: monthSpendMicros, cap_micros: cap });
      else await this.enqueue(tx, 'org.unblocked', orgId, { org_id: orgId, previous_reason: before.blockedReason, balance_micros: state.balanceMicros, month_spend_micros: monthSpendMicros, cap_micros: cap });
    }
  }

  /**
   * A project's monthly cap or a key's own limit (docs/money-limits.md) after a usage report: 80 % and
   * 100 % of the limit in its period, each once per period (a mark per threshold and period). Called
   * after the report committed, with what was spent in memory: nothing is written unless a threshold
   * was crossed and not yet announced.
   */
  async limitThresholds(t: LimitSpend): Promise<void> {
    const due = CAP_THRESHOLDS_PERCENT.filter((pct) => t.spentMicros * 100 >= t.limitMicros * pct && !this.marks.has(limitMark(t, pct)));
    if (due.length === 0) return;
    await this.db.tx(async (tx) => {
      for (const pct of due) {
        if (!(await this.mark(tx, limitMark(t, pct)))) continue;
        const period = { period_start: new Date(t.periodStartMs).toISOString(), period_end: Number.isFinite(t.periodEndMs) ? new Date(t.periodEndMs).toISOString() : null };
        if (t.kind === 'project') {
          await this.enqueue(tx, 'project.cap.threshold', t.orgId, { project_id: t.id, org_id: t.orgId, threshold_percent: pct, month_spend_micros: t.spentMicros, cap_micros: t.limitMicros, ...period });
        } else {
          await this.enqueue(tx, 'key.limit.threshold', t.orgId, { key_id: t.id, project_id: t.projectId, org_id: t.orgId, threshold_percent: pct, spent_micros: t.spentMicros, limit_micros: t.limitMicros, limit_reset: t.reset, ...period });
        }
      }
    });
  }

  keyCreated(tx: Tx, key: { id: string; projectId: string; orgId: string; name: string; keyPrefix: string; createdAt: string }): Promise<string | null> {
    return this.enqueue(tx, 'key.created', key.orgId, { key_id: key.id, project_id: key.projectId, org_id: key.orgId, name: key.name, key_prefix: key.keyPrefix, created_at: key.createdAt });
  }

  keyRevoked(tx: Tx, key: { id: string; projectId: string; orgId: string; keyPrefix: string; revokedAt: string }, reason: string): Promise<string | null> {
    return this.enqueue(tx, 'key.revoked', key.orgId, { key_id: key.id, project_id: key.projectId, org_id: key.orgId, key_prefix: key.keyPrefix, revoked_at: key.revokedAt, revoked_reason: reason });
  }

  /**
   * A revoked key was presented (from ingested request logs): at most once per key per hour, with the
   * client IPs of the attempts that raised it.
   */
  async revokedKeyUsed(use: { keyId: string; projectId: string; orgId: string; clientIps: string[]; firstAtMs: number; lastAtMs: number; attempts: number }): Promise<void> {
    const mark = `key.revoked_used:${use.keyId}`;
    const nowMs = this.opts.now();
    const last = this.marks.get(mark);
    if (last !== undefined && nowMs - last < HOUR_MS) return;
    await this.db.tx(async (tx) => {
      if (!(await refreshMarkIfOlder(tx, mark, nowMs, nowMs - HOUR_MS))) return;
      tx.afterCommit(() => this.marks.set(mark, nowMs));
      await this.enqueue(tx, 'key.revoked_used', use.orgId, {
        key_id: use.keyId,
        project_id: use.projectId,
        org_id: use.orgId,
        attempts: use.attempts,
        client_ips: use.clientIps,
        first_seen_at: new Date(use.firstAtMs).toISOString(),
        last_seen_at: new Date(use.lastAtMs).toISOString(),
      });
    });
  }

  /** A key expires within the warning window: once per key (its mark is the key id). */
  async keyExpiring(key: { id: string; projectId: string; orgId: string; keyPrefix: string; expiresAtMs: number }): Promise<void> {
    const mark = `key.expiring:${key.id}`;
    if (this.marks.has(mark)) return;
    await this.db.tx(async (tx) => {
      if (!(await this.mark(tx, mark))) return;
      await this.enqueue(tx, 'key.expiring', key.orgId, { key_id: key.id, project_id: key.projectId, org_id: key.orgId, key_prefix: key.keyPrefix, expires_at: new Date(key.expiresAtMs).toISOString() });
    });
  }

  async nodeDisconnected(node: { id: string; address: string; connectedAt: string; lastSeenAt: string }): Promise<void> {
    await this.db.tx((tx) =>
      this.enqueue(tx, 'node.disconnected', '', { node_id: node.id, address: node.address, connected_at: node.connectedAt, last_seen_at: node.lastSeenAt, disconnected_at: new Date(this.opts.now()).toISOString() }),
    );
  }
}
