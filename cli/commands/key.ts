// `key create|list|show|find|revoke`. The full key value is printed by `key create` only, once.
import type { ApiKey } from '../../proto/gen/tollgate/v1/console.js';
import { readKeyFromStdin } from '../stdin-secret.js';
import { formatFields, formatTable, nullIfEmpty, printJson, usageError } from '../output.js';
import { DURATION_HELP, parseDurationSec } from '../duration-arg.js';
import { listFlag, optionalString, requireString, usdFlag, type Command } from './command.js';
import { formatUsd } from '../../proto/lib/money.js';
import { LIMIT_RESETS } from '../../proto/lib/spend-limits.js';

/** A key's own money limit as JSON; with `spend` (key show), what it spent in the current period too. */
function limitJson(k: ApiKey, spend: boolean): Record<string, unknown> {
  if (!k.limitMicros) return spend ? { limit_usd: null, limit_reset: null, spent_usd: null, resets_at: null } : { limit_usd: null, limit_reset: null };
  const out: Record<string, unknown> = { limit_usd: formatUsd(k.limitMicros), limit_reset: k.limitReset };
  if (spend) {
    out.spent_usd = formatUsd(k.limitSpentMicros);
    out.resets_at = nullIfEmpty(k.limitResetsAt);
  }
  return out;
}

function limitText(k: ApiKey, spend: boolean): string {
  if (!k.limitMicros) return 'none';
  const base = `$${formatUsd(k.limitMicros)} ${k.limitReset === 'never' ? 'total (never resets)' : k.limitReset}`;
  if (!spend) return base;
  return `${base}; spent $${formatUsd(k.limitSpentMicros)}${k.limitResetsAt ? `, resets at ${k.limitResetsAt}` : ''}`;
}

/** A key record as the CLI's JSON shows it (never the value). */
export function keyJson(k: ApiKey, spend = false): Record<string, unknown> {
  return {
    id: k.id,
    key_prefix: k.keyPrefix,
    project_id: k.projectId,
    org_id: k.orgId,
    name: k.name,
    allowed_models: k.allowedModels,
    status: k.status,
    last_used_at: nullIfEmpty(k.lastUsedAt),
    created_at: k.createdAt,
    revoked_at: nullIfEmpty(k.revokedAt),
    rpm_limit: k.rpmLimit,
    tpm_limit: k.tpmLimit,
    max_parallel_requests: k.maxParallelRequests,
    expires_at: nullIfEmpty(k.expiresAt),
    revoked_reason: nullIfEmpty(k.revokedReason),
    ...limitJson(k, spend),
  };
}

function modelsText(models: string[]): string {
  return models.length === 0 ? 'all in plan' : models.join(',');
}

/** One key's record as `key: value` lines (prefix only, never the value). */
function keyFields(k: ApiKey): string {
  return formatFields([
    ['id', k.id],
    ['name', k.name],
    ['key_prefix', k.keyPrefix],
    ['project', k.projectId],
    ['org', k.orgId],
    ['status', k.status],
    ['revoked_at', k.revokedAt ? `${k.revokedAt} (${k.revokedReason || 'revoked'})` : 'never'],
    ['expires_at', k.expiresAt || 'never'],
    ['last_used_at', k.lastUsedAt || 'never'],
    ['created_at', k.createdAt],
    ['models', modelsText(k.allowedModels)],
    ['limits', `${k.rpmLimit} rpm, ${k.tpmLimit} tpm, ${k.maxParallelRequests} parallel`],
    ['spend_limit', limitText(k, true)],
  ]);
}

