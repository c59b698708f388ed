// `usage`, `models list`, `nodes list`, `config reload`, `safety-id resolve`.
import { formatUsd } from '../../proto/lib/money.js';
import { formatTable, printJson, usageError } from '../output.js';
import { parseTimeArg, TIME_ARG_HELP } from '../time-arg.js';
import { optionalString, type Command } from './command.js';
import { reportedPricesCells, reportedPricesJson } from './model-prices.js';

export const miscCommands: Command[] = [
  {
    name: 'usage',
    summary: "Show a project's or an organisation's usage (members of the organisation): requests, tokens, cost.",
    synopsis: '--project PROJECT | --org ORG [--month YYYY-MM | --since T [--until T]] [--by model|day|key]',
    options: {
      project: { type: 'string', value: 'PROJECT', help: 'the project' },
      org: { type: 'string', value: 'ORG', help: 'the organisation (all its projects)' },
      month: { type: 'string', value: 'YYYY-MM', help: 'a calendar month, UTC (default: the current month)' },
      since: { type: 'string', value: 'T', help: `from T, inclusive (default: the start of the current month); ${TIME_ARG_HELP}` },
      until: { type: 'string', value: 'T', help: 'up to T, exclusive (default: no bound)' },
      by: { type: 'string', value: 'model|day|key', help: 'one row per model, per UTC day or per key (default: per key and model)' },
    },
    async run(ctx, args) {
      const projectId = optionalString(args, 'project');
      const orgId = optionalString(args, 'org');
      if ((projectId === undefined) === (orgId === undefined)) throw usageError('give exactly one of --project or --org', ctx.usage);
      const month = optionalString(args, 'month') ?? '';
      if (month !== '' && !/^\d{4}-(0[1-9]|1[0-2])$/.test(month)) throw usageError(`--month must look like 2025-01, got ${JSON.stringify(month)}`, ctx.usage);
      const now = Date.now();
      const timeFlag = (name: string): string => {
        const raw = optionalString(args, name);
        if (raw === undefined) return '';
        const iso = parseTimeArg(raw, now);
        if (iso === null) throw usageError(`--${name} must be ${TIME_ARG_HELP}; got ${JSON.stringify(raw)}`, ctx.usage);
        return iso;
      };
      const since = timeFlag('since');
      const until = timeFlag('until');
      if (month !== '' && (since !== '' || until !== '')) throw usageError('give either --month or --since/--until, not both', ctx.usage);
      const by = optionalString(args, 'by') ?? '';
      if (!['', 'model', 'day', 'key'].includes(by)) throw usageError(`--by must be model, day or key, got ${JSON.stringify(by)}`, ctx.usage);
      const res = await ctx.client().getUsage({ projectId: projectId ?? '', orgId: orgId ?? '', month, since, until, groupBy: by });
      const rows = res.rows.map((r) => ({
        ...(by === '' || by === 'key' ? { key_id: r.keyId } : {}),
        ...(by === '' || by === 'model' ? { model: r.model } : {}),
        ...(by === 'day' ? { day: r.day } : {}),
        requests: r.requests,
        input_tokens: r.promptTokens,
        output_tokens: r.completionTokens,
        cost_usd: formatUsd(r.costMicros),
      }));
      const totals = {
        requests: res.totalRequests,
        input_tokens: res.totalPromptTokens,
        output_tokens: res.totalCompletionTokens,
        cost_usd: formatUsd(res.totalCostMicros),
      };
      if (ctx.out.json) {
        printJson(ctx.out, {
          ...(projectId !== undefined ? { project_id: projectId } : { org_id: orgId }),
          month: res.month || null,
          since: res.since,
          until: res.until || null,
          group_by: by || 'key,model',
          rows,
          totals,
          // Kept from the first version of this output.
          total_requests: res.totalRequests,
          total_cost_usd: formatUsd(res.totalCostMicros),
        });
        return;
      }
      ctx.out.write(res.month ? `month: ${res.month}\n` : `from ${res.since} to ${res.until || 'now'}\n`);
      const headers = Object.keys(rows[0] ?? { [by || 'key_id']: '', requests: 0, input_tokens: 0, output_tokens: 0, cost_usd: '' });
      ctx.out.write(formatTable(headers, rows.map((r) => Object.values(r))));
      ctx.out.write(`total: ${totals.requests} requests, ${totals.input_tokens} input tokens, ${totals.output_tokens} output tokens, ${totals.cost_usd} USD\n`);
    },
  },
  {
    name: 'models list',
    summary: 'List the models in the gateway config, their prices and the tiers whose plan includes them.',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().listModels();
      // Prices the upstream bills apart: the configured price, else the one it is billed at (money.ts).
      const part = (own: number | undefined, fallback: number) => ({ usd: formatUsd(own ?? fallback), own: own !== undefined });
      const models = res.models.map((m) => {
        const cached = part(m.cachedInputMicrosPerMtok, m.inputMicrosPerMtok);
        const write = part(m.cacheWriteMicrosPerMtok, m.inputMicrosPerMtok);
        const audioIn = part(m.inputAudioMicrosPerMtok, m.inputMicrosPerMtok);
        const audioOut = part(m.outputAudioMicrosPerMtok, m.outputMicrosPerMtok);
        return {
          id: m.id,
          provider: m.provider,
          upstream_model: m.upstreamModel,
          kind: m.kind,
          input_usd_per_mtok: formatUsd(m.inputMicrosPerMtok),
          output_usd_per_mtok: formatUsd(m.outputMicrosPerMtok),
          audio_usd_per_unit: formatUsd(m.audioMicrosPerUnit),
          // What each part is billed at; the `*_set` flags say whether the config names it or it falls back.
          cached_input_usd_per_mtok: cached.usd,
          cache_write_usd_per_mtok: write.usd,
          input_audio_usd_per_mtok: audioIn.usd,
          output_audio_usd_per_mtok: audioOut.usd,
          prices_set: {
            cached_input: cached.own,
            cache_write: write.own,
            input_audio: audioIn.own,
            output_audio: audioOut.own,
          },
          // Prices by what the upstream reports: its service tier, a long prompt, built-in tool calls.
          ...reportedPricesJson(m),
          tiers: m.tiers,
        };
      });
      if (ctx.out.json) {
        printJson(ctx.out, { models });
        return;
      }
      // Models billed per unit of audio show that price; the per-token columns would only say 0.00.
      const perUnit = (kind: string) => kind === 'transcription' || kind === 'speech';
      const shown = (usd: string, own: boolean, of: string) => (own ? usd : `${usd} (=${of})`);
      ctx.out.write(formatTable(
        ['id', 'kind', 'provider', 'input_usd_per_mtok', 'output_usd_per_mtok', 'audio_usd_per_unit', 'cached_input_usd_per_mtok', 'cache_write_usd_per_mtok', 'input_audio_usd_per_mtok', 'output_audio_usd_per_mtok', 'service_tiers (in/out/cached)', 'long_context (in/out)', 'tool_calls_usd', 'tiers'],
        models.map((m) =>
          perUnit(m.kind)
            ? [m.id, m.kind, m.provider, null, null, `${m.audio_usd_per_unit} ${m.kind === 'speech' ? '/1k chars' : '/second'}`, null, null, null, null, null, null, null, m.tiers.join(',')]
            : [
                m.id,
                m.kind,
                m.provider,
                m.input_usd_per_mtok,
                m.output_usd_per_mtok,
                null,
                shown(m.cached_input_usd_per_mtok, m.prices_set.cached_input, 'input'),
                shown(m.cache_write_usd_per_mtok, m.prices_set.cache_write, 'input'),
                shown(m.input_audio_usd_per_mtok, m.prices_set.input_audio, 'input'),
                shown(m.output_audio_usd_per_mtok, m.prices_set.output_audio, 'output'),
                ...reportedPricesCells(m),
                m.tiers.join(','),
              ],
        ),
      ));
    },
  },
  {
    name: 'safety-id resolve',
    summary: 'Which project (or key, or organisation) a safety_identifier an upstream reported belongs to (operator only; docs/safety-identifier.md).',
    synopsis: 'VALUE',
    positionals: ['VALUE'],
    async run(ctx, args) {
      const r = await ctx.client().resolveSafetyIdentifier({ value: args.positionals[0] });
      if (ctx.out.json) {
        printJson(ctx.out, { subject: r.subject, project_id: r.projectId, org_id: r.orgId, key_id: r.keyId });
        return;
      }
      ctx.out.write(`subject: ${r.subject}\n`);
      if (r.projectId) ctx.out.write(`project: ${r.projectId}\n`);
      ctx.out.write(`org: ${r.orgId}\n`);
      if (r.keyId) ctx.out.write(`key: ${r.keyId}\n`);
    },
  },
  {
    name: 'nodes list',
    summary: 'List the data-plane nodes: address, applied version, lag, last report, journal depth (operator only).',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().listNodes();
      const nodes = res.nodes.map((n) => ({
        id: n.id,
        address: n.address,
        connected: n.connected,
        acked_version: n.ackedVersion,
        lag: n.lag,
        last_seen_at: n.lastSeenAt || null,
        last_report_at: n.lastReportAt || null,
        journal_depth: n.journalDepth ?? null,
        connected_at: n.connectedAt || null,
        journal_bytes: n.journalBytes,
        dropped_log_rows: n.droppedLogRows,
      }));
      if (ctx.out.json) {
        printJson(ctx.out, { nodes, current_version: res.currentVersion });
        return;
      }
      ctx.out.write(`current version: ${res.currentVersion}\n`);
      ctx.out.write(formatTable(
        ['id', 'address', 'connected', 'applied_version', 'lag', 'last_report_at', 'journal_depth', 'last_seen_at'],
        nodes.map((n) => [n.id, n.address, n.connected ? 'yes' : 'no', n.acked_version, n.lag, n.last_report_at, n.journal_depth, n.last_seen_at]),
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
