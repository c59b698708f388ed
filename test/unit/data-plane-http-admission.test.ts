// Admission (data-plane/http/admission.ts) against real key budgets, an injected clock, a scripted
// lease client and a reply that records what was answered: the synchronous common case, refusals for
// the key's own limits and for an organisation without money, the bounded wait for this node's lease
// (granted, spent, late, reclaiming; docs/leases.md "When the control plane answers late"), a client
// that went away while waiting, and the wait statistics. Time moves only when a test moves it: the
// clock is a ManualClock, setTimeout is node:test's mock timers, and performance.now follows them.
import assert from 'node:assert/strict';
import { afterEach, beforeEach, mock, test } from 'node:test';
import type { KeyRecord } from '../../data-plane/auth/key-table.js';
import { Admission, LEASE_WAIT_MS, LEASE_WAIT_RECLAIMING_MS, WaitStats } from '../../data-plane/http/admission.js';
import { renderError, type ErrorShape } from '../../data-plane/http/error-shapes.js';
import type { Reply } from '../../data-plane/http/reply.js';
import { RequestContext } from '../../data-plane/http/request-context.js';
import { log } from '../../data-plane/log.js';
import { ManualClock, minuteOf, secondsToNextMinute } from '../../data-plane/limits/clock.js';
import { KeyBudgets, type AllowanceSource, type KeyLimits, type MinuteAllowance, type RateHeaders } from '../../data-plane/limits/key-budgets.js';
import type { LeaseClient, SpendReservation, SpendVerdict } from '../../data-plane/limits/lease-client.js';

/** 17 s into a minute: every 429 says retry-after 43. */
const T0 = Date.UTC(2025, 0, 1, 12, 0, 17);
const ORG_BLOCKED_TEXT = "The organisation's balance is exhausted or its monthly spend cap was reached.";

// ── time ─────────────────────────────────────────────────────────────────────

/** performance.now() as admission reads it: moved by `advance` with the mock timers and the clock. */
let perfNow = 0;
let clock: ManualClock;

beforeEach(() => {
  perfNow = 0;
  clock = new ManualClock(T0);
  mock.timers.enable({ apis: ['setTimeout'] });
  mock.method(performance, 'now', () => perfNow);
});

afterEach(() => {
  mock.timers.reset();
  mock.restoreAll();
});

/** Moves every clock by `ms` in 10 ms steps (mock timers run a tick's timers at its end time). */
function advance(ms: number): void {
  for (let left = ms; left > 0; left -= 10) {
    const step = Math.min(10, left);
    perfNow += step;
    clock.advance(step);
    mock.timers.tick(step);
  }
}

/** Lets the wakes run: admission continues on a fresh tick (setImmediate, not mocked), queued before this. */
const wakesRun = () => new Promise<void>((resolve) => setImmediate(resolve));

// ── fakes ────────────────────────────────────────────────────────────────────

/** The part of Reply admission (and RequestContext.attach) uses. */
type ReplyUsed = Pick<Reply, 'done' | 'requestId' | 'rateHeaders' | 'sendError' | 'onFinish' | 'logDraft' | 'open'>;

interface Answer {
  status: number;
  headers: Array<[string, string]>;
  body: unknown;
  closeConnection: boolean;
}

/** Records the answer as Reply.sendError renders it (error-shapes.ts); notes any touch after `done`. */
class FakeReply implements ReplyUsed {
  done = false;
  requestId = 'req-1';
  logDraft = null;
  open = null;
  answers: Answer[] = [];
  /** What was done to the response after it could no longer be touched (must stay empty). */
  touchedAfterDone: string[] = [];
  private headers: RateHeaders | null = null;
  private finishFns: Array<(aborted: boolean) => void> = [];

  get rateHeaders(): RateHeaders | null {
    return this.headers;
  }
  set rateHeaders(h: RateHeaders | null) {
    if (this.done) this.touchedAfterDone.push('rateHeaders');
    this.headers = h;
  }
  sendError(err: unknown, shape: ErrorShape, closeConnection = false): void {
    if (this.done) {
      this.touchedAfterDone.push('sendError');
      return;
    }
    const r = renderError(err, shape);
    this.answers.push({ status: r.status, headers: r.headers, body: JSON.parse(r.body), closeConnection });
    this.end(false);
  }
  onFinish(fn: (aborted: boolean) => void): void {
    if (this.done) this.touchedAfterDone.push('onFinish');
    this.finishFns.push(fn);
  }
  /** The client went away (uWS onAborted). */
  abort(): void {
    this.end(true);
  }
  private end(aborted: boolean): void {
    this.done = true;
    for (const fn of this.finishFns.splice(0)) fn(aborted);
  }
}

/** The part of LeaseClient that admission calls. */
type LeasesUsed = Pick<
  LeaseClient,
  | 'spendFirst'
  | 'canSpend'
  | 'reserveSpend'
  | 'waitForOrg'
  | 'cancelOrgWait'
  | 'answerDeferred'
  | 'waitForKey'
  | 'cancelKeyWait'
  | 'advanceKey'
  | 'waitForSlot'
  | 'cancelSlotWait'
  | 'advanceSlot'
