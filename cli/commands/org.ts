// `org create|list|show|set-tier|credit|set-cap|set-key-policy`.
import type { Org } from '../../proto/gen/tollgate/v1/console.js';
import { formatUsd } from '../../proto/lib/money.js';
import { formatFields, formatTable, printJson, usageError, type Out } from '../output.js';
import { optionalString, requireString, usdFlag, type Command } from './command.js';
import { DURATION_HELP, parseDurationSec } from '../duration-arg.js';

/** The organisation as the CLI's JSON shows it: snake_case, money as decimal USD strings. */
export function orgJson(org: Org): Record<string, unknown> {
  return {
    id: org.id,
    name: org.name,
    tier: org.tier,
    credits_usd: formatUsd(org.creditsMicros),
    free_grant_usd: formatUsd(org.freeGrantMicros),
    spend_total_usd: formatUsd(org.spendTotalMicros),
    month: org.month,
    month_spend_usd: formatUsd(org.monthSpendMicros),
    balance_usd: formatUsd(org.balanceMicros),
    own_cap_usd: org.ownCapMicros === undefined ? null : formatUsd(org.ownCapMicros),
    cap_usd: org.effectiveCapMicros === undefined ? null : formatUsd(org.effectiveCapMicros),
    blocked: org.blocked,
    blocked_reason: org.blockedReason || null,
    role: org.role,
    created_at: org.createdAt,
  };
}

function printOrg(out: Out, org: Org): void {
  const j = orgJson(org);
  if (out.json) {
    printJson(out, j);
    return;
  }
  out.write(formatFields([
    ['id', org.id],
    ['name', org.name],
    ['tier', org.tier],
    ['role', org.role],
    ['credits_usd', j.credits_usd as string],
    ['free_grant_usd', j.free_grant_usd as string],
    ['spend_total_usd', j.spend_total_usd as string],
    ['balance_usd', j.balance_usd as string],
    ['month', org.month],
    ['month_spend_usd', j.month_spend_usd as string],
    ['own_cap_usd', (j.own_cap_usd as string | null) ?? 'none'],
    ['cap_usd', (j.cap_usd as string | null) ?? 'none'],
    ['blocked', org.blocked ? `yes (${org.blockedReason || 'unknown reason'})` : 'no'],
    ['created_at', org.createdAt],
  ]));
}

const ORG_ARG = ['ORG'];

