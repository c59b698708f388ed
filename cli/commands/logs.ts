// `tollgate logs`: the request logs, newest first, page by page. The leak procedure's last step:
// `tollgate logs --key KEY_ID --since LEAK_TIME --until REVOKE_TIME` says who used the key, from where,
// and with what answer (attempts after revocation included).
import type { RequestLog } from '../../proto/gen/tollgate/v1/console.js';
import { formatUsd } from '../../proto/lib/money.js';
import { formatTable, printJson, usageError } from '../output.js';
import { optionalString, type Command } from './command.js';

/** RFC 3339 / ISO 8601 (`2025-01-31T12:00:00Z`, `2025-01-31`) or ms since the epoch. */
export function parseTime(flag: string, text: string, usage: string): number {
  const t = text.trim();
  const ms = /^\d{1,16}$/.test(t) ? Number(t) : /^\d{4}-\d{2}-\d{2}([T ][\d:.]+(Z|[+-]\d{2}:?\d{2})?)?$/.test(t) ? Date.parse(t.length === 10 ? `${t}T00:00:00Z` : t) : NaN;
  if (!Number.isSafeInteger(ms) || ms < 0) throw usageError(`--${flag} must be a time such as 2025-01-31T12:00:00Z or ms since the epoch, got ${JSON.stringify(text)}`, usage);
  return ms;
}

function jsonOf(l: RequestLog): Record<string, unknown> {
  return {
    request_id: l.requestId,
    at: new Date(l.atMs).toISOString(),
    node_id: l.nodeId,
    key_id: l.keyId || null,
    project_id: l.projectId || null,
    org_id: l.orgId || null,
    client_ip: l.clientIp,
    user_agent: l.userAgent,
    method: l.method,
    path: l.path,
    status: l.status,
    reason: l.reason || null,
    latency_ms: Math.round(l.latencyUs / 100) / 10,
    bytes_in: l.bytesIn,
    bytes_out: l.bytesOut,
    model: l.model || null,
    prompt_tokens: l.promptTokens,
    completion_tokens: l.completionTokens,
    cost_usd: formatUsd(l.costMicros),
    ...(l.keyPrefix ? { key_prefix: l.keyPrefix } : {}),
    ...(l.responseId ? { response_id: l.responseId } : {}),
    // A pooled model: the deployment that served and every attempt ("id:outcome" …).
    ...(l.deployment ? { deployment: l.deployment } : {}),
    ...(l.attempts ? { attempts: l.attempts } : {}),
  };
}

export const logsCommands: Command[] = [
  {
    name: 'logs',
    summary: 'Show request logs (newest first) of a key, project or organisation; members of its organisation, the operator everywhere.',
    synopsis: '--key KEY_ID | --project PROJECT | --org ORG [--since T] [--until T] [--ip IP] [--status N] [--limit N] [--page TOKEN] [--all]',
    options: {
      key: { type: 'string', value: 'KEY_ID', help: 'the key (revoked keys too: attempts after revocation are logged against them)' },
      project: { type: 'string', value: 'PROJECT', help: 'every key of this project' },
      org: { type: 'string', value: 'ORG', help: 'every key of this organisation' },
      since: { type: 'string', value: 'T', help: 'from this time, inclusive (RFC 3339 or ms since the epoch)' },
      until: { type: 'string', value: 'T', help: 'up to this time, exclusive' },
      ip: { type: 'string', value: 'IP', help: 'only requests from this client IP' },
      status: { type: 'string', value: 'N', help: 'only requests answered with this HTTP status' },
      'unknown-keys': { type: 'boolean', help: 'operator only: the sampled 401s of keys that do not exist (IP and key prefix)' },
      limit: { type: 'string', value: 'N', help: 'rows per page (default 100, at most 1000)' },
      page: { type: 'string', value: 'TOKEN', help: 'the next page, from the token a previous page printed' },
      all: { type: 'boolean', help: 'follow every page to the end' },
    },
    notes: ['The leak procedure: revoke first, then `tollgate logs --key KEY_ID --since LEAK_TIME --until NOW`.'],
    async run(ctx, args) {
      const keyId = optionalString(args, 'key') ?? '';
      const projectId = optionalString(args, 'project') ?? '';
      const orgId = optionalString(args, 'org') ?? '';
      const unknownKeys = args.values['unknown-keys'] === true;
      const sinceText = optionalString(args, 'since');
      const untilText = optionalString(args, 'until');
      const sinceMs = sinceText === undefined ? 0 : parseTime('since', sinceText, ctx.usage);
      const untilMs = untilText === undefined ? 0 : parseTime('until', untilText, ctx.usage);
      if (sinceMs && untilMs && sinceMs >= untilMs) throw usageError('--since must be before --until', ctx.usage);
      const statusText = optionalString(args, 'status');
      if (statusText !== undefined && !/^[1-5]\d\d$/.test(statusText)) throw usageError(`--status must be an HTTP status such as 401, got ${JSON.stringify(statusText)}`, ctx.usage);
      const limitText = optionalString(args, 'limit');
      if (limitText !== undefined && (!/^\d{1,4}$/.test(limitText) || Number(limitText) < 1 || Number(limitText) > 1000)) throw usageError(`--limit must be 1 to 1000, got ${JSON.stringify(limitText)}`, ctx.usage);
      const all = args.values.all === true;
      let pageToken = optionalString(args, 'page') ?? '';
      const rows: RequestLog[] = [];
      let next = '';
      for (;;) {
        const res = await ctx.client().listRequestLogs({
          keyId,
          projectId,
          orgId,
          sinceMs,
          untilMs,
          clientIp: optionalString(args, 'ip') ?? '',
          status: statusText === undefined ? 0 : Number(statusText),
          unknownKeys,
          limit: limitText === undefined ? 0 : Number(limitText),
          pageToken,
        });
        rows.push(...res.logs);
        next = res.nextPageToken;
        if (!all || !next) break;
        pageToken = next;
      }
      if (ctx.out.json) {
        printJson(ctx.out, { logs: rows.map(jsonOf), next_page_token: next || null });
        return;
      }
      ctx.out.write(formatTable(
        ['at', 'key', 'client_ip', 'method', 'path', 'status', 'reason', 'model', 'tokens', 'cost_usd', 'node'],
        rows.map((l) => [
          new Date(l.atMs).toISOString(),
          l.keyId || (l.keyPrefix ? `${l.keyPrefix}…` : ''),
          l.clientIp,
          l.method,
          l.path,
          l.status,
          l.reason,
          l.model,
          l.promptTokens + l.completionTokens || '',
          l.costMicros ? formatUsd(l.costMicros) : '',
          l.nodeId,
        ]),
      ));
      if (next) ctx.out.write(`more: add --page ${next}\n`);
    },
  },
];