>;

/**
 * A lease client scripted by the test: `held` is what this node leased of the key's minute (the key
 * budgets' allowance source), `spend` the organisation's money verdict. Waiters are woken by the
 * grant methods, as the sync client's messages wake them.
 */
class FakeLeases implements LeasesUsed, AllowanceSource {
  held: MinuteAllowance = { requests: Infinity, tokens: Infinity };
  spend: SpendVerdict = 'yes';
  /** What `answerDeferred` says (the control plane said "reclaiming"). */
  reclaiming = false;
  /** A want of the key timed out: later requests take in advance without waiting (advanceKey). */
  advancing = false;
  reserved = 0;
  keyWaiters: Array<() => void> = [];
  orgWaiters: Array<() => void> = [];
  advancedTaken = 0;

  allowanceFor(): MinuteAllowance {
    return this.held;
  }
  spendFirst(): boolean {
    return false;
  }
  canSpend(): SpendVerdict {
    return this.spend;
  }
  reserveSpend(): SpendReservation | undefined {
    this.reserved++;
    return { epoch: 1, micros: 0 };
  }
  waitForOrg(_orgId: string, wake: () => void): boolean {
    this.orgWaiters.push(wake);
    return true;
  }
  cancelOrgWait(_orgId: string, wake: () => void): void {
    this.orgWaiters = this.orgWaiters.filter((w) => w !== wake);
  }
  answerDeferred(): boolean {
    return this.reclaiming;
  }
  waitForKey(_keyId: string, _minute: number, _limits: KeyLimits, needRequests: number, needTokens: number, wake: () => void): boolean {
    if (this.spent(needRequests, needTokens) || this.advancing) return false;
    this.keyWaiters.push(wake);
    return true;
  }
  cancelKeyWait(_keyId: string, wake: () => void): void {
    this.keyWaiters = this.keyWaiters.filter((w) => w !== wake);
  }
  advanceKey(_keyId: string, _minute: number, _limits: KeyLimits, needRequests: number, needTokens: number, timedOut: boolean): boolean {
    if (this.spent(needRequests, needTokens)) return false;
    if (!timedOut && !this.advancing) return false;
    this.advancing = true;
    this.advancedTaken += needRequests;
    this.held = { ...this.held, requests: this.held.requests + needRequests, tokens: this.held.tokens + needTokens };
    return true;
  }
  /** This node's parallel slots of the key (undefined: the key's own limit, as a lone node). */
  slots: { slots: number; final: boolean } | undefined = undefined;
  slotWaiters: Array<() => void> = [];
  slotsAdvancing = false;
  slotsTaken = 0;

  slotsFor(): { slots: number; final: boolean } | undefined {
    return this.slots;
  }
  waitForSlot(_keyId: string, _limits: KeyLimits, wake: () => void): boolean {
    if (!this.slots || this.slots.final || this.slotsAdvancing) return false;
    this.slotWaiters.push(wake);
    return true;
  }
  cancelSlotWait(_keyId: string, wake: () => void): void {
    this.slotWaiters = this.slotWaiters.filter((w) => w !== wake);
  }
  advanceSlot(_keyId: string, _limits: KeyLimits, timedOut: boolean): boolean {
    if (!this.slots || this.slots.final || (!timedOut && !this.slotsAdvancing)) return false;
    this.slotsAdvancing = true;
    this.slotsTaken++;
    this.slots = { ...this.slots, slots: this.slots.slots + 1 };
    return true;
  }
  /** The control plane granted slots (`n`), or said every slot of the key is in use (`final`). */
  slotAnswer(n: number, final = false): void {
    this.slots = { slots: this.slots!.slots + n, final };
    for (const w of this.slotWaiters.splice(0)) w();
  }

  private spent(needRequests: number, needTokens: number): boolean {
    return (needRequests > 0 && this.held.requestsFinal === true) || (needTokens > 0 && needTokens >= (this.held.tokensFinalNeed ?? Infinity));
  }

  /** The control plane granted more of the key's minute. */
  grantKey(requests: number, tokens = 0): void {
    this.held = { ...this.held, requests: this.held.requests + requests, tokens: this.held.tokens + tokens };
    this.advancing = false;
    for (const w of this.keyWaiters.splice(0)) w();
  }
  /** The control plane said the key's minute is spent across the cluster (after reclaiming). */
  keySpent(): void {
    this.held = { ...this.held, requestsFinal: true, tokensFinalNeed: 1 };
    for (const w of this.keyWaiters.splice(0)) w();
  }
  /** The organisation's money slice came (`yes`) or the control plane said nothing is left (`no`). */
  orgAnswer(verdict: SpendVerdict): void {
    this.spend = verdict;
    for (const w of this.orgWaiters.splice(0)) w();
  }
}

// ── the node ─────────────────────────────────────────────────────────────────

const LIMITS: KeyLimits = { keyId: 'key_a', rpmLimit: 20, tpmLimit: 1000, maxParallel: 3 };

