// `webhooks list`, `webhooks test --url URL`, `webhooks deliveries [--failed]` (operator), and `audit`.
import { formatUsd } from '../../proto/lib/money.js';
import { CliError, formatFields, formatTable, nullIfEmpty, printJson, usageError } from '../output.js';
import { parseTimeArg, TIME_ARG_HELP } from '../time-arg.js';
import { optionalString, requireString, type Command } from './command.js';

function limitFlag(text: string | undefined, usage: string): number {
  if (text === undefined) return 0;
  if (!/^\d{1,4}$/.test(text) || Number(text) < 1 || Number(text) > 1000) throw usageError(`--limit must be 1 to 1000, got ${JSON.stringify(text)}`, usage);
  return Number(text);
}

export const webhooksCommands: Command[] = [
  {
    name: 'webhooks list',
    summary: 'Show the webhook destinations of the config (operator): events, paused or not, deliveries pending and failed.',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().listWebhooks();
      const destinations = res.destinations.map((d) => ({
        url: d.url,
        secret_env: d.secretEnv,
        events: d.events,
        paused: d.paused,
        paused_at: nullIfEmpty(d.pausedAt),
        paused_reason: nullIfEmpty(d.pausedReason),
        pending: d.pending,
        failed: d.failed,
        consecutive_failures: d.consecutiveFailures,
        last_success_at: nullIfEmpty(d.lastSuccessAt),
        last_failure_at: nullIfEmpty(d.lastFailureAt),
      }));
      if (ctx.out.json) {
        printJson(ctx.out, { destinations, balance_low_usd: formatUsd(res.balanceLowMicros) });
        return;
      }
      ctx.out.write(formatTable(
        ['url', 'secret_env', 'events', 'state', 'pending', 'failed', 'last_success_at'],
        destinations.map((d) => [d.url, d.secret_env, d.events.join(','), d.paused ? `paused since ${d.paused_at}` : 'active', d.pending, d.failed, d.last_success_at ?? '']),
      ));
      for (const d of destinations) if (d.paused) ctx.out.write(`paused ${d.url}: ${d.paused_reason}; \`tollgate webhooks test --url ${d.url}\` resumes it once it answers 2xx\n`);
    },
  },
  {
    name: 'webhooks test',
    summary: 'Send a signed webhook.test event to a configured destination now (operator); a 2xx resumes it if paused.',
    synopsis: '--url URL',
    options: { url: { type: 'string', value: 'URL', help: 'the destination, as `webhooks list` shows it' } },
    async run(ctx, args) {
      const url = requireString(args, 'url', ctx.usage);
      const r = await ctx.client().testWebhook(url);
      const out = { url: r.url, webhook_id: r.webhookId, ok: r.ok, status: r.status || null, error: nullIfEmpty(r.error), resumed: r.resumed };
      if (ctx.out.json) printJson(ctx.out, out);
      else ctx.out.write(formatFields([['url', out.url], ['webhook_id', out.webhook_id], ['ok', String(out.ok)], ['status', out.status ?? ''], ['error', out.error ?? ''], ['resumed', String(out.resumed)]]));
      // The destination did not accept it: the command failed.
      if (!r.ok) throw new CliError(502, `${r.url} did not accept the test (${r.error || `HTTP ${r.status}`})`);
    },
  },
  {
    name: 'webhooks deliveries',
    summary: 'Show webhook deliveries, newest first (operator): status, attempts, next attempt, last error.',
    synopsis: '[--failed] [--limit N]',
    options: {
      failed: { type: 'boolean', help: 'only deliveries that failed for good or are being retried' },
      limit: { type: 'string', value: 'N', help: 'at most N (default 100, at most 1000)' },
    },
    async run(ctx, args) {
      const res = await ctx.client().listWebhookDeliveries({ failed: args.values.failed === true, limit: limitFlag(optionalString(args, 'limit'), ctx.usage) });
      const rows = res.deliveries.map((d) => ({
        webhook_id: d.webhookId,
        type: d.type,
        url: d.url,
        org_id: nullIfEmpty(d.orgId),
        status: d.status,
        attempts: d.attempts,
        created_at: d.createdAt,
        next_attempt_at: nullIfEmpty(d.nextAttemptAt),
        last_attempt_at: nullIfEmpty(d.lastAttemptAt),
        last_status: d.lastStatus || null,
        last_error: nullIfEmpty(d.lastError),
        delivered_at: nullIfEmpty(d.deliveredAt),
      }));
      if (ctx.out.json) {
        printJson(ctx.out, { deliveries: rows });
        return;
      }
      ctx.out.write(formatTable(
        ['created_at', 'webhook_id', 'type', 'url', 'status', 'attempts', 'next_attempt_at', 'last_error'],
        rows.map((d) => [d.created_at, d.webhook_id, d.type, d.url, d.status, d.attempts, d.next_attempt_at ?? '', d.last_error ?? '']),
      ));
    },
  },
];

export const auditCommands: Command[] = [
  {
    name: 'audit',
    summary: "Show the audit log of console calls, newest first: the operator sees all, owners and admins their organisations'.",
    synopsis: '[--org ORG_ID] [--since T] [--action A] [--limit N]',
    options: {
      org: { type: 'string', value: 'ORG_ID', help: 'only this organisation (owner or admin role)' },
      since: { type: 'string', value: 'T', help: `from T, inclusive; ${TIME_ARG_HELP}` },
      action: { type: 'string', value: 'A', help: 'only this action, e.g. key.revoke, org.credit, member.add' },
      limit: { type: 'string', value: 'N', help: 'at most N entries (default 100, at most 1000)' },
    },
    async run(ctx, args) {
      const sinceText = optionalString(args, 'since');
      let sinceMs = 0;
      if (sinceText !== undefined) {
        const iso = parseTimeArg(sinceText, Date.now());
        if (iso === null) throw usageError(`--since must be ${TIME_ARG_HELP}; got ${JSON.stringify(sinceText)}`, ctx.usage);
        sinceMs = Date.parse(iso);
      }
      const res = await ctx.client().listAuditEntries({
        orgId: optionalString(args, 'org') ?? '',
        sinceMs,
        action: optionalString(args, 'action') ?? '',
        limit: limitFlag(optionalString(args, 'limit'), ctx.usage),
      });
      const entries = res.entries.map((e) => ({
        id: e.id,
        at: e.at,
        actor: e.actor,
        action: e.action,
        target_id: nullIfEmpty(e.targetId),
        org_id: nullIfEmpty(e.orgId),
        outcome: e.outcome,
        caller_address: nullIfEmpty(e.callerAddress),
        detail: nullIfEmpty(e.detail),
      }));
      if (ctx.out.json) {
        printJson(ctx.out, { entries });
        return;
      }
      ctx.out.write(formatTable(
        ['at', 'actor', 'action', 'target', 'org', 'outcome', 'from'],
        entries.map((e) => [e.at, e.actor, e.action, e.target_id ?? '', e.org_id ?? '', e.outcome, e.caller_address ?? '']),
      ));
    },
  },
];
