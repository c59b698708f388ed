// `project create|list`.
import type { Project } from '../../proto/gen/tollgate/v1/console.js';
import { formatFields, formatTable, printJson } from '../output.js';
import { requireString, type Command } from './command.js';

function projectJson(p: Project): Record<string, unknown> {
  return { id: p.id, org_id: p.orgId, name: p.name, created_at: p.createdAt };
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
      else ctx.out.write(formatTable(['id', 'name', 'created_at'], res.projects.map((p) => [p.id, p.name, p.createdAt])));
    },
  },
];