function keyOf(limits: Partial<KeyLimits> = {}): KeyRecord {
  return {
    keyId: 'key_a',
    keyHash: 'h',
    projectId: 'proj_a',
    orgId: 'org_a',
    org: { orgId: 'org_a', tier: 'free', blocked: false, blockedReason: '', ownerAccountId: '' },
    allowedModels: new Set(),
    limits: { ...LIMITS, ...limits },
  };
}

interface Outcome {
  calls: number;
  ctx: RequestContext | null | undefined;
}

function node(leases: FakeLeases | null) {
  const keyBudgets = new KeyBudgets(clock, leases ? { allowance: leases } : {});
  const contexts: Array<{ path: string; minute: number; requestId: string }> = [];
  const admission = new Admission({ clock, keyBudgets, leases: leases ? (leases as unknown as LeaseClient) : undefined }, (key, path, ticket, minute, requestId) => {
    contexts.push({ path, minute, requestId });
    return new RequestContext({ clock, reporter: { record() {} } }, requestId, key, path, ticket, minute);
  });
  /** Starts one admission; `out` tells whether and how `then` was called so far. */
  const admit = (key: KeyRecord, opts: { reply?: FakeReply; tokens?: number; shape?: ErrorShape; close?: boolean } = {}) => {
    const reply = opts.reply ?? new FakeReply();
    const out: Outcome = { calls: 0, ctx: undefined };
    admission.admitOrWait(
      reply as unknown as Reply,
      key,
      '/v1/chat/completions',
      opts.tokens ?? 10,
      (ctx) => {
        out.calls++;
        out.ctx = ctx;
      },
      () => opts.close ?? false,
      opts.shape ?? 'openai',
    );
    return { reply, out };
  };
  return { keyBudgets, admission, contexts, admit };
}

function usage(kb: KeyBudgets) {
  const { requests, tokens, inFlight } = kb.usage('key_a');
  return { requests, tokens, inFlight };
}

function header(a: Answer, name: string): string | undefined {
  return a.headers.find(([k]) => k === name)?.[1];
}

// ── the synchronous common case ──────────────────────────────────────────────

test('within the key limits and with money: admitted before admitOrWait returns, nothing recorded as a wait', () => {
  for (const withLeases of [false, true]) {
    const leases = withLeases ? new FakeLeases() : null;
    if (leases) leases.held = { requests: 5, tokens: 500 };
    const n = node(leases);
    const { reply, out } = n.admit(keyOf(), { tokens: 40 });
    assert.equal(out.calls, 1, `leases: ${withLeases}`);
    assert.ok(out.ctx instanceof RequestContext);
    assert.equal(out.ctx.requestId, 'req-1', "the context carries the reply's request id");
    assert.equal(out.ctx.minute, minuteOf(T0));
    assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 40, inFlight: 1 });
    assert.deepEqual(reply.answers, []);
    assert.equal(reply.rateHeaders?.limitRequests, 20);
    assert.equal(reply.rateHeaders?.remainingRequests, withLeases ? 4 : 19);
    if (leases) {
      assert.equal(leases.reserved, 1, 'the money reservation is taken once');
      assert.deepEqual(out.ctx.spend, { epoch: 1, micros: 0 });
    }
    assert.deepEqual(n.admission.waits.snapshot().waited, 0);
    // The context is tied to the response: its end gives everything back (never started upstream).
    reply.abort();
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
  }
});

// ── refusals for the key's own limits ────────────────────────────────────────

test("a key over its rpm, tpm or parallel limit: 429 in Shape A with the message and retry-after, nothing consumed", () => {
  const rows: Array<{
    name: string;
    limits: Partial<KeyLimits>;
    /** Requests admitted (and left in flight) before the one refused. */
    before: number;
    tokens: number;
    type: string;
    message: string;
  }> = [
    {
      name: 'rpm',
      limits: { rpmLimit: 2 },
      before: 2,
      tokens: 10,
      type: 'requests',
      message: 'Rate limit reached for requests per minute (rpm): 2/2 used; tokens per minute (tpm): 20/1000; max parallel requests: 2/3. Retry after 43 s.',
    },
    {
      name: 'tpm',
      limits: { tpmLimit: 100 },
      before: 1,
      tokens: 60,
      type: 'tokens',
      message: 'Rate limit reached for tokens per minute (tpm): 60/100 used, this request needs about 60; requests per minute (rpm): 1/20; max parallel requests: 1/3. Retry after 43 s.',
    },
    {
      name: 'parallel',
      limits: { maxParallel: 1 },
      before: 1,
      tokens: 10,
      type: 'max_parallel_requests',
      message: 'Rate limit reached for max parallel requests: 1/1 in flight; requests per minute (rpm): 1/20; tokens per minute (tpm): 10/1000. Retry after 43 s.',
    },
  ];
  for (const row of rows) {
    // The 429 body is Shape A whatever the family's shape (spec, "429 bodies").
    for (const shape of ['openai', 'gateway', 'passthrough'] as const) {
      for (const withLeases of [false, true]) {
        const leases = withLeases ? new FakeLeases() : null;
        const n = node(leases);
        const key = keyOf(row.limits);
        for (let i = 0; i < row.before; i++) assert.equal(n.admit(key, { tokens: row.tokens }).out.ctx instanceof RequestContext, true);
        const before = usage(n.keyBudgets);
        const reserved = leases?.reserved;
        const contexts = n.contexts.length;
        const what = `${row.name}, ${shape}, leases: ${withLeases}`;

        const { reply, out } = n.admit(key, { tokens: row.tokens, shape, close: true });
        assert.deepEqual(out, { calls: 1, ctx: null }, what);
        assert.equal(reply.answers.length, 1, what);
        const a = reply.answers[0];
        assert.equal(a.status, 429, what);
        assert.deepEqual(a.body, { error: { message: row.message, type: row.type, param: null, code: '429' } }, what);
        assert.equal(header(a, 'retry-after'), '43', what);
        assert.equal(a.closeConnection, true, `${what}: closeIfRefused is asked`);
        assert.equal(reply.rateHeaders?.resetSec, 43, `${what}: the rate headers go with the refusal`);
        assert.deepEqual(usage(n.keyBudgets), before, `${what}: nothing consumed`);
        assert.equal(leases?.reserved, reserved, `${what}: no money reserved`);
        assert.equal(n.contexts.length, contexts, `${what}: no context`);
        assert.equal(n.admission.waits.snapshot().waited, 0, `${what}: not a wait`);
      }
    }
  }
});