export const keyCommands: Command[] = [
  {
    name: 'key create',
    summary: 'Create an API key in a project (admin or above). The key is shown once.',
    synopsis: '--project PROJECT [--name NAME] [--models a,b] [--expires-in DURATION | --expires-at ISO] [--limit-usd AMOUNT [--limit-reset daily|weekly|monthly|never]]',
    options: {
      project: { type: 'string', value: 'PROJECT', help: 'the project the key belongs to' },
      name: { type: 'string', value: 'NAME', help: 'a name to tell keys apart' },
      models: { type: 'string', value: 'a,b', help: "models the key may call (default: every model the plan allows)" },
      'expires-in': { type: 'string', value: 'DURATION', help: `the key stops authenticating after ${DURATION_HELP} (default: never, or the organisation's maximum lifetime)` },
      'expires-at': { type: 'string', value: 'ISO', help: 'the key stops authenticating at this RFC 3339 time' },
      'limit-usd': { type: 'string', value: 'AMOUNT', help: "the key's own spend limit in USD (refused with 401 insufficient_quota once spent)" },
      'limit-reset': { type: 'string', value: 'PERIOD', help: 'when the limit starts afresh (UTC): daily, weekly (Monday), monthly or never (the default)' },
    },
    notes: ["Rate limits (rpm, tpm, parallel requests) are fixed from the organisation's tier now; a spend limit is fixed at creation too."],
    async run(ctx, args) {
      const projectId = requireString(args, 'project', ctx.usage);
      const inText = optionalString(args, 'expires-in');
      const atText = optionalString(args, 'expires-at');
      if (inText !== undefined && atText !== undefined) throw usageError('give at most one of --expires-in and --expires-at', ctx.usage);
      const expiresInSec = inText === undefined ? 0 : parseDurationSec(inText);
      if (expiresInSec === null) throw usageError(`--expires-in must be ${DURATION_HELP}, got ${JSON.stringify(inText)}`, ctx.usage);
      const limitReset = optionalString(args, 'limit-reset');
      const limitMicros = args.values['limit-usd'] === undefined ? undefined : usdFlag(args, 'limit-usd', ctx.usage);
      if (limitReset !== undefined && limitMicros === undefined) throw usageError('--limit-reset needs --limit-usd', ctx.usage);
      if (limitReset !== undefined && !(LIMIT_RESETS as readonly string[]).includes(limitReset)) throw usageError(`--limit-reset must be one of ${LIMIT_RESETS.join(', ')}, got ${JSON.stringify(limitReset)}`, ctx.usage);
      const res = await ctx.client().createKey({ projectId, name: optionalString(args, 'name') ?? '', allowedModels: listFlag(args, 'models'), expiresInSec, expiresAt: atText ?? '', limitMicros, limitReset });
      const k = res.apiKey!;
      if (ctx.out.json) {
        const { revoked_at: _revoked, revoked_reason: _reason, ...rest } = keyJson(k);
        printJson(ctx.out, { id: k.id, key: res.key, ...rest });
        return;
      }
      ctx.out.write(formatFields([
        ['id', k.id],
        ['project', k.projectId],
        ['name', k.name],
        ['models', modelsText(k.allowedModels)],
        ['limits', `${k.rpmLimit} rpm, ${k.tpmLimit} tpm, ${k.maxParallelRequests} parallel`],
        ['expires_at', k.expiresAt || 'never'],
        ['spend_limit', limitText(k, false)],
        ['key', res.key],
      ]));
      ctx.out.write('\nCopy this key now: it will not be shown again. Only its prefix is kept.\n');
    },
  },
  {
    name: 'key list',
    summary: "List a project's keys (prefixes only, never the values).",
    synopsis: '--project PROJECT [--expiring-within DURATION]',
    options: {
      project: { type: 'string', value: 'PROJECT', help: 'the project' },
      'expiring-within': { type: 'string', value: 'DURATION', help: `only active keys that expire within ${DURATION_HELP}` },
    },
    async run(ctx, args) {
      const projectId = requireString(args, 'project', ctx.usage);
      const withinText = optionalString(args, 'expiring-within');
      const expiringWithinSec = withinText === undefined ? 0 : parseDurationSec(withinText);
      if (expiringWithinSec === null) throw usageError(`--expiring-within must be ${DURATION_HELP}, got ${JSON.stringify(withinText)}`, ctx.usage);
      const res = await ctx.client().listKeys({ projectId, expiringWithinSec });
      if (ctx.out.json) {
        printJson(ctx.out, { keys: res.keys.map((k) => keyJson(k)) });
        return;
      }
      ctx.out.write(formatTable(
        ['id', 'name', 'key_prefix', 'status', 'models', 'rpm', 'tpm', 'parallel', 'last_used_at', 'created_at', 'expires_at'],
        res.keys.map((k) => [k.id, k.name, k.keyPrefix, k.status, modelsText(k.allowedModels), k.rpmLimit, k.tpmLimit, k.maxParallelRequests, k.lastUsedAt || 'never', k.createdAt, k.expiresAt || 'never']),
      ));
    },
  },
  {
    name: 'key show',
    summary: "Show one key's record, revoked_at included (members of its organisation; prefix only, never the value).",
    synopsis: 'KEY_ID',
    positionals: ['KEY_ID'],
    async run(ctx, args) {
      const k = await ctx.client().getKey({ keyId: args.positionals[0] });
      if (ctx.out.json) printJson(ctx.out, keyJson(k, true));
      else ctx.out.write(keyFields(k));
    },
  },
  {
    name: 'key find',
    summary: 'Name the key a leaked value belongs to: reads the value on standard input (members of its organisation).',
    synopsis: '< FILE_WITH_THE_KEY',
    noArgumentsReason: 'key find takes the key value on standard input, never as an argument (arguments stay in shell history and process lists): tollgate key find < leaked.txt',
    notes: [
      'Reads the first line of standard input, e.g. `tollgate key find < leaked.txt` or `pbpaste | tollgate key find`.',
      'Answers the key id, project, organisation and status, for an active or a revoked key; a key of an',
      'organisation you are not a member of is "not found", like a value that is no key at all.',
      'Leaked key: revoke it first (`tollgate key revoke KEY_ID`), create and deploy a replacement, then read',
      'the request logs of the key for the window between the leak and the revocation.',
    ],
    async run(ctx) {
      const value = await readKeyFromStdin(ctx.usage);
      const k = await ctx.client().findKey({ key: value });
      if (ctx.out.json) {
        printJson(ctx.out, keyJson(k));
        return;
      }
      ctx.out.write(keyFields(k));
      if (k.status === 'active') ctx.out.write(`\nThis key is active. If it leaked, revoke it now: tollgate key revoke ${k.id}\n`);
    },
  },
  {
    name: 'key revoke',
    summary: 'Revoke a key (admin or above): the gateway stops accepting it, then the record says revoked.',
    synopsis: 'KEY_ID',
    positionals: ['KEY_ID'],
    notes: ['Waits for the connected gateway nodes to confirm; a revoked key stays revoked.'],
    async run(ctx, args) {
      const res = await ctx.client().revokeKey({ keyId: args.positionals[0] });
      const k = res.apiKey!;
      const disconnected = res.nodesDisconnected.map((n) => ({ id: n.id, last_seen_at: nullIfEmpty(n.lastSeenAt) }));
      if (ctx.out.json) {
        printJson(ctx.out, {
          id: k.id,
          status: k.status,
          key_prefix: k.keyPrefix,
          nodes_confirmed: res.nodesConfirmed,
          nodes_total: res.nodesTotal,
          nodes_unconfirmed: res.nodesUnconfirmed,
          nodes_disconnected: disconnected,
        });
        return;
      }
      ctx.out.write(formatFields([
        ['id', k.id],
        ['key_prefix', k.keyPrefix],
        ['status', k.status],
        ['nodes', `${res.nodesConfirmed} of ${res.nodesTotal} connected confirmed${disconnected.length > 0 ? `, ${disconnected.length} known node(s) not connected` : ''}`],
      ]));
      if (res.nodesUnconfirmed.length > 0) {
        ctx.out.warn(`warning: connected node(s) that did not confirm in time: ${res.nodesUnconfirmed.join(', ')}; they refuse the key once they resync.`);
      }
      if (disconnected.length > 0) {
        const list = disconnected.map((n) => `${n.id} (last seen ${n.last_seen_at ?? 'never'})`).join(', ');
        ctx.out.warn(`warning: node(s) known but not connected, which may still accept the key from their last state until they reconnect: ${list}`);
      }
    },
  },
];