export const orgCommands: Command[] = [
  {
    name: 'org create',
    summary: 'Create an organisation. The operator names its owner; an account becomes the owner itself.',
    synopsis: '--name NAME [--owner ACCOUNT_ID] [--tier free|paid]',
    options: {
      name: { type: 'string', value: 'NAME', help: "the organisation's name" },
      owner: { type: 'string', value: 'ACCOUNT_ID', help: 'the account that becomes its owner (required with the operator token; default: you)' },
      tier: { type: 'string', value: 'TIER', help: "the tier (default: the config's default tier; another tier needs the operator)" },
    },
    async run(ctx, args) {
      const name = requireString(args, 'name', ctx.usage);
      const org = await ctx.client().createOrg({ name, ownerAccountId: optionalString(args, 'owner') ?? '', tier: optionalString(args, 'tier') ?? '' });
      printOrg(ctx.out, org);
    },
  },
  {
    name: 'org list',
    summary: 'List the organisations you can see (the operator sees all).',
    synopsis: '',
    async run(ctx) {
      const res = await ctx.client().listOrgs();
      if (ctx.out.json) {
        printJson(ctx.out, { orgs: res.orgs.map(orgJson) });
        return;
      }
      ctx.out.write(formatTable(
        ['id', 'name', 'tier', 'role', 'balance_usd', 'month_spend_usd', 'cap_usd', 'blocked'],
        res.orgs.map((o) => {
          const j = orgJson(o);
          return [o.id, o.name, o.tier, o.role, j.balance_usd as string, j.month_spend_usd as string, (j.cap_usd as string | null) ?? 'none', o.blocked ? o.blockedReason || 'yes' : 'no'];
        }),
      ));
    },
  },
  {
    name: 'org show',
    summary: "Show an organisation: tier, credits, spend, balance, caps and whether it is blocked.",
    synopsis: 'ORG',
    positionals: ORG_ARG,
    async run(ctx, args) {
      printOrg(ctx.out, await ctx.client().getOrg({ orgId: args.positionals[0] }));
    },
  },
  {
    name: 'org set-tier',
    summary: "Change an organisation's tier (operator only). Existing keys keep their limits.",
    synopsis: 'ORG --tier TIER',
    positionals: ORG_ARG,
    options: { tier: { type: 'string', value: 'TIER', help: 'the new tier, e.g. free or paid' } },
    async run(ctx, args) {
      const tier = requireString(args, 'tier', ctx.usage);
      printOrg(ctx.out, await ctx.client().setOrgTier({ orgId: args.positionals[0], tier }));
    },
  },
  {
    name: 'org credit',
    summary: 'Add credits to an organisation (operator only).',
    synopsis: 'ORG --usd AMOUNT [--note TEXT]',
    positionals: ORG_ARG,
    options: {
      usd: { type: 'string', value: 'AMOUNT', help: 'the amount in USD, e.g. 25 or 12.50 (must be positive)' },
      note: { type: 'string', value: 'TEXT', help: 'a note kept with the credit' },
    },
    async run(ctx, args) {
      const amountMicros = usdFlag(args, 'usd', ctx.usage);
      const org = await ctx.client().creditOrg({ orgId: args.positionals[0], amountMicros, note: optionalString(args, 'note') ?? '' });
      printOrg(ctx.out, org);
    },
  },
  {
    name: 'org set-cap',
    summary: "Set or clear an organisation's own monthly spend cap (admin or above).",
    synopsis: 'ORG --usd AMOUNT | --clear',
    positionals: ORG_ARG,
    options: {
      usd: { type: 'string', value: 'AMOUNT', help: 'the monthly cap in USD' },
      clear: { type: 'boolean', help: "remove the organisation's own cap (the tier's cap applies again)" },
    },
    async run(ctx, args) {
      const clear = args.values.clear === true;
      const hasUsd = args.values.usd !== undefined;
      if (clear === hasUsd) throw usageError('give exactly one of --usd AMOUNT or --clear', ctx.usage);
      const capMicros = clear ? undefined : usdFlag(args, 'usd', ctx.usage);
      printOrg(ctx.out, await ctx.client().setOrgCap({ orgId: args.positionals[0], capMicros }));
    },
  },
  {
    name: 'org set-key-policy',
    summary: "Set or clear the longest lifetime of keys created later in an organisation (admin or above).",
    synopsis: 'ORG --max-lifetime DURATION | --clear',
    positionals: ORG_ARG,
    options: {
      'max-lifetime': { type: 'string', value: 'DURATION', help: `keys created later must expire within ${DURATION_HELP}; without --expires-in they get exactly this` },
      clear: { type: 'boolean', help: 'remove the policy (keys may again be created without an expiry)' },
    },
    notes: ['Keys that exist keep their expiry (or none).'],
    async run(ctx, args) {
      const clear = args.values.clear === true;
      const text = optionalString(args, 'max-lifetime');
      if (clear === (text !== undefined)) throw usageError('give exactly one of --max-lifetime DURATION or --clear', ctx.usage);
      const maxLifetimeSec = text === undefined ? 0 : parseDurationSec(text);
      if (maxLifetimeSec === null) throw usageError(`--max-lifetime must be ${DURATION_HELP}, got ${JSON.stringify(text)}`, ctx.usage);
      const p = await ctx.client().setKeyPolicy({ orgId: args.positionals[0], maxLifetimeSec, clear });
      const out = { org_id: p.orgId, max_lifetime_sec: p.maxLifetimeSec || null };
      if (ctx.out.json) printJson(ctx.out, out);
      else ctx.out.write(formatFields([['org', p.orgId], ['max_key_lifetime', p.maxLifetimeSec ? `${p.maxLifetimeSec} s` : 'none']]));
    },
  },
];
