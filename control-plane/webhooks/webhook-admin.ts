// What the console answers about webhooks (operator only; the role check is the console's): the
// configured destinations with their state, a signed test send, and the deliveries.
import { newId } from '../../proto/lib/keys.js';
import type { ListWebhookDeliveriesResponse, ListWebhooksResponse, TestWebhookResponse } from '../../proto/gen/tollgate/v1/console.js';
import { notFound } from '../errors.js';
import type { Db } from '../store/db.js';
import type { WebhookSettings } from '../gateway-config/webhook-config.js';
import { redactedUrl } from '../gateway-config/webhook-url.js';
import { sendWebhook, type WebhookDispatcher } from './webhook-dispatcher.js';
import { listDeliveries, listDestinationRows, pendingCounts } from './webhook-outbox.js';

const iso = (ms: number) => (ms > 0 ? new Date(ms).toISOString() : '');
const MAX_LIST = 1000;

export class WebhookAdmin {
  constructor(
    private readonly db: Db,
    private readonly dispatcher: WebhookDispatcher,
    private readonly opts: { now(): number; settings(): WebhookSettings },
  ) {}

  async list(): Promise<ListWebhooksResponse> {
    const settings = this.opts.settings();
    const [rows, counts] = await this.db.read(async (q) => [await listDestinationRows(q), await pendingCounts(q)] as const);
    return {
      balanceLowMicros: settings.balanceLowMicros,
      destinations: settings.destinations.map((d) => {
        const url = redactedUrl(d.url);
        const r = rows.find((x) => x.url === url);
        const c = counts.find((x) => x.url === url);
        return {
          url,
          secretEnv: d.secretEnv,
          events: [...d.events],
          paused: (r?.paused_at_ms ?? 0) > 0,
          pausedAt: iso(r?.paused_at_ms ?? 0),
          pausedReason: r?.paused_reason ?? '',
          pending: c?.pending ?? 0,
          failed: c?.failed ?? 0,
          consecutiveFailures: r?.consecutive_failures ?? 0,
          lastSuccessAt: iso(r?.last_success_at_ms ?? 0),
          lastFailureAt: iso(r?.last_failure_at_ms ?? 0),
        };
      }),
    };
  }

  /** One `webhook.test` event, sent now (not through the outbox); a 2xx resumes a paused destination. */
  async test(rawUrl: string): Promise<TestWebhookResponse> {
    const url = rawUrl.trim();
    let href = url;
    try {
      href = new URL(url).href;
    } catch {
      // Compared as given: it will not match.
    }
    // Named as `webhooks list` shows it (no query) or in full: redacted URLs are unique in a config.
    const shown = redactedUrl(href);
    const dest = this.opts.settings().destinations.find((d) => d.url === href || (shown !== '' && redactedUrl(d.url) === shown));
    if (!dest) throw notFound(`no webhook destination ${JSON.stringify((shown || url.split(/[?#]/)[0]).slice(0, 200))} in the config; \`tollgate webhooks list\` shows them`);
    const id = newId('msg');
    const atMs = this.opts.now();
    const body = JSON.stringify({ type: 'webhook.test', timestamp: new Date(atMs).toISOString(), data: { url: dest.url } });
    const r = await sendWebhook(dest, id, atMs, body);
    const resumed = r.ok ? await this.dispatcher.resume(dest.url) : false;
    return { url: redactedUrl(dest.url), webhookId: id, ok: r.ok, status: r.status, error: r.error, resumed };
  }

  async deliveries(failedOnly: boolean, limit: number): Promise<ListWebhookDeliveriesResponse> {
    const rows = await listDeliveries(this.db, { failedOnly, limit: Math.min(MAX_LIST, limit > 0 ? limit : 100) });
    return {
      deliveries: rows.map((d) => ({
        webhookId: d.event_id,
        type: d.type,
        url: redactedUrl(d.url),
        orgId: d.org_id,
        status: d.status,
        attempts: d.attempts,
        createdAt: iso(d.created_at_ms),
        nextAttemptAt: d.status === 'pending' ? iso(d.next_at_ms) : '',
        lastAttemptAt: iso(d.last_attempt_at_ms),
        lastStatus: d.last_status,
        lastError: d.last_error,
        deliveredAt: iso(d.delivered_at_ms),
      })),
    };
  }
}
