// Organisation money on the node's side of leases (docs/design.md#money-and-limits-across-nodes).
//
// Per money pool (an organisation, or a project's or key's period: proto/lib/spend-limits.ts) the node holds a
// signed slice, kept with the same arithmetic as the control plane's ledger: grants add, returns and
// finished requests' costs subtract. A request is admitted when the slice covers its estimated cost
// (the costliest request of the pool seen here) and reserves it while in flight; once its body is read
// the reservation is raised to its worst case (raiseSpend). A slice that does not cover it asks for
// what the request needs, and the request waits: the control plane reclaims the other nodes' unused
// money first, and what is left after that comes as the last of the pool ("exhausted"): a request
// whose worst case fits may spend it, one that cannot be priced takes all of it, others are refused.
// So no request is refused while its worst case could be paid, and the spend passes the limit by at
// most one request per node (docs/money-limits.md#the-last-request). Slices are refilled ahead of need
// from free money only, never from another node. A credit, cap or config change gives the slice
// back and asks afresh, so a lowered cap binds at once and a raised one unblocks at once.
import type { OrgLeaseReturn, OrgLeaseWant } from '../../proto/gen/tollgate/v1/sync.js';
import { wake, type LeaseLink } from './lease-link.js';
import { isLimitPool } from '../../proto/lib/spend-limits.js';

export interface OrgSlice {
  /** Granted, minus returned, minus the cost of finished requests and the estimates of those in flight. */
  sliceMicros: number;
  lastGrantMicros: number;
  /** The most one request of the organisation has cost on this node: the estimate reserved per request. */
  maxCostMicros: number;
  /** The largest worst case a request reserved here (raiseSpend): what refills are sized for, with maxCostMicros. */
  maxWorstMicros: number;
  /**
   * What the requests in flight on this connection hold reserved: refills ahead of need are sized to
   * cover it, so that away from a limit the raise to a worst case finds it in the slice and never waits.
   */
  reservedMicros: number;
  /** spendFirst admitted a request before the first slice: its reservation is marked `first`. */
  firstOpen: boolean;
  pending: boolean;
  askedAtMs: number;
  /** The want on its way (pending) was made for a waiting request. */
  neededAsk: boolean;
  /** The last want made ahead of need found nothing free: none again until money comes or a request needs it. */
  dry: boolean;
  /** When the control plane last said nothing is left (0: it did not). */
  exhaustedAtMs: number;
  /**
   * What the control plane said, with its last answer, this node may take in advance of a late one
   * (OrgLease.advance_micros; docs/leases.md "When the control plane answers late"). null: no bound,
   * every request out of time is taken: an organisation's balance with no answer yet on this
   * connection, or a pool whose control plane answers without it (older). A key's limit or a
   * project's cap with no answer yet: 0, so one request is taken and the others wait for the first.
   */
  advanceMicros: number | null;
  /** Taken past the slice in advance of the answer on its way (what advanceMicros bounds). */
  advancedMicros: number;
  /** The one request let past advanceMicros before the answer comes (its own raise passes too). */
  extraBy: SpendReservation | null;
  waiters: Array<() => void>;
}

/** What a slice is sized for: the costliest request seen, or the largest worst case reserved. */
function unitOf(o: OrgSlice): number {
  return Math.max(o.maxCostMicros, o.maxWorstMicros);
}

/** What a refill ahead of need asks for beyond a debt: a few units, or what is in flight if more. */
function aheadOf(o: OrgSlice): number {
  return Math.max(4 * unitOf(o), o.reservedMicros);
}

/** May `past` (µ$ past the slice) be taken in advance of the answer, for reservation `r`? */
function mayTake(o: OrgSlice, past: number, r: SpendReservation | null): boolean {
  if (past <= 0 || o.advanceMicros === null || o.advancedMicros + past <= o.advanceMicros) return true;
  // Past what was said: one request more (whose own later raise passes too).
  return o.extraBy === null || o.extraBy === r;
}

function take(o: OrgSlice, past: number, r: SpendReservation): void {
  if (o.advanceMicros !== null && o.advancedMicros + past > o.advanceMicros && o.extraBy === null) o.extraBy = r;
  o.advancedMicros += past;
}

