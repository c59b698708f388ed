// A request's money (docs/money-limits.md): it must be covered by every money pool it touches, its
// organisation's always, its project's when the project has a monthly cap, its key's when the key has
// its own limit, and its cost is charged to each. Each pool is leased through the same money slices
// (LeaseClient canSpend/reserveSpend/settleSpend, by pool id), so a project cap and a key limit are
// exact across nodes as an organisation's money is. A key or project without a limit touches only its
// organisation's pool: nothing more on the request path. Once a request's body is read its
// reservation in each pool is raised to its worst case (reserveWorstCase, worst-case.ts).
import type { KeyRecord, LimitPeriod } from '../state/key-table.js';
import { GatewayError } from '../errors.js';
import { keyLimitMessage, keyLimitShort, keyPoolId, periodEndMs, periodStartMs, projectCapMessage, projectCapShort, projectPoolId, worstCaseMessage, worstCaseShort, type LimitReset } from '../../proto/lib/spend-limits.js';
import type { LeaseClient } from './lease-client.js';
import type { SpendReservation, SpendVerdict } from './lease-money.js';
import { affordableOutputTokens, type WorstCase } from '../limits/worst-case.js';

export type MoneyVerdict =
  | { verdict: 'yes' }
  /** `pool`: the pool whose slice is on its way. */
  | { verdict: 'wait'; pool: string }
  /** `pool`: '' for the organisation (its own refusal text), else the project's or key's, with `message`. */
  | { verdict: 'no'; pool: string; message: string; short: string };

const YES: MoneyVerdict = { verdict: 'yes' };

/**
 * The pools besides its organisation's that a key's requests touch now (null for most keys): the
 * current month's of its project's cap, the current period's of its own limit. A period that ended
 * gives its pool back here (LeaseClient.dropPool) and starts a new one: nothing leased or owed in
 * the last period counts against the new one.
 */
export function extraPools(leases: LeaseClient, key: KeyRecord, nowMs: number): string[] | null {
  const project = key.project && key.project.capMicros > 0 ? key.project : null;
  const limit = key.moneyLimit ?? null;
  if (project === null && limit === null) return null;
  const out: string[] = [];
  if (project) out.push(current(leases, project.pool, 'monthly', nowMs, (start) => projectPoolId(project.projectId, start)));
  if (limit) out.push(current(leases, limit.pool, limit.reset, nowMs, (start) => keyPoolId(limit.keyId, start)));
  return out;
}

function current(leases: LeaseClient, p: LimitPeriod, reset: LimitReset, nowMs: number, idOf: (start: number) => string): string {
  if (p.id !== '' && nowMs >= p.start && nowMs < p.end) return p.id;
  const start = periodStartMs(reset, nowMs);
  const id = idOf(start);
  if (p.id !== '' && p.id !== id) leases.dropPool(p.id);
  p.id = id;
  p.start = start;
  p.end = periodEndMs(reset, nowMs);
  return id;
}

/**
 * May a request of the key spend now? The organisation's verdict as before (`org`: the caller already
 * asked it, e.g. with spendFirst), then the project's cap and the key's limit. A pool the control
 * plane said is spent refuses the request, named in the message with when it lifts. When the
 * organisation's pool and a key's limit or project's cap both refuse, the limit is named: requests in
 * flight at its margin hold the rest of both (an unpriced request's worst case is far above a small
 * limit), and the organisation's balance may be far from spent (docs/money-limits.md#the-last-request).
 */
export function moneyVerdict(leases: LeaseClient, key: KeyRecord, nowMs: number, org: SpendVerdict = leases.canSpend(key.orgId)): MoneyVerdict {
  if (org === 'no') return orgRefusal(leases, key, nowMs);
  const extra = extraPools(leases, key, nowMs);
  let wait: string | null = org === 'wait' ? key.orgId : null;
  if (extra) {
    for (const pool of extra) {
      const v = leases.canSpend(pool);
      if (v === 'no') return refusalOf(key, pool, nowMs);
      if (v === 'wait' && wait === null) wait = pool;
    }
  }
  return wait === null ? YES : { verdict: 'wait', pool: wait };
}

/** The refusal of a request whose organisation's pool said no: a limit of the key's that says no too is named (moneyVerdict). */
export function orgRefusal(leases: LeaseClient, key: KeyRecord, nowMs: number): MoneyVerdict & { verdict: 'no' } {
  const extra = extraPools(leases, key, nowMs);
  if (extra) for (const pool of extra) if (leases.canSpend(pool) === 'no') return refusalOf(key, pool, nowMs);
  return { verdict: 'no', pool: '', message: '', short: '' };
}

function refusalOf(key: KeyRecord, pool: string, nowMs: number): MoneyVerdict & { verdict: 'no' } {
  const l = key.moneyLimit;
  if (l && pool === l.pool.id) return { verdict: 'no', pool, message: keyLimitMessage(l.micros, l.reset, nowMs), short: keyLimitShort(l.micros, l.reset, nowMs) };
  const cap = key.project?.capMicros ?? 0;
  return { verdict: 'no', pool, message: projectCapMessage(cap, nowMs), short: projectCapShort(cap, nowMs) };
}

/** The fast path's question: may the request spend without waiting (the organisation's first request included)? */
export function maySpendNow(leases: LeaseClient, key: KeyRecord, nowMs: number): boolean {
  if (!(leases.spendFirst(key.orgId) || leases.canSpend(key.orgId) === 'yes')) return false;
  const extra = extraPools(leases, key, nowMs);
  if (extra) for (const pool of extra) if (leases.canSpend(pool) !== 'yes') return false;
  return true;
}

