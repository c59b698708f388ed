// Admission of a request of a known key (docs/design.md#money-and-limits-across-nodes): the
// organisation's money slice and the key budgets. When the request is within the key's limits but this
// node's lease is short, or the organisation's money slice is on its way, the request waits (at most
// LEASE_WAIT_MS) while the node asks the control plane (which reclaims unused allowance from the other
// nodes before it says a minute or the money is spent), then is admitted or refused. The common case
// is synchronous. A waiting request never touches its response once the client went away (Reply.done).
import { GatewayError, orgBlockedMessage } from '../errors.js';
import type { KeyRecord } from '../state/key-table.js';
import { minuteOf, type Clock } from '../limits/clock.js';
import type { Admission as KeyAdmission, AdmitOptions, KeyBudgets, Ticket } from '../limits/key-budgets.js';
import type { RateHeaders } from '../limits/rate-headers.js';
import type { LeaseClient } from '../leases/lease-client.js';
import type { SpendReservation } from '../leases/lease-money.js';
import { advanceRefusedBy, cancelMoneyWait, maySpendNow, moneyRefusal, moneyVerdict, reserveMoney, reserveWorstCase, waitForMoney } from '../leases/request-money.js';
import type { WorstCase } from '../limits/worst-case.js';
import { logBug } from '../log.js';
import type { FinishSource, RequestContext } from './request-context.js';
import { LEASE_WAIT_MS, LEASE_WAIT_RECLAIMING_MS } from '../limits/lease-wait.js';


export interface AdmissionDeps {
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
}

/**
 * What admission answers: an HTTP request's Reply, or one turn on a socket (endpoints/socket-turns.ts),
 * which renders a refusal as an in-band error event. Either way the same checks, in the same order,
 * with the same refusals (docs/design.md#socket-turns).
 */
export interface Admittable extends FinishSource {
  /** The client went away (or the turn's socket closed): nothing to answer. */
  readonly done: boolean;
  rateHeaders: RateHeaders | null;
  readonly requestId: string;
  /** A refusal, in the shape of what it answers (error-shapes.ts errorShape). */
  sendError(err: unknown, closeConnection?: boolean): void;
}

export class Admission {
  /** What waiting for leases cost the requests that waited (GET /stats/lease-waits on the admin listener). */
  readonly waits = new WaitStats();

  constructor(
    private readonly deps: AdmissionDeps,
    /** `requestId`: the reply's (Reply.requestId), so the answer's `x-request-id` is the logged id. */
    private readonly newContext: (key: KeyRecord, path: string, ticket: Ticket, minute: number, requestId: string) => RequestContext,
  ) {}

