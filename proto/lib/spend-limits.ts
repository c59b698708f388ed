// Money pools below the organisation (docs/money-limits.md): a project's monthly cap and a key's own
// limit are leased exactly as an organisation's money is, through the same money leases. A pool is
// named by a string: an organisation's pool by its id (as before), one period of a project's or a
// key's limit by "project:ID@START" / "key:ID@START", START being the period's first ms (0 for a
// limit that never resets). So the lease protocol and ledgers carry all three kinds unchanged, and a
// new period is a new pool: nothing leased or owed in the last one counts against it. Pure helpers
// shared by the control plane and the nodes.
import { formatUsd } from './money.js';

export type LimitReset = 'daily' | 'weekly' | 'monthly' | 'never';
export const LIMIT_RESETS: readonly LimitReset[] = ['daily', 'weekly', 'monthly', 'never'];

const PROJECT = 'project:';
const KEY = 'key:';

/** A project's pool for the month starting at `monthStartMs`. */
export function projectPoolId(projectId: string, monthStartMs: number): string {
  return `${PROJECT}${projectId}@${monthStartMs}`;
}

/** What every pool id of a project starts with. */
export function projectPoolPrefix(projectId: string): string {
  return `${PROJECT}${projectId}@`;
}

/** A key's pool for the period starting at `periodStartMs` (0: a limit that never resets). */
export function keyPoolId(keyId: string, periodStartMs: number): string {
  return `${KEY}${keyId}@${periodStartMs}`;
}

/** A project's or key's pool (not an organisation's). */
export function isLimitPool(poolId: string): boolean {
  return poolId.startsWith(PROJECT) || poolId.startsWith(KEY);
}

/** What a pool id names: an organisation (no prefix), or a project's or key's period. */
export function poolOf(poolId: string): { kind: 'org' | 'project' | 'key'; id: string; periodStart: number } {
  const kind = poolId.startsWith(PROJECT) ? 'project' : poolId.startsWith(KEY) ? 'key' : 'org';
  if (kind === 'org') return { kind, id: poolId, periodStart: 0 };
  const at = poolId.lastIndexOf('@');
  const prefix = kind === 'project' ? PROJECT.length : KEY.length;
  if (at < prefix) return { kind, id: poolId.slice(prefix), periodStart: 0 };
  const start = Number(poolId.slice(at + 1));
  return { kind, id: poolId.slice(prefix, at), periodStart: Number.isSafeInteger(start) && start >= 0 ? start : 0 };
}

export function isLimitReset(s: string): s is LimitReset {
  return (LIMIT_RESETS as readonly string[]).includes(s);
}

/** The start (ms, UTC) of the period `ms` falls in; 0 for "never". Weeks start on Monday. */
export function periodStartMs(reset: LimitReset, ms: number): number {
  const d = new Date(ms);
  const day = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate());
  switch (reset) {
    case 'daily':
      return day;
    case 'weekly':
      return day - ((d.getUTCDay() + 6) % 7) * 86_400_000;
    case 'monthly':
      return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
    default:
      return 0;
  }
}

/** When the period `ms` falls in ends (ms, UTC); Infinity for "never". */
export function periodEndMs(reset: LimitReset, ms: number): number {
  const start = periodStartMs(reset, ms);
  switch (reset) {
    case 'daily':
      return start + 86_400_000;
    case 'weekly':
      return start + 7 * 86_400_000;
    case 'monthly': {
      const d = new Date(start);
      return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
    }
    default:
      return Infinity;
  }
}

/** A key limit's reset as stored ('' on keys without a limit): anything unknown is "never". */
export function limitResetOf(s: string | undefined): LimitReset {
  return s !== undefined && isLimitReset(s) ? s : 'never';
}

/** An instant as RFC 3339 in UTC, whole seconds. */
function instant(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

const PER: Record<LimitReset, string> = { daily: 'day', weekly: 'week', monthly: 'month', never: '' };

/** The same refusals, short enough for a WebSocket close reason (123 bytes, with "insufficient_quota: "). */
export function keyLimitShort(limitMicros: number, reset: LimitReset, nowMs: number): string {
  if (reset === 'never') return `the key's spend limit ($${formatUsd(limitMicros)}) was reached; it never resets`;
  return `the key's spend limit ($${formatUsd(limitMicros)}/${PER[reset]}) was reached; it resets at ${instant(periodEndMs(reset, nowMs))}`;
}

export function projectCapShort(capMicros: number, nowMs: number): string {
  return `the project's monthly spend cap ($${formatUsd(capMicros)}) was reached; until ${instant(periodEndMs('monthly', nowMs))}`;
}

/** The refusal of a request over its key's own limit, naming the limit and when it lifts. */
export function keyLimitMessage(limitMicros: number, reset: LimitReset, nowMs: number): string {
  const base = `This API key's spend limit of $${formatUsd(limitMicros)}`;
  if (reset === 'never') return `${base} was reached; it never resets: use another key.`;
  return `${base} per ${PER[reset]} was reached; requests are refused until it resets at ${instant(periodEndMs(reset, nowMs))}.`;
}

/** The refusal of a request over its project's monthly cap, naming the cap and when it lifts. */
export function projectCapMessage(capMicros: number, nowMs: number): string {
  return `The project's monthly spend cap of $${formatUsd(capMicros)} was reached; requests are refused until ${instant(periodEndMs('monthly', nowMs))} (the next UTC month) or until the cap is raised.`;
}

/** The pool a worst-case refusal names: the organisation's money, a key's limit or a project's cap. */
export type WorstCasePool = 'org' | { keyLimitMicros: number; reset: LimitReset } | { projectCapMicros: number };

function poolPhrase(p: WorstCasePool): string {
  if (p === 'org') return "the organisation's balance and monthly spend cap";
  if ('keyLimitMicros' in p) return `this API key's spend limit of $${formatUsd(p.keyLimitMicros)}${p.reset === 'never' ? '' : ` per ${PER[p.reset]}`}`;
  return `the project's monthly spend cap of $${formatUsd(p.projectCapMicros)}`;
}

/**
 * The refusal of a request whose worst case (its input and the most output it allows) does not fit
 * in what is left of a pool, saying how much output would (as OpenRouter's "can only afford").
 */
export function worstCaseMessage(p: WorstCasePool, requestedTokens: number, affordableTokens: number, field: string): string {
  return `This request requires more than is left of ${poolPhrase(p)}, or fewer ${field}: you requested up to ${requestedTokens} output tokens, but can only afford ${affordableTokens}.`;
}

/** The same, short enough for a WebSocket close reason. */
export function worstCaseShort(p: WorstCasePool, requestedTokens: number, affordableTokens: number): string {
  const what = p === 'org' ? "the organisation's money" : 'keyLimitMicros' in p ? "the key's spend limit" : "the project's cap";
  return `${what} leaves too little: can only afford ${affordableTokens} of ${requestedTokens} output tokens`;
}