// ── an organisation without money ────────────────────────────────────────────

test('an organisation with no money: 401 insufficient_quota in the family shape, nothing consumed', () => {
  const bodies: Record<ErrorShape, unknown> = {
    openai: { error: { message: ORG_BLOCKED_TEXT, type: 'insufficient_quota', param: null, code: '401' } },
    gateway: { error: { code: 'invalid_api_key', message: ORG_BLOCKED_TEXT } },
    passthrough: { detail: ORG_BLOCKED_TEXT },
  };
  for (const shape of ['openai', 'gateway', 'passthrough'] as const) {
    for (const close of [false, true]) {
      const leases = new FakeLeases();
      leases.spend = 'no';
      const n = node(leases);
      const { reply, out } = n.admit(keyOf(), { shape, close });
      assert.deepEqual(out, { calls: 1, ctx: null }, shape);
      assert.equal(reply.answers.length, 1);
      assert.equal(reply.answers[0].status, 401);
      assert.deepEqual(reply.answers[0].body, bodies[shape], shape);
      assert.equal(header(reply.answers[0], 'retry-after'), undefined);
      assert.equal(reply.answers[0].closeConnection, close);
      assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
      assert.equal(leases.reserved, 0);
      assert.equal(n.contexts.length, 0);
    }
  }
});

test('no money and over the key rpm: the money answer comes first (docs/design.md#order-of-checks, step 4 before 6)', () => {
  const leases = new FakeLeases();
  const n = node(leases);
  const key = keyOf({ rpmLimit: 2 });
  assert.ok(n.admit(key).out.ctx);
  assert.ok(n.admit(key).out.ctx);
  leases.spend = 'no';
  const { reply, out } = n.admit(key);
  assert.equal(out.ctx, null);
  assert.equal(reply.answers[0].status, 401);
  assert.equal((reply.answers[0].body as { error: { type: string } }).error.type, 'insufficient_quota');
  assert.deepEqual(usage(n.keyBudgets), { requests: 2, tokens: 20, inFlight: 2 });
});

test("the organisation's money slice on its way: waits, then admitted (slice came), refused (nothing left) or admitted at the bound (late)", async () => {
  const rows: Array<{ name: string; answer: (l: FakeLeases) => void; at: number; status: number | null }> = [
    { name: 'slice came', answer: (l) => l.orgAnswer('yes'), at: 40, status: null },
    { name: 'nothing left', answer: (l) => l.orgAnswer('no'), at: 40, status: 401 },
    // Out of time with the slice still on its way: admitted, as it costs at most one request in flight.
    { name: 'late', answer: () => {}, at: LEASE_WAIT_MS, status: null },
  ];
  for (const row of rows) {
      const leases = new FakeLeases();
      leases.spend = 'wait';
      const n = node(leases);
      const { reply, out } = n.admit(keyOf());
      assert.equal(out.calls, 0, `${row.name}: waits`);
      assert.equal(leases.orgWaiters.length, 1);
      advance(row.at === LEASE_WAIT_MS ? LEASE_WAIT_MS - 10 : row.at);
      assert.equal(out.calls, 0, `${row.name}: still waiting`);
      if (row.at === LEASE_WAIT_MS) advance(10);
      row.answer(leases);
      await wakesRun();
      assert.equal(out.calls, 1, row.name);
      if (row.status === null) {
        assert.ok(out.ctx instanceof RequestContext, row.name);
        assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 });
        assert.equal(leases.reserved, 1);
      } else {
        assert.equal(out.ctx, null);
        assert.equal(reply.answers[0].status, row.status);
        assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
        assert.equal(leases.reserved, 0);
      }
      assert.equal(leases.orgWaiters.length, 0, `${row.name}: no waiter left behind`);
      const s = n.admission.waits.snapshot();
      assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, row.status === null ? 1 : 0, 0, row.at], row.name);
  }
});

