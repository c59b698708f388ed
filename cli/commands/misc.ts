// `usage`, `models list`, `nodes list`, `config reload`.
import { formatUsd } from '../../proto/lib/money.js';
import { formatTable, printJson, usageError } from '../output.js';
import { optionalString, type Command } from './command.js';

export const miscCommands: Command[] = [
  {
    name: 'usage',
    summary: "Show a project's or an organisation's usage for a month, by key and model.",
    synopsis: '--project PROJECT | --org ORG [--month YYYY-MM]',
    options: {
      project: { type: 'string', value: 'PROJECT', help: 'the project' },
      org: { type: 'string', value: 'ORG', help: 'the organisation (all its projects)' },
      month: { type: 'string', value: 'YYYY-MM', help: 'the month, UTC (default: the current month)' },
    },
    async run(ctx, args) {
      const projectId = optionalString(args, 'project');
      const orgId = optionalString(args, 'org');
      if ((projectId === undefined) === (orgId === undefined)) throw usageError('give exactly one of --project or --org', ctx.usage);
      const month = optionalString(args, 'month') ?? '';
      if (month !== '' && !/^\d{4}-(0[1-9]|1[0-2])$/.test(month)) throw usageError(`--month must look like 2025-01, got ${JSON.stringify(month)}`, ctx.usage);
      const res = await ctx.client().getUsage({ projectId: projectId ?? '', orgId: orgId ?? '', month });
      if (ctx.out.json) {
        printJson(ctx.out, {
          month: res.month,
          ...(projectId !== undefined ? { project_id: projectId } : { org_id: orgId }),
          rows: res.rows.map((r) => ({
            key_id: r.keyId,
            model: r.model,
            requests: r.requests,
            prompt_tokens: r.promptTokens,
            completion_tokens: r.completionTokens,
            cost_usd: formatUsd(r.costMicros),
          })),
          total_requests: res.totalRequests,
          total_cost_usd: formatUsd(res.totalCostMicros),
        });
        return;
      }
      ctx.out.write(`month: ${res.month}\n`);
      ctx.out.write(formatTable(
        ['key', 'model', 'requests', 'prompt_tokens', 'completion_tokens', 'cost_usd'],
        res.rows.map((r) => [r.keyId, r.model, r.requests, r.promptTokens, r.completionTokens, formatUsd(r.costMicros)]),
      ));
      ctx.out.write(`total: ${res.totalRequests} requests, ${formatUsd(res.totalCostMicros)} USD\n`);
    },
  },
  {
    name: 'models list',
    summary: 'List the models in the gateway config, their prices and the tiers whose plan includes them.',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().listModels();
      const models = res.models.map((m) => ({
        id: m.id,
        provider: m.provider,
        upstream_model: m.upstreamModel,
        kind: m.kind,
        input_usd_per_mtok: formatUsd(m.inputMicrosPerMtok),
        output_usd_per_mtok: formatUsd(m.outputMicrosPerMtok),
        tiers: m.tiers,
      }));
      if (ctx.out.json) {
        printJson(ctx.out, { models });
        return;
      }
      ctx.out.write(formatTable(
        ['id', 'kind', 'provider', 'input_usd_per_mtok', 'output_usd_per_mtok', 'tiers'],
        models.map((m) => [m.id, m.kind, m.provider, m.input_usd_per_mtok, m.output_usd_per_mtok, m.tiers.join(',')]),
      ));
    },
  },
  {
    name: 'nodes list',
    summary: 'List the data-plane nodes and the config version each has acknowledged (operator only).',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().listNodes();
      const nodes = res.nodes.map((n) => ({
        id: n.id,
        address: n.address,
        connected: n.connected,
        acked_version: n.ackedVersion,
        last_seen_at: n.lastSeenAt || null,
        connected_at: n.connectedAt || null,
        journal_batches: n.journalBatches,
        journal_bytes: n.journalBytes,
        dropped_log_rows: n.droppedLogRows,
      }));
      if (ctx.out.json) {
        printJson(ctx.out, { nodes, current_version: res.currentVersion });
        return;
      }
      ctx.out.write(`current version: ${res.currentVersion}\n`);
      ctx.out.write(formatTable(
        ['id', 'address', 'connected', 'acked_version', 'last_seen_at', 'journal_batches', 'journal_bytes'],
        nodes.map((n) => [n.id, n.address, n.connected ? 'yes' : 'no', n.acked_version, n.last_seen_at, n.journal_batches, n.journal_bytes]),
      ));
    },
  },
  {
    name: 'config reload',
    summary: 'Re-read the gateway config file and push it to every node (operator only).',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().reloadConfig();
      if (ctx.out.json) printJson(ctx.out, { version: res.version, nodes_total: res.nodesTotal });
      else ctx.out.write(`config reloaded: version ${res.version}, pushed to ${res.nodesTotal} node(s)\n`);
    },
  },
];