/**
 * An answer came: what is taken in advance of the next one counts afresh, but for what this one left
 * owed (its allowance was decided before the control plane heard of it). Money granted without an
 * allowance comes from a control plane that never says one (older): no bound, as before. (This one
 * says it with every grant; only its answers of nothing, e.g. a failed read, come without.)
 */
function answered(o: OrgSlice, grantedMicros: number, advanceMicros: number | undefined): void {
  o.advancedMicros = Math.min(o.advancedMicros, Math.max(0, -o.sliceMicros));
  o.extraBy = null;
  if (advanceMicros !== undefined) o.advanceMicros = advanceMicros;
  else if (grantedMicros > 0) o.advanceMicros = null;
}

/** After "nothing left", ask again at most this often (a credit or cap change asks at once). */
const EXHAUSTED_RETRY_MS = 1000;

/** An estimate reserved from an organisation's slice while its request is in flight. */
export interface SpendReservation {
  epoch: number;
  micros: number;
  /** The same request's reservations from its project's and key's pools (request-money.ts), settled with it. */
  extra?: Array<[pool: string, reservation: SpendReservation]>;
  /** Admitted by spendFirst before the pool's first slice came: raised to its worst case without waiting for it. */
  first?: boolean;
}

/** raiseSpend's answer; `no`: the pool has no more, and `leftMicros` is what this request could have of it. */
export type RaiseVerdict = { verdict: 'yes' } | { verdict: 'wait' } | { verdict: 'no'; leftMicros: number };
const RAISED: RaiseVerdict = { verdict: 'yes' };
const WAIT: RaiseVerdict = { verdict: 'wait' };

/** May a request of the organisation spend? `wait`: a slice is being asked for. */
export type SpendVerdict = 'yes' | 'wait' | 'no';

/** The organisations' money slices this node holds (LeaseClient delegates to it). */
export class LeaseMoney {
  private readonly orgs = new Map<string, OrgSlice>();

  constructor(private readonly link: LeaseLink) {}

  /** May this node admit one more request of the organisation now? */
  canSpend(orgId: string): SpendVerdict {
    if (!this.link.connected) return 'yes';
    const o = this.orgFor(orgId);
    if (o.sliceMicros > 0 && o.sliceMicros >= o.maxCostMicros) return 'yes';
    // The control plane said this is the last of the pool: spent while it lasts, then refused.
    if (o.exhaustedAtMs > 0 && this.link.clock.now() - o.exhaustedAtMs < EXHAUSTED_RETRY_MS) return o.sliceMicros > 0 ? 'yes' : 'no';
    o.exhaustedAtMs = 0;
    this.askOrg(orgId, o, true);
    return 'wait';
  }

  /**
   * The organisation's first request on this connection (with standing shares on): true, and the
   * first slice is asked for. It is admitted without waiting for it: one request in flight past what
   * is left at most, once per organisation and connection (an organisation blocked in the snapshot
   * never gets here). docs/leases.md.
   */
  spendFirst(orgId: string): boolean {
    if (!this.link.standingShares || !this.link.connected || this.link.leaving || this.orgs.has(orgId)) return false;
    const o = this.orgFor(orgId);
    o.firstOpen = true;
    this.askOrg(orgId, o, false);
    return true;
  }

  /**
   * Money slices of every organisation with money left, granted in bulk once per connection (asked
   * with the slot shares): each adds to the organisation's slice, as a grant does.
   */
  applyOrgSlices(slices: Array<{ orgId: string; micros: number; advanceMicros?: number }>): void {
    if (!this.link.connected) return;
    if (this.link.leaving) {
      const orgReturns = slices.filter((o) => o.micros > 0).map((o) => ({ orgId: o.orgId, micros: o.micros }));
      if (orgReturns.length > 0) this.link.flush({ reclaimId: 0, keyReturns: [], orgReturns });
      return;
    }
    for (const { orgId, micros, advanceMicros } of slices) {
      if (micros <= 0) continue;
      const o = this.orgFor(orgId);
      o.sliceMicros += micros;
      o.lastGrantMicros = micros;
      o.exhaustedAtMs = 0;
      o.dry = false;
      answered(o, micros, advanceMicros);
      wake(o);
    }
  }