// ── short of this node's lease ───────────────────────────────────────────────

test("short of this node's lease: waits, then admitted when the grant comes, or refused when the minute is spent", async () => {
  for (const spent of [false, true]) {
    const leases = new FakeLeases();
    leases.held = { requests: 0, tokens: Infinity };
    const n = node(leases);
    const { reply, out } = n.admit(keyOf(), { close: true });
    assert.equal(out.calls, 0, 'waits for the answer');
    assert.equal(leases.keyWaiters.length, 1);
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
    advance(100);
    assert.equal(out.calls, 0);
    if (spent) leases.keySpent();
    else leases.grantKey(5);
    await wakesRun();
    assert.equal(out.calls, 1);
    if (spent) {
      // Final: the control plane reclaimed first; the key's 20 rpm are spent across the cluster.
      const retryAfter = secondsToNextMinute(clock.now());
      assert.equal(out.ctx, null);
      assert.equal(reply.answers[0].status, 429);
      assert.deepEqual(reply.answers[0].body, {
        error: {
          message: `Rate limit reached for requests per minute (rpm): 20/20 used; tokens per minute (tpm): 0/1000; max parallel requests: 0/3. Retry after ${retryAfter} s.`,
          type: 'requests',
          param: null,
          code: '429',
        },
      });
      assert.equal(header(reply.answers[0], 'retry-after'), String(retryAfter));
      assert.equal(reply.answers[0].closeConnection, true);
      assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
      assert.equal(leases.reserved, 0);
      assert.equal(leases.advancedTaken, 0, 'nothing taken in advance of a final answer');
    } else {
      assert.ok(out.ctx instanceof RequestContext);
      assert.deepEqual(reply.answers, []);
      assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 });
      assert.equal(leases.reserved, 1);
    }
    // The bound's timer was cleared: moving past it changes nothing.
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(out.calls, 1);
    assert.equal(reply.answers.length, spent ? 1 : 0);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, spent ? 0 : 1, 0, 100]);
  }
});

test('no answer within LEASE_WAIT_MS: admitted in advance, and the next request of the key does not wait', () => {
  const leases = new FakeLeases();
  leases.held = { requests: 0, tokens: Infinity };
  const n = node(leases);
  const { reply, out } = n.admit(keyOf());
  advance(LEASE_WAIT_MS - 10);
  assert.equal(out.calls, 0, 'still waiting just before the bound');
  advance(10);
  assert.equal(out.calls, 1, 'answered at the bound');
  assert.ok(out.ctx instanceof RequestContext, 'a late answer is not a refusal');
  assert.deepEqual(reply.answers, []);
  assert.equal(leases.advancedTaken, 1);
  assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 });
  assert.equal(leases.keyWaiters.length, 0, 'the waiter was dropped');
  const s = n.admission.waits.snapshot();
  assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, 1, 1, LEASE_WAIT_MS]);

  // Until the answer comes, the key's requests that this node cannot cover take in advance at once.
  const second = n.admit(keyOf());
  assert.equal(second.out.calls, 1);
  assert.ok(second.out.ctx instanceof RequestContext);
  assert.equal(leases.advancedTaken, 2);
  assert.equal(n.admission.waits.snapshot().waited, 1, 'the second did not wait');
});

test('taking in advance stays within the key limits counted here', () => {
  // The key's own rpm (2) binds before any lease: the third request is refused, not taken in advance.
  const leases = new FakeLeases();
  leases.held = { requests: 0, tokens: Infinity };
  leases.advancing = true;
  const n = node(leases);
  const key = keyOf({ rpmLimit: 2 });
  assert.ok(n.admit(key).out.ctx instanceof RequestContext);
  assert.ok(n.admit(key).out.ctx instanceof RequestContext);
  const third = n.admit(key);
  assert.equal(third.out.ctx, null);
  assert.equal(third.reply.answers[0].status, 429);
  assert.equal(leases.advancedTaken, 2);
  assert.deepEqual(usage(n.keyBudgets), { requests: 2, tokens: 20, inFlight: 2 });
});

