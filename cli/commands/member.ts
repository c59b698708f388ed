// `member add|list`.
import type { Member } from '../../proto/gen/tollgate/v1/console.js';
import { formatFields, formatTable, printJson } from '../output.js';
import { requireString, type Command } from './command.js';

function memberJson(m: Member): Record<string, unknown> {
  return { org_id: m.orgId, account_id: m.accountId, account_name: m.accountName, role: m.role };
}

export const memberCommands: Command[] = [
  {
    name: 'member add',
    summary: "Add an account to an organisation, or change its role (admin or above).",
    synopsis: 'ORG --account ACCOUNT_ID --role owner|admin|member',
    positionals: ['ORG'],
    options: {
      account: { type: 'string', value: 'ACCOUNT_ID', help: 'the account to add' },
      role: { type: 'string', value: 'ROLE', help: 'owner, admin or member' },
    },
    async run(ctx, args) {
      const accountId = requireString(args, 'account', ctx.usage);
      const role = requireString(args, 'role', ctx.usage);
      const m = await ctx.client().addMember({ orgId: args.positionals[0], accountId, role });
      if (ctx.out.json) printJson(ctx.out, memberJson(m));
      else ctx.out.write(formatFields([['org', m.orgId], ['account', m.accountId], ['name', m.accountName], ['role', m.role]]));
    },
  },
  {
    name: 'member list',
    summary: "List an organisation's members and their roles.",
    synopsis: 'ORG',
    positionals: ['ORG'],
    async run(ctx, args) {
      const res = await ctx.client().listMembers({ orgId: args.positionals[0] });
      if (ctx.out.json) printJson(ctx.out, { members: res.members.map(memberJson) });
      else ctx.out.write(formatTable(['account', 'name', 'role'], res.members.map((m) => [m.accountId, m.accountName, m.role])));
    },
  },
];