  /** Calls `wake` once when the organisation's next grant came (or the connection changed). */
  waitForOrg(orgId: string, wake: () => void): boolean {
    if (!this.link.connected) return false;
    const o = this.orgFor(orgId);
    o.waiters.push(wake);
    this.askOrg(orgId, o, true);
    return true;
  }

  /**
   * Sets a request's reservation from a pool to `micros`, its worst case once its body is known
   * (docs/money-limits.md#the-last-request). Covered by the slice: taken (or the excess given back).
   * Short, and the control plane has not said this is the last of the pool: the shortfall is asked
   * for, as the need, and the caller waits (waitForOrg) and asks again. Short at the last of the pool
   * (exhausted): `no`, unless `unpriced` (the request's output has no known bound), which takes all
   * that is left, so the next one finds nothing. `final`: out of time with no answer: taken, in advance
   * of it, as admission does, within what the control plane said may be (mayAdvance), else `wait`;
   * `silent`: the answer is later than a reclaim may take: taken whatever was said.
   */
  raiseSpend(poolId: string, r: SpendReservation, micros: number, unpriced: boolean, final: boolean, silent = false): RaiseVerdict {
    const o = this.orgs.get(poolId);
    if (!o || !this.link.connected || r.epoch !== this.link.epoch) return RAISED;
    const delta = micros - r.micros;
    if (micros > o.maxWorstMicros) o.maxWorstMicros = micros;
    const exhausted = o.exhaustedAtMs > 0 && this.link.clock.now() - o.exhaustedAtMs < EXHAUSTED_RETRY_MS;
    // Admitted by spendFirst, its first slice still on its way: one request past what is left at most.
    const first = r.first === true && o.lastGrantMicros === 0 && !exhausted;
    const past = delta - Math.max(0, o.sliceMicros);
    const late = final && !exhausted && (silent || mayTake(o, past, r));
    if (delta <= 0 || delta <= o.sliceMicros || first || late) {
      if (late && !first && past > 0) take(o, past, r);
      o.sliceMicros -= delta;
      o.reservedMicros += delta;
      r.micros = micros;
      this.maybeAskOrg(poolId, o);
      return RAISED;
    }
    if (exhausted) {
      if (!unpriced) return { verdict: 'no', leftMicros: r.micros + Math.max(0, o.sliceMicros) };
      if (o.sliceMicros > 0) {
        r.micros += o.sliceMicros;
        o.reservedMicros += o.sliceMicros;
        o.sliceMicros = 0;
      }
      return r.micros > 0 ? RAISED : { verdict: 'no', leftMicros: 0 };
    }
    this.askOrg(poolId, o, true, delta - o.sliceMicros);
    return WAIT;
  }

  cancelOrgWait(orgId: string, wake: () => void): void {
    const o = this.orgs.get(orgId);
    if (o) o.waiters = o.waiters.filter((w) => w !== wake);
  }

  private orgFor(orgId: string): OrgSlice {
    let o = this.orgs.get(orgId);
    if (!o) {
      o = { sliceMicros: 0, lastGrantMicros: 0, maxCostMicros: 0, maxWorstMicros: 0, reservedMicros: 0, firstOpen: false, pending: false, neededAsk: false, askedAtMs: 0, dry: false, exhaustedAtMs: 0, advanceMicros: isLimitPool(orgId) ? 0 : null, advancedMicros: 0, extraBy: null, waiters: [] };
      this.orgs.set(orgId, o);
    }
    return o;
  }

  /**
   * Reserves the estimated cost of an admitted request (the most a request of the organisation has
   * cost here) from the slice, so the next slice is asked for while this request runs rather than
   * after it: the grant is normally back before the next request needs it. `inAdvance`: admitted out
   * of time with the slice on its way (mayAdvance said yes): what it takes past the slice is counted.
   */
  reserveSpend(orgId: string, inAdvance = false): SpendReservation | undefined {
    const o = this.orgs.get(orgId);
    if (!o || !this.link.connected) return undefined;
    const past = o.maxCostMicros - Math.max(0, o.sliceMicros);
    o.sliceMicros -= o.maxCostMicros;
    o.reservedMicros += o.maxCostMicros;
    this.maybeAskOrg(orgId, o);
    const r: SpendReservation = { epoch: this.link.epoch, micros: o.maxCostMicros };
    if (o.firstOpen) {
      o.firstOpen = false;
      r.first = true;
    }
    if (inAdvance && past > 0) take(o, past, r);
    return r;
  }