test('the answer waits for reclaims: the request keeps waiting up to LEASE_WAIT_RECLAIMING_MS, then is admitted in advance', async () => {
  // No answer at all: admitted in advance at the longer bound, not at LEASE_WAIT_MS.
  {
    const leases = new FakeLeases();
    leases.held = { requests: 0, tokens: Infinity };
    leases.reclaiming = true;
    const n = node(leases);
    const { out } = n.admit(keyOf());
    advance(LEASE_WAIT_RECLAIMING_MS - 10);
    assert.equal(out.calls, 0, 'still waiting while the control plane reclaims');
    assert.equal(leases.advancedTaken, 0);
    advance(10);
    assert.equal(out.calls, 1);
    assert.ok(out.ctx instanceof RequestContext);
    assert.equal(leases.advancedTaken, 1);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, 1, 1, LEASE_WAIT_RECLAIMING_MS]);
  }
  // The answer comes during the longer wait: admitted by the grant, nothing taken in advance; or
  // the answer is "spent": refused.
  for (const spent of [false, true]) {
    const leases = new FakeLeases();
    leases.held = { requests: 0, tokens: Infinity };
    leases.reclaiming = true;
    const n = node(leases);
    const { reply, out } = n.admit(keyOf());
    advance(1000);
    assert.equal(out.calls, 0);
    if (spent) leases.keySpent();
    else leases.grantKey(3);
    await wakesRun();
    assert.equal(out.calls, 1);
    assert.equal(out.ctx instanceof RequestContext, !spent);
    assert.equal(reply.answers.length, spent ? 1 : 0);
    assert.equal(leases.advancedTaken, 0);
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(out.calls, 1, 'then is called once');
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, spent ? 0 : 1, 0, 1000]);
  }
});

test("short of this node's parallel slots: waits, then admitted on a slot, refused when every slot is in use, or takes one at the bound", async () => {
  const rows: Array<{ name: string; answer: (l: FakeLeases) => void; at: number; admitted: boolean; taken: number }> = [
    { name: 'slot granted', answer: (l) => l.slotAnswer(1), at: 30, admitted: true, taken: 0 },
    { name: 'every slot in use', answer: (l) => l.slotAnswer(0, true), at: 30, admitted: false, taken: 0 },
    { name: 'no answer', answer: () => {}, at: LEASE_WAIT_MS, admitted: true, taken: 1 },
  ];
  for (const row of rows) {
    const leases = new FakeLeases();
    leases.slots = { slots: 1, final: false };
    const n = node(leases);
    // The key's limit is 3 in flight; this node holds 1 slot, in use.
    assert.ok(n.admit(keyOf()).out.ctx instanceof RequestContext);
    const { reply, out } = n.admit(keyOf(), { close: true });
    assert.equal(out.calls, 0, `${row.name}: waits`);
    assert.equal(leases.slotWaiters.length, 1);
    advance(row.at);
    row.answer(leases);
    await wakesRun();
    assert.equal(out.calls, 1, row.name);
    assert.equal(out.ctx instanceof RequestContext, row.admitted, row.name);
    assert.equal(leases.slotsTaken, row.taken, row.name);
    assert.equal(leases.slotWaiters.length, 0, `${row.name}: no waiter left behind`);
    if (row.admitted) {
      assert.deepEqual(usage(n.keyBudgets), { requests: 2, tokens: 20, inFlight: 2 }, row.name);
    } else {
      assert.equal(reply.answers[0].status, 429);
      assert.deepEqual(reply.answers[0].body, {
        error: {
          message: 'Rate limit reached for max parallel requests: 3/3 in flight; requests per minute (rpm): 1/20; tokens per minute (tpm): 10/1000. Retry after 43 s.',
          type: 'max_parallel_requests',
          param: null,
          code: '429',
        },
      });
      assert.equal(reply.answers[0].closeConnection, true);
      assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 }, `${row.name}: nothing consumed`);
    }
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, row.admitted ? 1 : 0, row.taken, row.at], row.name);
  }
});

// ── tokens reserved after admission (a body read after it) ───────────────────

