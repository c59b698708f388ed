// `project create|list|set-cap`.
import type { Project } from '../../proto/gen/tollgate/v1/console.js';
import { formatUsd } from '../../proto/lib/money.js';
import { formatFields, formatTable, printJson, usageError } from '../output.js';
import { requireString, usdFlag, type Command } from './command.js';

function projectJson(p: Project): Record<string, unknown> {
  return {
    id: p.id,
    org_id: p.orgId,
    name: p.name,
    created_at: p.createdAt,
    cap_usd: p.capMicros === undefined ? null : formatUsd(p.capMicros),
    month: p.month || null,
    month_spend_usd: formatUsd(p.monthSpendMicros),
  };
}

function capText(p: Project): string {
  return p.capMicros === undefined ? 'none' : `$${formatUsd(p.capMicros)}`;
}

export const projectCommands: Command[] = [
  {
    name: 'project create',
    summary: 'Create a project in an organisation (admin or above).',
    synopsis: '--org ORG --name NAME',
    options: {
      org: { type: 'string', value: 'ORG', help: 'the organisation' },
      name: { type: 'string', value: 'NAME', help: "the project's name" },
    },
    async run(ctx, args) {
      const orgId = requireString(args, 'org', ctx.usage);
      const name = requireString(args, 'name', ctx.usage);
      const p = await ctx.client().createProject({ orgId, name });
      if (ctx.out.json) printJson(ctx.out, projectJson(p));
      else ctx.out.write(formatFields([['id', p.id], ['org', p.orgId], ['name', p.name], ['created_at', p.createdAt]]));
    },
  },
  {
    name: 'project list',
    summary: "List an organisation's projects.",
    synopsis: '--org ORG',
    options: { org: { type: 'string', value: 'ORG', help: 'the organisation' } },
    async run(ctx, args) {
      const orgId = requireString(args, 'org', ctx.usage);
      const res = await ctx.client().listProjects({ orgId });
      if (ctx.out.json) printJson(ctx.out, { projects: res.projects.map(projectJson) });
      else ctx.out.write(formatTable(['id', 'name', 'created_at', 'month_cap', 'month_spend'], res.projects.map((p) => [p.id, p.name, p.createdAt, capText(p), `$${formatUsd(p.monthSpendMicros)}`])));
    },
  },
  {
    name: 'project set-cap',
    summary: "Set or clear a project's monthly spend cap (UTC calendar month; admin or above).",
    synopsis: 'PROJECT --usd AMOUNT | --clear',
    positionals: ['PROJECT'],
    options: {
      usd: { type: 'string', value: 'AMOUNT', help: 'the monthly cap in USD' },
      clear: { type: 'boolean', help: "remove the project's cap" },
    },
    notes: ["Requests of the project's keys over the cap get 401 insufficient_quota until the next UTC month."],
    async run(ctx, args) {
      const clear = args.values.clear === true;
      const hasUsd = args.values.usd !== undefined;
      if (clear === hasUsd) throw usageError('give exactly one of --usd AMOUNT or --clear', ctx.usage);
      const capMicros = clear ? undefined : usdFlag(args, 'usd', ctx.usage);
      const p = await ctx.client().setProjectCap({ projectId: args.positionals[0], capMicros });
      if (ctx.out.json) printJson(ctx.out, projectJson(p));
      else ctx.out.write(formatFields([['id', p.id], ['org', p.orgId], ['name', p.name], ['month_cap', capText(p)], ['month_spend', `$${formatUsd(p.monthSpendMicros)}`], ['month', p.month]]));
    },
  },
];