  /**
   * May a request out of time, its pool's slice on its way, be admitted in advance of the answer
   * (docs/leases.md "When the control plane answers late")? Yes while what this node took in advance
   * of it stays within what the control plane last said it may take, then for one request more; the
   * others wait for the answer. So near a limit a burst passes it by one request per node at most,
   * and far from one a silent control plane still lets requests in after the bound.
   */
  mayAdvance(poolId: string): boolean {
    const o = this.orgs.get(poolId);
    if (!o || !this.link.connected) return true;
    return mayTake(o, o.maxCostMicros - Math.max(0, o.sliceMicros), null);
  }

  /** What is left of an organisation's slice on this node (undefined before its first request). For tests and metrics. */
  sliceOf(orgId: string): number | undefined {
    return this.orgs.get(orgId)?.sliceMicros;
  }

  /**
   * The real cost of a finished request replaces its reservation (0 for a request that never ran).
   * A request reserved on an earlier connection (or none) costs nothing here: its usage record carries
   * that epoch and the control plane does not take it from this connection's slice either.
   */
  settleSpend(orgId: string, reservation: SpendReservation | undefined, costMicros: number): void {
    // (A pool dropped since, its period over, is not made again.)
    if (reservation?.extra) for (const [pool, r] of reservation.extra) if (this.orgs.has(pool)) this.settleSpend(pool, r, costMicros);
    if (!this.link.connected || !reservation || reservation.epoch !== this.link.epoch) return;
    const o = this.orgFor(orgId);
    o.sliceMicros += reservation.micros - costMicros;
    o.reservedMicros = Math.max(0, o.reservedMicros - reservation.micros);
    if (costMicros > o.maxCostMicros) o.maxCostMicros = costMicros;
    this.maybeAskOrg(orgId, o);
  }

  /** Refills a slice running low ahead of need (from free money only). */
  private maybeAskOrg(orgId: string, o: OrgSlice): void {
    if (o.exhaustedAtMs === 0 && !o.dry && o.sliceMicros <= Math.max(o.lastGrantMicros / 2, 2 * unitOf(o), o.reservedMicros / 2)) this.askOrg(orgId, o, false);
  }

  /** The answer to a want; `advanceMicros`: what may be taken in advance of the next (absent: as said before). */
  applyOrgGrant(orgId: string, micros: number, exhausted: boolean, advanceMicros?: number): void {
    if (this.link.leaving) {
      if (micros > 0) this.link.flush({ reclaimId: 0, keyReturns: [], orgReturns: [{ orgId, micros }] });
      return;
    }
    const o = this.orgs.get(orgId);
    if (!o) return;
    o.pending = false;
    o.sliceMicros += micros;
    if (micros > 0) o.lastGrantMicros = micros;
    answered(o, micros, advanceMicros);
    // Nothing granted to a want made ahead of need: none again until it is needed.
    o.dry = micros <= 0 && o.neededAsk === false;
    // Nothing granted without "exhausted" (nothing free ahead of need, or the control plane failed
    // to answer): not a refusal.
    o.exhaustedAtMs = exhausted ? Math.max(1, this.link.clock.now()) : 0;
    wake(o);
    // Still low (requests ran while the grant was on its way): ask again at once.
    if (o.exhaustedAtMs === 0) this.maybeAskOrg(orgId, o);
  }

  /**
   * The organisation's state changed at the control plane (credit, cap, tier, config): the slice is
   * given back and asked for afresh, so a lowered cap binds now and a raised one unblocks now.
   */
  orgChanged(orgId: string): void {
    const o = this.orgs.get(orgId);
    if (!o || !this.link.connected) return;
    o.exhaustedAtMs = 0;
    o.dry = false;
    // What was said may be taken in advance was said before the change (a lowered cap): none until the answer.
    if (o.advanceMicros !== null) o.advanceMicros = 0;
    const micros = Math.max(0, o.sliceMicros);
    if (micros > 0) {
      o.sliceMicros -= micros;
      this.link.orgReturns.push({ orgId, micros });
    }
    // A grant on its way was computed before the change: ask again once it is back.
    o.pending = false;
    this.askOrg(orgId, o, false);
  }