test('reserveOrWait: fits at once, refused over the key tpm, waits for the lease (granted, spent, late), client gone', async () => {
  const rows: Array<{
    name: string;
    held: MinuteAllowance;
    estimate: number;
    /** What happens while the request waits (undefined: it does not wait). */
    meanwhile?: (l: FakeLeases, reply: FakeReply) => Promise<void> | void;
    ok: boolean;
    answered: boolean;
    usage: { requests: number; tokens: number; inFlight: number };
    waited: number;
  }> = [
    { name: 'fits', held: { requests: Infinity, tokens: Infinity }, estimate: 100, ok: true, answered: false, usage: { requests: 1, tokens: 110, inFlight: 1 }, waited: 0 },
    { name: 'over tpm', held: { requests: Infinity, tokens: Infinity }, estimate: 2000, ok: false, answered: true, usage: { requests: 0, tokens: 0, inFlight: 0 }, waited: 0 },
    {
      name: 'granted',
      held: { requests: Infinity, tokens: 15 },
      estimate: 100,
      meanwhile: async (l) => {
        advance(60);
        l.grantKey(0, 200);
        await wakesRun();
      },
      ok: true,
      answered: false,
      usage: { requests: 1, tokens: 110, inFlight: 1 },
      waited: 1,
    },
    {
      name: 'spent',
      held: { requests: Infinity, tokens: 15 },
      estimate: 100,
      meanwhile: async (l) => {
        advance(60);
        l.keySpent();
        await wakesRun();
      },
      ok: false,
      answered: true,
      usage: { requests: 0, tokens: 0, inFlight: 0 },
      waited: 1,
    },
    { name: 'late', held: { requests: Infinity, tokens: 15 }, estimate: 100, meanwhile: () => advance(LEASE_WAIT_MS), ok: true, answered: false, usage: { requests: 1, tokens: 110, inFlight: 1 }, waited: 1 },
    {
      name: 'client gone',
      held: { requests: Infinity, tokens: 15 },
      estimate: 100,
      meanwhile: (_l, reply) => {
        advance(60);
        reply.abort();
        advance(LEASE_WAIT_MS);
      },
      ok: false,
      answered: false,
      usage: { requests: 0, tokens: 0, inFlight: 0 },
      waited: 1,
    },
  ];
  for (const row of rows) {
    const leases = new FakeLeases();
    leases.held = row.held;
    const n = node(leases);
    const key = keyOf();
    const { reply, out } = n.admit(key, { tokens: 10 });
    assert.ok(out.ctx instanceof RequestContext, row.name);
    const results: boolean[] = [];
    n.admission.reserveOrWait(out.ctx, reply as unknown as Reply, key, row.estimate, (ok) => results.push(ok));
    if (row.meanwhile) {
      assert.deepEqual(results, [], `${row.name}: waits`);
      await row.meanwhile(leases, reply);
    }
    assert.deepEqual(results, [row.ok], row.name);
    assert.deepEqual(usage(n.keyBudgets), row.usage, row.name);
    assert.equal(reply.answers.length, row.answered ? 1 : 0, row.name);
    assert.deepEqual(reply.touchedAfterDone, [], row.name);
    assert.equal(leases.keyWaiters.length, 0, `${row.name}: no waiter left behind`);
    if (row.answered) {
      const a = reply.answers[0];
      const retryAfter = secondsToNextMinute(clock.now());
      assert.equal(a.status, 429, row.name);
      assert.deepEqual(
        a.body,
        {
          error: {
            message: `Rate limit reached for tokens per minute (tpm): 10/1000 used, this request needs about ${row.estimate}; requests per minute (rpm): 0/20; max parallel requests: 0/3. Retry after ${retryAfter} s.`,
            type: 'tokens',
            param: null,
            code: '429',
          },
        },
        row.name,
      );
      assert.equal(header(a, 'retry-after'), String(retryAfter), row.name);
      // The rate headers are the key's once this request gave back what it held.
      assert.equal(reply.rateHeaders?.remainingRequests, 20, row.name);
    }
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(results.length, 1, `${row.name}: then is called once`);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted], [row.waited, row.waited && row.ok ? 1 : 0], row.name);
  }
});

// ── a client that went away ──────────────────────────────────────────────────

test('a client that went away while waiting: then(null), nothing consumed, the response never touched', async () => {
  const rows: Array<{ name: string; short: (l: FakeLeases) => void; after: (l: FakeLeases) => Promise<void> | void }> = [
    { name: 'key lease, bound runs out', short: (l) => (l.held = { requests: 0, tokens: Infinity }), after: () => advance(LEASE_WAIT_MS) },
    {
      name: 'key lease, grant comes',
      short: (l) => (l.held = { requests: 0, tokens: Infinity }),
      after: async (l) => {
        l.grantKey(5);
        await wakesRun();
      },
    },
    {
      name: 'key lease, reclaiming',
      short: (l) => {
        l.held = { requests: 0, tokens: Infinity };
        l.reclaiming = true;
      },
      after: () => advance(LEASE_WAIT_MS),
    },
    { name: 'money slice, bound runs out', short: (l) => (l.spend = 'wait'), after: () => advance(LEASE_WAIT_MS) },
    {
      name: 'money slice, nothing left',
      short: (l) => (l.spend = 'wait'),
      after: async (l) => {
        l.orgAnswer('no');
        await wakesRun();
      },
    },
  ];
  for (const row of rows) {
    const leases = new FakeLeases();
    row.short(leases);
    const n = node(leases);
    const { reply, out } = n.admit(keyOf());
    assert.equal(out.calls, 0, row.name);
    advance(50);
    reply.abort();
    await row.after(leases);
    assert.deepEqual(out, { calls: 1, ctx: null }, row.name);
    assert.deepEqual(reply.answers, [], row.name);
    assert.deepEqual(reply.touchedAfterDone, [], row.name);
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 }, row.name);
    assert.equal(leases.reserved, 0, row.name);
    assert.equal(leases.advancedTaken, 0, row.name);
    assert.equal(n.contexts.length, 0, row.name);
    assert.equal(leases.keyWaiters.length + leases.orgWaiters.length, 0, `${row.name}: no waiter left behind`);
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(out.calls, 1, `${row.name}: then is called once`);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced], [1, 0, 0], row.name);
  }
});

test('a client already gone when admission starts: then(null) at once, nothing consumed or answered', () => {
  for (const withLeases of [false, true]) {
    const leases = withLeases ? new FakeLeases() : null;
    const n = node(leases);
    const reply = new FakeReply();
    reply.abort();
    const { out } = n.admit(keyOf(), { reply });
    assert.deepEqual(out, { calls: 1, ctx: null });
    assert.deepEqual(reply.answers, []);
    assert.deepEqual(reply.touchedAfterDone, []);
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
    assert.equal(leases?.reserved ?? 0, 0);
    assert.equal(n.admission.waits.snapshot().waited, 0);
  }
});