/**
 * Out of time with a pool's slice on its way (moneyVerdict `wait`): the pool that may not be taken in
 * advance of its answer now (LeaseClient.mayAdvance: this node took what the control plane said it
 * may), or null: admitted, reserveMoney `inAdvance`.
 */
export function advanceRefusedBy(leases: LeaseClient, key: KeyRecord, nowMs: number): string | null {
  if (!leases.mayAdvance(key.orgId)) return key.orgId;
  const extra = extraPools(leases, key, nowMs);
  if (extra) for (const pool of extra) if (!leases.mayAdvance(pool)) return pool;
  return null;
}

/**
 * Reserves the request's estimate from each of its pools (settled together by LeaseClient.settleSpend);
 * `inAdvance`: admitted out of time, in advance of a pool's answer (advanceRefusedBy said none refuses).
 */
export function reserveMoney(leases: LeaseClient | undefined, key: KeyRecord, nowMs: number, inAdvance = false): SpendReservation | undefined {
  if (!leases) return undefined;
  const r = leases.reserveSpend(key.orgId, inAdvance);
  const extra = extraPools(leases, key, nowMs);
  if (!extra) return r;
  const parts: Array<[string, SpendReservation]> = [];
  for (const pool of extra) {
    const e = leases.reserveSpend(pool, inAdvance);
    if (e) parts.push([pool, e]);
  }
  if (parts.length === 0) return r;
  const out = r ?? { epoch: parts[0][1].epoch, micros: 0 };
  out.extra = parts;
  return out;
}

/**
 * Raises a request's reservation in each of its pools to its worst case, known once its body is read
 * (worst-case.ts requestWorstCase; docs/money-limits.md#the-last-request). `yes`: reserved in every
 * pool. `wait`: a pool's slice is short and its shortfall was asked for, as the need (the control
 * plane reclaims from the other nodes before it says the pool has no more): wait for it
 * (waitForMoney) and call again. `no`: a pool has less left than the worst case (an unpriced request:
 * nothing left), with its usual refusal, naming the output tokens that would fit. `final`: out of
 * time with no answer: reserved in advance of it, as admission does, within what the control plane
 * said may be (else `wait`, for the answer); `silent`: later than a reclaim may take: reserved.
 */
export function reserveWorstCase(leases: LeaseClient | undefined, key: KeyRecord, reservation: SpendReservation | undefined, worst: WorstCase, nowMs: number, final = false, silent = false): MoneyVerdict {
  if (!leases || !reservation) return YES;
  const v = leases.raiseSpend(key.orgId, reservation, worst.micros, !worst.priced, final, silent);
  if (v.verdict === 'no') return worstCaseRefusal(key, key.orgId, worst, v.leftMicros, nowMs);
  let wait: string | null = v.verdict === 'wait' ? key.orgId : null;
  // (Most keys have neither a project cap nor a limit of their own: no more pools.)
  if (reservation.extra) {
    for (const [pool, r] of reservation.extra) {
      const e = leases.raiseSpend(pool, r, worst.micros, !worst.priced, final, silent);
      if (e.verdict === 'no') return worstCaseRefusal(key, pool, worst, e.leftMicros, nowMs);
      if (e.verdict === 'wait' && wait === null) wait = pool;
    }
  }
  return wait === null ? YES : { verdict: 'wait', pool: wait };
}

function worstCaseRefusal(key: KeyRecord, pool: string, worst: WorstCase, leftMicros: number, nowMs: number): MoneyVerdict {
  const ordinary = pool === key.orgId ? { verdict: 'no' as const, pool: '', message: '', short: '' } : refusalOf(key, pool, nowMs);
  // Unpriced, refused only with nothing left: the pool's ordinary refusal.
  if (!worst.priced) return ordinary;
  const fits = affordableOutputTokens(worst, leftMicros);
  const l = key.moneyLimit;
  const what = pool === key.orgId ? 'org' : l && pool === l.pool.id ? { keyLimitMicros: l.micros, reset: l.reset } : { projectCapMicros: key.project?.capMicros ?? 0 };
  return { verdict: 'no', pool: ordinary.pool, message: worstCaseMessage(what, worst.outputTokens, fits, worst.field), short: worstCaseShort(what, worst.outputTokens, fits) };
}

/** Waits for the pool the verdict named (true: `wake` is called once its grant comes). */
export function waitForMoney(leases: LeaseClient, pool: string, wake: () => void): boolean {
  return leases.waitForOrg(pool, wake);
}

export function cancelMoneyWait(leases: LeaseClient, key: KeyRecord, wake: () => void): void {
  leases.cancelOrgWait(key.orgId, wake);
  if (key.project?.pool.id) leases.cancelOrgWait(key.project.pool.id, wake);
  if (key.moneyLimit?.pool.id) leases.cancelOrgWait(key.moneyLimit.pool.id, wake);
}

/** The refusal of a request whose money is spent: 401 `insufficient_quota`, naming the pool that refused. */
export function moneyRefusal(v: { pool: string; message: string }, orgMessage?: string): GatewayError {
  if (v.pool === '') return new GatewayError('ORG_BLOCKED', orgMessage ?? (v.message || undefined));
  return new GatewayError('SPEND_LIMIT_REACHED', v.message);
}