  /**
   * Admission that may wait (docs/design.md#money-and-limits-across-nodes): when the request is within
   * the key's limits but this node's lease is short, or the organisation's money slice is on its way,
   * the request waits (at most LEASE_WAIT_MS) while the node asks the control plane, then is admitted
   * or refused. The common case is synchronous: `then` runs before this returns. `then(null)`: the
   * request was refused (answered) or the client went away; nothing was consumed.
   */
  admitOrWait(
    reply: Admittable,
    key: KeyRecord,
    path: string,
    estimatedTokens: number,
    then: (ctx: RequestContext | null) => void,
    closeIfRefused: () => boolean = () => false,
    opts?: AdmitOptions,
  ): void {
    const deps = this.deps;
    const leases = deps.leases;
    // The common case, synchronous and without a closure: the money slice is here and the key's
    // budgets admit. Anything else (a refusal, a wait) takes the general path below, which asks again
    // (a refused admission consumed nothing).
    if (!reply.done && (leases === undefined || maySpendNow(leases, key, deps.clock.now()))) {
      const a = deps.keyBudgets.admit(key.limits, estimatedTokens, undefined, opts);
      if (a.ok) {
        reply.rateHeaders = a.headers;
        const ctx = this.newContext(key, path, a.ticket, minuteOf(deps.clock.now()), reply.requestId);
        ctx.spend = reserveMoney(leases, key, deps.clock.now());
        ctx.attach(reply);
        try {
          then(ctx);
        } catch (e) {
          logBug(e);
          reply.sendError(e);
        }
        return;
      }
    }
    const started = performance.now();
    let finished = false;
    let waited = false;
    let advanced = false;
    /** Out of time (LEASE_WAIT_MS passed): a pool's answer that woke it since decides as a last try. */
    let late = false;
    let timer: NodeJS.Timeout | null = null;
    let silentTimer: NodeJS.Timeout | null = null;
    // Woken from inside the sync client's message handler: continue on a fresh tick. (Not a function
    // declaration: that would be created on every call, the synchronous fast path included.)
    const wake = (): void => {
      setImmediate(() => attempt(false));
    };
    const finish = (ctx: RequestContext | null) => {
      finished = true;
      if (timer) clearTimeout(timer);
      if (silentTimer) clearTimeout(silentTimer);
      leases?.cancelKeyWait(key.keyId, wake);
      if (leases) cancelMoneyWait(leases, key, wake);
      leases?.cancelSlotWait(key.keyId, wake);
      if (waited) this.waits.note(performance.now() - started, ctx !== null, advanced);
      then(ctx);
    };
    const attempt = (lastTry: boolean, silent = false) => {
      if (finished) return;
      try {
        // The client went away while the request waited: nothing was taken, nothing to answer.
        if (reply.done) return finish(null);
        // Out of time, but the control plane said the answer waits for reclaims: not late, wait on.
        if (lastTry && leases?.answerDeferred(started) && performance.now() - started < LEASE_WAIT_RECLAIMING_MS) {
          timer = setTimeout(() => attempt(true), 50);
          return;
        }
        if (lastTry) late = true;
        // The organisation's money, and its project's cap and the key's own limit (docs/money-limits.md).
        const money = leases ? moneyVerdict(leases, key, deps.clock.now()) : null;
        if (money?.verdict === 'no') {
          reply.sendError(moneyRefusal(money), closeIfRefused());
          return finish(null);
        }
        let inAdvance = false;
        if (money?.verdict === 'wait') {
          if (!late && waitForMoney(leases!, money.pool, wake)) return park();
          // Out of time with the slice still on its way: admitted in advance of the answer while this
          // node took no more than the control plane said it may, then one request more; the others
          // wait for the answer, as long as a reclaim may take (docs/leases.md). Silent that long, the
          // control plane is, for this request, unreachable: admitted as when the connection is down.
          const refused = silent ? null : advanceRefusedBy(leases!, key, deps.clock.now());
          if (refused !== null && waitForAnswer(refused)) return;
          inAdvance = true;
        }
        const now = deps.clock.now();
        const a = deps.keyBudgets.admit(key.limits, estimatedTokens, started, opts);
        reply.rateHeaders = a.headers;
        if (a.ok) {
          const ctx = this.newContext(key, path, a.ticket, minuteOf(now), reply.requestId);
          ctx.spend = reserveMoney(leases, key, deps.clock.now(), inAdvance);
          ctx.attach(reply);
          return finish(ctx);
        }
        // Short of this node's lease: wait for the answer (bounded). Out of time with no answer (the
        // control plane is slow; it did not say the key is spent), or while an earlier want of the key
        // is so: not a refusal. The node admits in advance of the answer, within the key's own limits
        // counted here, and the control plane counts it (docs/leases.md).
        let b: KeyAdmission = a;
        // (At most the minute's allowance, then a slot.)
        for (let i = 0; i < 3 && !b.ok && b.leaseShort && leases; i++) {
          const s = b.leaseShort;
          const took = s.slot ? leases.advanceSlot(key.keyId, key.limits, late, started) : leases.advanceKey(key.keyId, minuteOf(now), key.limits, s.requests, s.tokens, late);
          if (!took) {
            if (!late && (s.slot ? leases.waitForSlot(key.keyId, key.limits, wake, started) : leases.waitForKey(key.keyId, minuteOf(now), key.limits, s.requests, s.tokens, wake))) return park();
            break;
          }
          advanced = true;
          b = deps.keyBudgets.admit(key.limits, estimatedTokens, started, opts);
          reply.rateHeaders = b.headers;
          if (b.ok) {
            const ctx = this.newContext(key, path, b.ticket, minuteOf(now), reply.requestId);
            ctx.spend = reserveMoney(leases, key, deps.clock.now(), inAdvance);
            ctx.attach(reply);
            return finish(ctx);
          }
        }
        if (!b.ok) {
          reply.sendError(new GatewayError('KEY_RATE_LIMITED', b.message, { type: b.dimension, param: null, retryAfterSec: b.retryAfterSec }), closeIfRefused());
          return finish(null);
        }
      } catch (e) {
        logBug(e);
        reply.sendError(e);
        if (!finished) finish(null);
      }
    };
    const park = () => {
      waited = true;
      timer ??= setTimeout(() => attempt(true), LEASE_WAIT_MS);
    };
    const waitForAnswer = (pool: string): boolean => {
      const left = LEASE_WAIT_RECLAIMING_MS - (performance.now() - started);
      // (Once: an earlier wait's registration may still be there.)
      cancelMoneyWait(leases!, key, wake);
      if (left <= 0 || !waitForMoney(leases!, pool, wake)) return false;
      waited = true;
      silentTimer ??= setTimeout(() => attempt(true, true), left);
      return true;
    };
    attempt(false);
  }