// ── a handler that throws ────────────────────────────────────────────────────

test("a handler that throws once admitted: 500 in the family's error shape, what it took given back", async () => {
  // Before the fix admission answered this 500 in Shape A ('openai') whatever the family, so a tool
  // path (Shape B) or a pass-through path (Shape C) got a body of the wrong shape.
  const bodies: Record<ErrorShape, unknown> = {
    openai: { error: { message: 'Internal error.', type: 'api_error', param: null, code: '500' } },
    gateway: { error: { code: 'internal_error', message: 'Internal error.' } },
    passthrough: { detail: 'Internal error.' },
  };
  const logged = mock.method(log, 'error', () => {});
  for (const shape of ['openai', 'gateway', 'passthrough'] as const) {
    // Synchronously admitted, and admitted after a wait for the lease.
    for (const waits of [false, true]) {
      const leases = new FakeLeases();
      if (waits) leases.held = { requests: 0, tokens: Infinity };
      const n = node(leases);
      const reply = new FakeReply();
      let calls = 0;
      n.admission.admitOrWait(
        reply as unknown as Reply,
        keyOf(),
        '/v1/tools/pdf',
        10,
        () => {
          calls++;
          throw new Error('handler bug');
        },
        undefined,
        shape,
      );
      if (waits) {
        leases.grantKey(1);
        await wakesRun();
      }
      const what = `${shape}, waited: ${waits}`;
      assert.equal(calls, 1, what);
      assert.equal(reply.answers.length, 1, what);
      assert.equal(reply.answers[0].status, 500, what);
      assert.deepEqual(reply.answers[0].body, bodies[shape], what);
      assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 }, `${what}: the context ended with the response`);
    }
  }
  assert.equal(logged.mock.callCount(), 6, 'each bug is logged');
});

// ── the wait statistics ──────────────────────────────────────────────────────

test('WaitStats: counts, admitted, advanced only when admitted, percentiles, reset', () => {
  const w = new WaitStats();
  assert.deepEqual(w.snapshot(), { waited: 0, admitted: 0, advanced: 0, mean_ms: 0, p50_ms: 0, p99_ms: 0, max_ms: 0 });
  const rows: Array<[number, boolean, boolean]> = [
    [10, true, false],
    [250, true, true],
    [30, false, false],
    // Advanced but then refused (another limit): not counted as advanced.
    [250, false, true],
  ];
  for (let i = 1; i <= 100; i++) rows.push([i / 3, true, false]);
  for (const [ms, admitted, advanced] of rows) w.note(ms, admitted, advanced);
  const s = w.snapshot(true);
  assert.equal(s.waited, 104);
  assert.equal(s.admitted, 102);
  assert.equal(s.advanced, 1);
  assert.equal(s.max_ms, 250);
  const total = rows.reduce((t, [ms]) => t + ms, 0);
  assert.equal(s.mean_ms, Math.round((total / 104) * 100) / 100);
  const sorted = rows.map(([ms]) => ms).sort((a, b) => a - b);
  assert.equal(s.p50_ms, Math.round(sorted[52] * 100) / 100);
  assert.equal(s.p99_ms, Math.round(sorted[102] * 100) / 100);
  assert.deepEqual(w.snapshot(), { waited: 0, admitted: 0, advanced: 0, mean_ms: 0, p50_ms: 0, p99_ms: 0, max_ms: 0 }, 'reset');
});

test('the wait statistics of admission: only requests that waited, each once, with how they ended', async () => {
  const leases = new FakeLeases();
  leases.held = { requests: 0, tokens: Infinity };
  const n = node(leases);
  // 1: waits 100 ms, granted.
  const a = n.admit(keyOf());
  advance(100);
  leases.grantKey(1);
  await wakesRun();
  assert.ok(a.out.ctx);
  // 2: synchronous (within the grant): not a wait.
  leases.grantKey(1);
  assert.ok(n.admit(keyOf()).out.ctx);
  // 3: waits 250 ms, admitted in advance.
  const c = n.admit(keyOf());
  advance(LEASE_WAIT_MS);
  assert.ok(c.out.ctx);
  // 4: refused at once for the key's own rpm: not a wait.
  assert.equal(n.admit(keyOf({ rpmLimit: 3 })).out.ctx, null);
  // 5: the client left while waiting.
  leases.grantKey(0);
  const e = n.admit(keyOf());
  assert.equal(e.out.calls, 0);
  advance(20);
  e.reply.abort();
  advance(LEASE_WAIT_MS);
  assert.equal(e.out.ctx, null);
  const s = n.admission.waits.snapshot();
  assert.deepEqual(s, { waited: 3, admitted: 2, advanced: 1, mean_ms: (100 + 250 + 250) / 3, p50_ms: 250, p99_ms: 250, max_ms: 250 });
});
