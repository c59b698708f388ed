// Fakes for the unit tests of admission (data-plane/request/admission.ts): a reply that records what was
// answered, a lease client scripted by the test, a node (real key budgets and admission) built on them,
// and the clocks. Time moves only when a test moves it: the clock is a ManualClock, setTimeout is
// node:test's mock timers, and performance.now follows them; a test file calls `useManualTime()` once.
import { afterEach, beforeEach, mock } from 'node:test';
import type { KeyRecord } from '../../data-plane/state/key-table.js';
import { Admission } from '../../data-plane/request/admission.js';
import { errorShape, renderError, type ErrorShape } from '../../data-plane/error-shapes.js';
import type { Reply } from '../../data-plane/request/reply.js';
import { RequestContext } from '../../data-plane/request/request-context.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets, type AllowanceSource, type KeyLimits, type MinuteAllowance } from '../../data-plane/limits/key-budgets.js';
import { type RateHeaders } from '../../data-plane/limits/rate-headers.js';
import type { LeaseClient } from '../../data-plane/leases/lease-client.js';
import type { SpendReservation, SpendVerdict } from '../../data-plane/leases/lease-money.js';

/** 17 s into a minute: every 429 says retry-after 43. */
export const T0 = Date.UTC(2025, 0, 1, 12, 0, 17);

// ── time ─────────────────────────────────────────────────────────────────────

/** performance.now() as admission reads it: moved by `advance` with the mock timers and the clock. */
let perfNow = 0;
export let clock: ManualClock;

/** Registers, in the calling test file, the hooks that give each test a fresh clock at T0 and mocked timers. */
export function useManualTime(): void {
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
}

/** Moves every clock by `ms` in 10 ms steps (mock timers run a tick's timers at its end time). */
export function advance(ms: number): void {
  for (let left = ms; left > 0; left -= 10) {
    const step = Math.min(10, left);
    perfNow += step;
    clock.advance(step);
    mock.timers.tick(step);
  }
}

/** Lets the wakes run: admission continues on a fresh tick (setImmediate, not mocked), queued before this. */
export const wakesRun = () => new Promise<void>((resolve) => setImmediate(resolve));

// ── fakes ────────────────────────────────────────────────────────────────────

/** The part of Reply admission (and RequestContext.attach) uses. */
type ReplyUsed = Pick<Reply, 'done' | 'requestId' | 'rateHeaders' | 'sendError' | 'onFinish' | 'logDraft' | 'open'>;

export interface Answer {
  status: number;
  headers: Array<[string, string]>;
  body: unknown;
  closeConnection: boolean;
}

/** Records the answer as Reply.sendError renders it (error-shapes.ts); notes any touch after `done`. */
export class FakeReply implements ReplyUsed {
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
  /** The path's error shape, as the gate sets a Reply's. */
  shape: ErrorShape = 'openai';
  sendError(err: unknown, closeConnection = false): void {
    if (this.done) {
      this.touchedAfterDone.push('sendError');
      return;
    }
    const r = renderError(err, errorShape(err, this.shape));
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
  | 'mayAdvance'
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
export class FakeLeases implements LeasesUsed, AllowanceSource {
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
  reserveSpend(_orgId: string, inAdvance = false): SpendReservation | undefined {
    this.reserved++;
    if (inAdvance) this.reservedInAdvance++;
    return { epoch: 1, micros: 0 };
  }
  /** What `mayAdvance` says: within what the control plane said may be taken in advance of a late answer. */
  advanceAllowed = true;
  /** Reservations taken in advance of a late answer (reserveSpend `inAdvance`). */
  reservedInAdvance = 0;
  mayAdvance(): boolean {
    return this.advanceAllowed;
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

export function keyOf(limits: Partial<KeyLimits> = {}): KeyRecord {
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

export function node(leases: FakeLeases | null) {
  const keyBudgets = new KeyBudgets(clock, leases ? { allowance: leases } : {});
  const contexts: Array<{ path: string; minute: number; requestId: string }> = [];
  const admission = new Admission({ clock, keyBudgets, leases: leases ? (leases as unknown as LeaseClient) : undefined }, (key, path, ticket, minute, requestId) => {
    contexts.push({ path, minute, requestId });
    return new RequestContext({ clock, reporter: { record() {} } }, requestId, key, path, ticket, minute);
  });
  /** Starts one admission; `out` tells whether and how `then` was called so far. */
  const admit = (key: KeyRecord, opts: { reply?: FakeReply; tokens?: number; shape?: ErrorShape; close?: boolean } = {}) => {
    const reply = opts.reply ?? new FakeReply();
    if (opts.shape) reply.shape = opts.shape;
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
    );
    return { reply, out };
  };
  return { keyBudgets, admission, contexts, admit };
}

export function usage(kb: KeyBudgets) {
  const { requests, tokens, inFlight } = kb.usage('key_a');
  return { requests, tokens, inFlight };
}

export function header(a: Answer, name: string): string | undefined {
  return a.headers.find(([k]) => k === name)?.[1];
}
