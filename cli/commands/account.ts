// `account create`, `whoami`.
import { formatFields, printJson } from '../output.js';
import { requireString, type Command } from './command.js';

export const accountCommands: Command[] = [
  {
    name: 'account create',
    summary: 'Create an account (operator only). Its console token is shown once.',
    synopsis: '--name NAME',
    options: { name: { type: 'string', value: 'NAME', help: "the account's name" } },
    async run(ctx, args) {
      const name = requireString(args, 'name', ctx.usage);
      const res = await ctx.client().createAccount({ name });
      const account = res.account!;
      if (ctx.out.json) {
        printJson(ctx.out, { id: account.id, name: account.name, token: res.token, created_at: account.createdAt });
        return;
      }
      ctx.out.write(formatFields([
        ['id', account.id],
        ['name', account.name],
        ['created_at', account.createdAt],
        ['token', res.token],
      ]));
      ctx.out.warn('Save this console token now: it will not be shown again. Use it with --token or TOLLGATE_TOKEN.');
    },
  },
  {
    name: 'whoami',
    summary: 'Show who the token belongs to: the operator or an account.',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().whoAmI();
      const account = res.account ? { id: res.account.id, name: res.account.name, created_at: res.account.createdAt } : null;
      if (ctx.out.json) {
        printJson(ctx.out, { operator: res.operator, account });
        return;
      }
      if (res.operator) ctx.out.write('operator\n');
      if (account) ctx.out.write(formatFields([['account', account.id], ['name', account.name], ['created_at', account.created_at]]));
    },
  },
];