  /**
   * Admits at once, without a check that could refuse: for work the upstream already began on its own
   * (`opts.force`, endpoints/socket-turns.ts), which is counted and billed whatever the limits say.
   */
  admitNow(target: Admittable, key: KeyRecord, path: string, estimatedTokens: number, opts: AdmitOptions & { force: true }): RequestContext {
    const now = this.deps.clock.now();
    const a = this.deps.keyBudgets.admit(key.limits, estimatedTokens, undefined, opts);
    if (!a.ok) throw new Error(`a forced admission was refused (${a.dimension})`);
    target.rateHeaders = a.headers;
    const ctx = this.newContext(key, path, a.ticket, minuteOf(now), target.requestId);
    ctx.spend = reserveMoney(this.deps.leases, key, now);
    ctx.attach(target);
    return ctx;
  }

  /** The token estimate of an admitted request, waiting (bounded) for a lease like admitOrWait. */
  reserveOrWait(ctx: RequestContext, reply: Admittable, key: KeyRecord, estimate: number, then: (ok: boolean) => void): void {
    const deps = this.deps;
    // The common case, without a closure: the estimate fits (a refusal changed nothing; asked again below).
    if (!reply.done && ctx.ticket.reserveTokens(estimate) === null) {
      then(true);
      return;
    }
    const started = performance.now();
    let timer: NodeJS.Timeout | null = null;
    let finished = false;
    let waited = false;
    const wake = (): void => {
      setImmediate(() => attempt(false));
    };
    const finish = (ok: boolean) => {
      finished = true;
      if (timer) clearTimeout(timer);
      deps.leases?.cancelKeyWait(key.keyId, wake);
      if (waited) this.waits.note(performance.now() - started, ok);
      then(ok);
    };
    const attempt = (lastTry: boolean) => {
      if (finished) return;
      try {
        if (reply.done) return finish(false);
        if (lastTry && deps.leases?.answerDeferred(started) && performance.now() - started < LEASE_WAIT_RECLAIMING_MS) {
          timer = setTimeout(() => attempt(true), 50);
          return;
        }
        const refusal = ctx.ticket.reserveTokens(estimate);
        if (!refusal) return finish(true);
        if (refusal.leaseShort && !lastTry && deps.leases?.waitForKey(key.keyId, ctx.minute, key.limits, 0, refusal.leaseShort.tokens, wake)) {
          waited = true;
          timer ??= setTimeout(() => attempt(true), LEASE_WAIT_MS);
          return;
        }
        // Out of time with no answer: reserved in advance of it, as admitOrWait does.
        if (refusal.leaseShort && deps.leases?.advanceKey(key.keyId, ctx.minute, key.limits, 0, refusal.leaseShort.tokens, lastTry) && ctx.ticket.reserveTokens(estimate) === null) return finish(true);
        ctx.refuse();
        reply.rateHeaders = deps.keyBudgets.headers(key.limits);
        reply.sendError(new GatewayError('KEY_RATE_LIMITED', refusal.message, { type: refusal.dimension, param: null, retryAfterSec: refusal.retryAfterSec }));
        finish(false);
      } catch (e) {
        logBug(e);
        reply.sendError(e);
        if (!finished) finish(false);
      }
    };
    attempt(false);
  }

  /**
   * The common case of reserveWorstCaseOrWait, synchronous: true when the worst case was reserved at
   * once; false changed nothing that reserveWorstCaseOrWait will not ask again.
   */
  reserveWorstCaseNow(key: KeyRecord, spend: SpendReservation | undefined, worst: WorstCase): boolean {
    return reserveWorstCase(this.deps.leases, key, spend, worst, this.deps.clock.now()).verdict === 'yes';
  }