  /** A project's cap changed: each of its pools held here (by id prefix "project:ID@") is given back and asked afresh. */
  poolsChanged(prefix: string): void {
    for (const id of [...this.orgs.keys()]) if (id.startsWith(prefix)) this.orgChanged(id);
  }

  /**
   * A project's or key's pool whose period ended (request-money.ts): what is left of its slice is given
   * back and the pool forgotten; its period's requests were settled into it.
   */
  dropPool(poolId: string): void {
    const o = this.orgs.get(poolId);
    if (!o) return;
    this.orgs.delete(poolId);
    this.link.wantOrgs.delete(poolId);
    const micros = Math.max(0, o.sliceMicros);
    if (micros > 0 && this.link.connected) {
      this.link.orgReturns.push({ orgId: poolId, micros });
      this.link.queueFlush();
    }
    wake(o);
  }

  /**
   * Asks for more of the pool: `needed` when a request waits for it (it may reclaim from the other
   * nodes and be told the pool is exhausted), else ahead of need (only what is free).
   */
  private askOrg(orgId: string, o: OrgSlice, needed: boolean, needMicros?: number): void {
    if (this.link.leaving) return;
    // One want at a time, but a request's need goes out even while a want made ahead of it is on its way.
    if (o.pending && !this.link.stale(o.askedAtMs) && (o.neededAsk || !needed)) return;
    o.pending = true;
    o.neededAsk = needed;
    o.askedAtMs = this.link.clock.now();
    // What the slice is short plus enough for a few of the organisation's most expensive requests;
    // the control plane may give more.
    const want: OrgLeaseWant = { orgId, micros: Math.max(0, -o.sliceMicros) + aheadOf(o) };
    if (needed) {
      want.needMicros = Math.max(1, needMicros ?? o.maxCostMicros - o.sliceMicros);
      // A worst case's shortfall (raiseSpend) may be more than a few of the costliest requests.
      if (needMicros !== undefined) want.micros = Math.max(want.micros, want.needMicros);
      if (o.sliceMicros > 0) want.heldMicros = o.sliceMicros;
    } else want.ahead = true;
    // Spent past the slice and perhaps not reported yet: the control plane does not lease it again.
    if (o.sliceMicros < 0) want.debtMicros = -o.sliceMicros;
    this.link.wantOrgs.set(orgId, want);
    this.link.queueFlush();
  }

  /** A reclaim: the unused part of each named organisation's slice goes back. */
  reclaim(orgIds: string[]): OrgLeaseReturn[] {
    const orgReturns: OrgLeaseReturn[] = [];
    for (const orgId of orgIds) {
      const o = this.orgs.get(orgId);
      const micros = o ? Math.max(0, o.sliceMicros) : 0;
      if (o) o.sliceMicros -= micros;
      // Money was left after all (another node's request needs it): "nothing left" said to this node
      // earlier is stale, so its next request asks again rather than being refused for a second.
      if (o && micros > 0) o.exhaustedAtMs = 0;
      // With what it owes now: the control plane's view of this node's debt is fresh when it decides.
      orgReturns.push({ orgId, micros, debtMicros: o ? Math.max(0, -o.sliceMicros) : 0 });
    }
    return orgReturns;
  }

  /** The node stops: every slice's unused part goes back. */
  giveBack(): OrgLeaseReturn[] {
    const orgReturns: OrgLeaseReturn[] = [];
    for (const [orgId, o] of this.orgs) {
      const micros = Math.max(0, o.sliceMicros);
      o.sliceMicros -= micros;
      if (micros > 0) orgReturns.push({ orgId, micros });
    }
    return orgReturns;
  }

  /** A connection change: the slices belonged to the old connection. Returns them, for their waiters to be woken. */
  reset(): OrgSlice[] {
    const orgs = [...this.orgs.values()];
    this.orgs.clear();
    return orgs;
  }

  /** Wants that could not be sent: not pending any more. */
  unsent(wants: OrgLeaseWant[]): void {
    for (const w of wants) {
      const o = this.orgs.get(w.orgId);
      if (o) {
        o.pending = false;
        wake(o);
      }
    }
  }
}