  /**
   * Raises an admitted request's money reservation (`spend`: RequestContext.spend) to its worst case
   * (worst-case.ts requestWorstCase) in every pool it touches, waiting (bounded, as reserveOrWait) for
   * a pool's slice when it is short (docs/money-limits.md#the-last-request). The common case is
   * synchronous. `then(null)`: reserved; `then(error)`: refused, 401 insufficient_quota naming the
   * output tokens that would fit (nothing is answered here: the caller refunds the request and answers);
   * `then('gone')`: `gone()` said the client went away while it waited. Out of time with no final
   * answer: reserved in advance of it, as admitOrWait admits.
   */
  reserveWorstCaseOrWait(key: KeyRecord, spend: SpendReservation | undefined, worst: WorstCase, gone: () => boolean, then: (r: WorstCaseResult) => void): void {
    const { clock, leases } = this.deps;
    const now = reserveWorstCase(leases, key, spend, worst, clock.now());
    if (now.verdict !== 'wait') return then(now.verdict === 'yes' ? null : moneyRefusal(now));
    const started = performance.now();
    let timer: NodeJS.Timeout | null = null;
    let silentTimer: NodeJS.Timeout | null = null;
    let finished = false;
    let late = false;
    const wake = (): void => {
      setImmediate(() => attempt(false));
    };
    const finish = (r: WorstCaseResult) => {
      finished = true;
      if (timer) clearTimeout(timer);
      if (silentTimer) clearTimeout(silentTimer);
      if (leases) cancelMoneyWait(leases, key, wake);
      this.waits.note(performance.now() - started, r === null);
      then(r);
    };
    const attempt = (lastTry: boolean, silent = false): void => {
      if (finished) return;
      try {
        if (gone()) return finish('gone');
        if (lastTry && leases?.answerDeferred(started) && performance.now() - started < LEASE_WAIT_RECLAIMING_MS) {
          timer = setTimeout(() => attempt(true), 50);
          return;
        }
        if (lastTry) late = true;
        const v = reserveWorstCase(leases, key, spend, worst, clock.now(), late, silent);
        if (v.verdict === 'no') return finish(moneyRefusal(v));
        if (v.verdict === 'wait' && !late && waitForMoney(leases!, v.pool, wake)) {
          timer ??= setTimeout(() => attempt(true), LEASE_WAIT_MS);
          return;
        }
        // Out of time, past what this node may take in advance (lease-money.ts mayAdvance): waits for
        // the answer as long as a reclaim may take, then, the control plane silent, reserved anyway.
        if (v.verdict === 'wait' && !silent) {
          const left = LEASE_WAIT_RECLAIMING_MS - (performance.now() - started);
          cancelMoneyWait(leases!, key, wake);
          if (left > 0 && waitForMoney(leases!, v.pool, wake)) {
            silentTimer ??= setTimeout(() => attempt(true, true), left);
            return;
          }
          return attempt(true, true);
        }
        finish(null);
      } catch (e) {
        logBug(e);
        if (!finished) finish(e instanceof GatewayError ? e : new GatewayError('INTERNAL'));
      }
    };
    attempt(false);
  }
}

/** What reserveWorstCaseOrWait answers: reserved (null), refused (the error to answer with), or the client went away. */
export type WorstCaseResult = GatewayError | null | 'gone';

export function blockedMessage(reason: string): string {
  // One text per reason, whether a request is refused or what is open is ended (errors.ts).
  return orgBlockedMessage(reason);
}

/**
 * Latency added to requests that waited for a lease: count, admitted, and percentiles of a sample;
 * `advanced`: admitted in advance of an answer that did not come within the bound (docs/leases.md).
 */
export class WaitStats {
  private count = 0;
  private admitted = 0;
  private advanced = 0;
  private maxMs = 0;
  private totalMs = 0;
  private readonly sample: number[] = [];

  note(ms: number, admitted: boolean, advanced = false): void {
    this.count++;
    if (admitted) this.admitted++;
    if (advanced && admitted) this.advanced++;
    this.totalMs += ms;
    if (ms > this.maxMs) this.maxMs = ms;
    // Keep the first 10,000: enough for a benchmark's percentiles, bounded in memory.
    if (this.sample.length < 10_000) this.sample.push(ms);
  }

  /** The figures so far; `reset` starts afresh after reading. */
  snapshot(reset = false): { waited: number; admitted: number; advanced: number; mean_ms: number; p50_ms: number; p99_ms: number; max_ms: number } {
    const sorted = [...this.sample].sort((a, b) => a - b);
    const at = (q: number) => (sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]);
    const r = (n: number) => Math.round(n * 100) / 100;
    const out = { waited: this.count, admitted: this.admitted, advanced: this.advanced, mean_ms: r(this.count ? this.totalMs / this.count : 0), p50_ms: r(at(0.5)), p99_ms: r(at(0.99)), max_ms: r(this.maxMs) };
    if (reset) {
      this.count = this.admitted = this.advanced = this.maxMs = this.totalMs = 0;
      this.sample.length = 0;
    }
    return out;
  }
}
