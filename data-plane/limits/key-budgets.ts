// Key budgets: requests per minute (rpm), tokens per minute (tpm) and parallel requests per API key,
// as fixed on the key (spec, Limits → Gateway; docs/design.md#gateway-window). Pure and I/O-free; per node,
// in memory. The HTTP layer calls `admit` after authentication, answers 429 on a refusal, and calls
// `ticket.settle(actualTokens)` exactly when the request ends, however it ends (completion, client
// abort, upstream error or timeout, WebSocket close). Settling twice is harmless.
//
// Decisions:
// - Window: UTC clock minutes (`minuteOf(now)`); every refusal's `retry-after` (rpm, tpm and parallel)
//   is the seconds to the top of the next minute, rounded up, at least 1 (spec, Response headers).
// - Order of checks: requests, tokens, then parallel. The minute budgets come first because their
//   retry-after is the longer, truthful wait: a client told "1 s, parallel" would come back only to be
//   refused for the minute.
// - tpm: tokens used and reserved this minute + this request's estimate must stay ≤ tpm, so a single
//   request whose estimate alone exceeds tpm is refused. The estimate is reserved on admission and
//   replaced by the real usage on settle, in the minute the request was admitted in if that minute is
//   still current (a request that ends in a later minute leaves that later minute untouched). Only the
//   prompt is reserved (the one estimator of proxy/tokens.ts): reserving the completion ceiling
//   (max_tokens) would refuse most requests of a low-tpm key, and settle() reconciles right after.
// - A refused request consumes nothing (no request, no tokens, no slot).
// - A limit ≤ 0 or not finite means "no limit" on that dimension (a key without an rpm/tpm limit); its
//   headers then report limit 0, and `rateHeaderPairs` leaves them out.
import { type Clock, minuteOf, secondsToNextMinute } from './clock.js';
import { Fifo } from './fifo.js';
import type { RateHeaders } from './rate-headers.js';

export interface KeyLimits {
  keyId: string;
  rpmLimit: number;
  tpmLimit: number;
  maxParallel: number;
}

export interface Ticket {
  /** Idempotent: releases the parallel slot and reconciles tokens. A non-finite or negative value keeps the estimate. */
  settle(actualTokens: number): void;
  /**
   * For a request refused by a later check (validation, model scope) before any upstream call: it
   * consumes no request, no tokens and no slot (docs/design.md#concurrency-slots). Ends the ticket.
   */
  refund(): void;
  /**
   * Adds tokens to the reservation of an admitted request whose body was read after admission (the
   * parallel slot and the request are taken before a body is buffered). Refused without changing
   * anything when they do not fit the key's tpm or this node's slice; the caller then refunds.
   */
  reserveTokens(tokens: number): TokenRefusal | null;
}

export interface TokenRefusal {
  dimension: 'tokens';
  message: string;
  retryAfterSec: number;
  /** Set when only this node's lease is short (the key's budget may still have it): what to ask for. */
  leaseShort?: LeaseShort;
}

/** How much more of the key's minute (or of its parallel slots) this node must lease before the request fits. */
export interface LeaseShort {
  requests: number;
  tokens: number;
  /** A parallel-request slot is what is short. */
  slot?: boolean;
}

export type KeyDimension = 'requests' | 'tokens' | 'max_parallel_requests';

/**
 * How a request is admitted besides its estimate. `slot: false`: a turn on a socket that already holds
 * the key's parallel slot (one response at a time per connection) takes none of its own. `force`: a
 * turn the upstream already began on its own (a realtime response started by voice activity) is
 * counted even past the limits: the work is being done, so it is billed and counted, never refused.
 */
export interface AdmitOptions {
  slot?: boolean;
  force?: boolean;
}

export type Admission =
  | { ok: true; ticket: Ticket; headers: RateHeaders }
  | { ok: false; dimension: KeyDimension; message: string; retryAfterSec: number; headers: RateHeaders; leaseShort?: LeaseShort };

/**
 * Seam for a later lease mechanism (docs/design.md#money-and-limits-across-nodes): caps what THIS node
 * may admit for a key in a clock minute, e.g. the slice of the key's minute budget the control plane
 * leased to it. Without a source, a node admits against the key's full limits.
 * Called on the hot path: synchronous and O(1), no I/O (a lease client fetches slices in the background).
 */
export interface AllowanceSource {
  /**
   * The most requests and tokens this node may admit for the key in `minute` (Infinity = no extra cap).
   * `limits` are the key's own limits, for a source that sizes slices from them.
   */
  allowanceFor(keyId: string, minute: number, limits?: KeyLimits): MinuteAllowance;
  /**
   * Told this node's running totals for the key's minute after every admission and settlement, so a
   * lease client can ask for the next slice before the current one runs out and return what is unused.
   */
  noteUsage?(keyId: string, minute: number, requests: number, tokens: number): void;
  /** What `allowanceFor` would say, without starting anything (undefined: nothing known yet). */
  peekAllowance?(keyId: string, minute: number): MinuteAllowance | undefined;
  /**
   * The most requests of the key this node may have in flight (leased parallel slots; undefined: the
   * key's own limit). `final`: every slot of the key is in use across the cluster.
   */
  slotsFor?(keyId: string, limits: KeyLimits, startedAt?: number): { slots: number; final: boolean } | undefined;
  /** Told the key's requests in flight on this node after every admission and every end. */
  noteInFlight?(keyId: string, inFlight: number, maxParallel: number): void;
}

export interface MinuteAllowance {
  requests: number;
  tokens: number;
  /** True when the key's minute pool has no request left across the cluster (after reclaiming). */
  requestsFinal?: boolean;
  /** A token need at least this large cannot be leased this minute (after reclaiming). */
  tokensFinalNeed?: number;
  /**
   * What the control plane last said the key's other holders (other nodes, nodes gone) used of the
   * minute: the rate headers count it as used (absent: nothing heard, or no other nodes).
   */
  othersUsedRequests?: number;
  othersUsedTokens?: number;
}

export interface KeyBudgetsOptions {
  /** Caps admissions per key and minute below the key's limits (leases). */
  allowance?: AllowanceSource;
  /** A key with nothing in flight and not admitted for this many minutes is forgotten. Default 2. */
  idleMinutes?: number;
}

interface KeyState {
  keyId: string;
  /** The minute `requests` and `tokens` count in. */
  minute: number;
  requests: number;
  /** Tokens reserved (estimates of requests in flight) plus tokens used (settled) in `minute`. */
  tokens: number;
  inFlight: number;
  /** Last minute a request of this key was admitted in (or it was last found busy by the sweep). */
  seenMinute: number;
}

/** At most this many idle keys are examined per call, so no request pays for a long sweep. */
const SWEEP_STEP = 16;

export class KeyBudgets {
  private readonly states = new Map<string, KeyState>();
  /** (key, minute it was admitted in), oldest first: what the idle sweep walks. */
  private readonly seen = new Fifo<{ state: KeyState; minute: number }>();
  private readonly allowance: AllowanceSource | undefined;
  private readonly idleMinutes: number;

  constructor(
    private readonly clock: Clock,
    opts: KeyBudgetsOptions = {},
  ) {
    this.allowance = opts.allowance;
    this.idleMinutes = Math.max(1, Math.floor(opts.idleMinutes ?? 2));
  }

  /**
   * Admits one request of the key reserving `estimatedTokens`, or refuses it without consuming
   * anything. `startedAt` (performance.now()): when the request first asked, for leased slots.
   */
  admit(limits: KeyLimits, estimatedTokens: number, startedAt?: number, opts?: AdmitOptions): Admission {
    const now = this.clock.now();
    const slot = opts?.slot !== false;
    const force = opts?.force === true;
    const minute = minuteOf(now);
    this.sweep(minute);
    const estimate = sanitizeTokens(estimatedTokens) ?? 0;
    const state = this.stateFor(limits.keyId, minute);

    const rpm = limitOf(limits.rpmLimit);
    const tpm = limitOf(limits.tpmLimit);
    const parallel = limitOf(limits.maxParallel);
    const lease = this.allowance?.allowanceFor(limits.keyId, minute, limits);

    let dimension: KeyDimension | undefined;
    let leaseShort: LeaseShort | undefined;
    let clusterFull = false;
    const retryAfterSec = secondsToNextMinute(now);
    if (force) {
      // counted below whatever the limits say
    } else if (state.requests + 1 > rpm) {
      dimension = 'requests';
    } else if (state.tokens + estimate > tpm) {
      dimension = 'tokens';
    } else if (lease !== undefined && (state.requests + 1 > lease.requests || state.tokens + estimate > lease.tokens)) {
      // Under the key's limits but out of this node's lease: the caller may wait for more, unless the
      // pool already said it is spent across the cluster.
      const needRequests = Math.max(0, state.requests + 1 - lease.requests);
      const needTokens = Math.max(0, state.tokens + estimate - lease.tokens);
      dimension = needRequests > 0 ? 'requests' : 'tokens';
      const final = (needRequests > 0 && lease.requestsFinal) || (needTokens > 0 && needTokens >= (lease.tokensFinalNeed ?? Infinity));
      if (!final) leaseShort = { requests: needRequests, tokens: needTokens };
    } else if (!slot) {
      // the socket's slot covers the turn
    } else if (state.inFlight + 1 > parallel) {
      dimension = 'max_parallel_requests';
    } else {
      const slots = this.allowance?.slotsFor?.(limits.keyId, limits, startedAt);
      if (slots !== undefined && state.inFlight + 1 > slots.slots) {
        // Under the key's parallel limit but out of this node's slots: wait for one unless every slot
        // of the key is in use across the cluster.
        dimension = 'max_parallel_requests';
        if (slots.final) clusterFull = true;
        else leaseShort = { requests: 0, tokens: 0, slot: true };
      }
    }
    if (dimension !== undefined) {
      const headers = headersOf(state, limits, now, lease, leaseShort === undefined && dimension !== 'max_parallel_requests');
      // The message reports the key across the cluster as far as this node knows (as the headers do),
      // not this node's own share: "20/20 used", never "15/20 used" when the minute is spent.
      const shown = {
        requests: rpm === Infinity ? state.requests : Math.max(state.requests, rpm - headers.remainingRequests),
        tokens: tpm === Infinity ? state.tokens : Math.max(state.tokens, tpm - headers.remainingTokens),
        inFlight: clusterFull ? parallel : state.inFlight,
      };
      return { ok: false, dimension, message: formatLimitMessage(dimension, shown, limits, estimate, retryAfterSec), retryAfterSec, headers, leaseShort };
    }

    state.requests += 1;
    state.tokens += estimate;
    if (slot) state.inFlight += 1;
    this.touch(state, minute);
    this.allowance?.noteUsage?.(state.keyId, state.minute, state.requests, state.tokens);
    if (slot) this.allowance?.noteInFlight?.(state.keyId, state.inFlight, limits.maxParallel);
    return { ok: true, ticket: new KeyTicket(this.clock, this.allowance, state, limits, minute, estimate, slot), headers: headersOf(state, limits, now, lease) };
  }

  /** The rate headers of a key for the current minute, without counting anything. */
  headers(limits: KeyLimits): RateHeaders {
    const now = this.clock.now();
    const minute = minuteOf(now);
    const state = this.states.get(limits.keyId);
    // Peeking only: asking the lease source would start a lease for a key that may never be admitted.
    const lease = this.allowance?.peekAllowance?.(limits.keyId, minute);
    if (state === undefined || state.minute !== minute) {
      return headersOf({ requests: 0, tokens: 0 }, limits, now, lease);
    }
    return headersOf(state, limits, now, lease);
  }

  /** This minute's counts and the requests in flight of a key. For tests, metrics and lease reports. */
  usage(keyId: string): { minute: number; requests: number; tokens: number; inFlight: number } {
    const minute = minuteOf(this.clock.now());
    const s = this.states.get(keyId);
    if (s === undefined) return { minute, requests: 0, tokens: 0, inFlight: 0 };
    const current = s.minute === minute;
    return { minute, requests: current ? s.requests : 0, tokens: current ? s.tokens : 0, inFlight: s.inFlight };
  }

  /** How many keys have state held. For tests and metrics. */
  trackedKeys(): number {
    return this.states.size;
  }

  private stateFor(keyId: string, minute: number): KeyState {
    let state = this.states.get(keyId);
    if (state === undefined) {
      state = { keyId, minute, requests: 0, tokens: 0, inFlight: 0, seenMinute: minute };
      this.states.set(keyId, state);
      this.seen.push({ state, minute });
    } else if (state.minute !== minute) {
      // Old minute state is dropped lazily, when the key is next seen. In-flight slots carry over.
      state.minute = minute;
      state.requests = 0;
      state.tokens = 0;
    }
    return state;
  }

  // Queue the key once per minute it is admitted in: the queue stays ordered by minute at O(1) per admit.
  private touch(state: KeyState, minute: number): void {
    if (state.seenMinute === minute) return;
    state.seenMinute = minute;
    this.seen.push({ state, minute });
  }

  // Forget keys idle for `idleMinutes`. Queue entries older than a key's latest are skipped. A key with
  // requests in flight is kept (its tickets still point at it) and queued again for later.
  private sweep(minute: number): void {
    for (let steps = 0; steps < SWEEP_STEP; steps++) {
      const entry = this.seen.peek();
      if (entry === undefined || minute - entry.minute < this.idleMinutes) return;
      this.seen.shift();
      const s = entry.state;
      if (s.seenMinute !== entry.minute || this.states.get(s.keyId) !== s) continue;
      if (s.inFlight > 0) {
        s.seenMinute = minute;
        this.seen.push({ state: s, minute });
      } else {
        this.states.delete(s.keyId);
      }
    }
  }

}

/** One admitted request's hold on its key's budgets (a class: no closures per request). */
class KeyTicket implements Ticket {
  private settled = false;

  constructor(
    private readonly clock: Clock,
    private readonly allowance: AllowanceSource | undefined,
    private readonly state: KeyState,
    private readonly limits: KeyLimits,
    private readonly minute: number,
    private estimate: number,
    /** False for a socket turn: the socket holds the slot, the turn releases none. */
    private readonly slot: boolean,
  ) {}

  reserveTokens(tokens: number): TokenRefusal | null {
    const { state, limits, minute } = this;
    const n = sanitizeTokens(tokens) ?? 0;
    // Settled, or admitted in a minute that has since ended: nothing of this minute to reserve in.
    if (this.settled || n === 0 || state.minute !== minute) return null;
    const now = this.clock.now();
    const lease = this.allowance?.allowanceFor(limits.keyId, minute, limits);
    const retryAfterSec = secondsToNextMinute(now);
    let leaseShort: LeaseShort | undefined;
    if (state.tokens + n > limitOf(limits.tpmLimit)) {
      // over the key's own tpm: the wait is to the top of the minute
    } else if (lease !== undefined && state.tokens + n > lease.tokens) {
      const needTokens = state.tokens + n - lease.tokens;
      if (needTokens < (lease.tokensFinalNeed ?? Infinity)) leaseShort = { requests: 0, tokens: needTokens };
    } else {
      state.tokens += n;
      this.estimate += n;
      this.allowance?.noteUsage?.(state.keyId, minute, state.requests, state.tokens);
      return null;
    }
    // The message reports the key as it will be once this request is refunded.
    const counts = { requests: state.requests - 1, tokens: state.tokens, inFlight: state.inFlight - 1 };
    return { dimension: 'tokens', message: formatLimitMessage('tokens', counts, limits, n, retryAfterSec), retryAfterSec, leaseShort };
  }

  settle(actualTokens: number): void {
    if (this.settled) return;
    this.settled = true;
    const { state, minute } = this;
    this.releaseSlot();
    const actual = sanitizeTokens(actualTokens) ?? this.estimate;
    if (state.minute === minute && actual !== this.estimate) {
      state.tokens = Math.max(0, state.tokens + actual - this.estimate);
    }
    if (state.minute === minute) this.allowance?.noteUsage?.(state.keyId, minute, state.requests, state.tokens);
  }

  refund(): void {
    if (this.settled) return;
    this.settled = true;
    const { state, minute } = this;
    this.releaseSlot();
    if (state.minute === minute) {
      state.requests = Math.max(0, state.requests - 1);
      state.tokens = Math.max(0, state.tokens - this.estimate);
    }
  }

  private releaseSlot(): void {
    if (!this.slot) return;
    const state = this.state;
    state.inFlight = Math.max(0, state.inFlight - 1);
    this.allowance?.noteInFlight?.(state.keyId, state.inFlight, this.limits.maxParallel);
  }
}

function limitOf(n: number): number {
  return Number.isFinite(n) && n > 0 ? Math.floor(n) : Infinity;
}

/** A whole, non-negative token count, or undefined for anything else. */
function sanitizeTokens(n: number): number | undefined {
  return typeof n === 'number' && Number.isFinite(n) && n >= 0 ? Math.ceil(n) : undefined;
}

/**
 * Remaining = what the key has left across the cluster as far as this node knows (docs/leases.md,
 * "Rate headers"): the key's limit minus this node's own count minus what the control plane last said
 * the other nodes used. What this node or another holds unused is not used, so it is never taken
 * off: an admitted request takes exactly one off, whatever the node holds. `spent`: the refusal says
 * the key's minute is spent across the cluster: 0 remaining.
 */
function headersOf(counts: { requests: number; tokens: number }, limits: KeyLimits, nowMs: number, lease?: MinuteAllowance, spent = false): RateHeaders {
  const rpm = limitOf(limits.rpmLimit);
  const tpm = limitOf(limits.tpmLimit);
  let remainingRequests = rpm - counts.requests - (lease?.othersUsedRequests ?? 0);
  const remainingTokens = tpm - counts.tokens - (lease?.othersUsedTokens ?? 0);
  if (spent && lease?.requestsFinal) remainingRequests = 0;
  return {
    limitRequests: rpm === Infinity ? 0 : rpm,
    remainingRequests: rpm === Infinity ? 0 : Math.max(0, remainingRequests),
    limitTokens: tpm === Infinity ? 0 : tpm,
    remainingTokens: tpm === Infinity ? 0 : Math.max(0, remainingTokens),
    resetSec: secondsToNextMinute(nowMs),
  };
}

function ofLimit(current: number, limit: number): string {
  return `${current}/${limitOf(limit) === Infinity ? 'unlimited' : limitOf(limit)}`;
}

/**
 * The 429 message: the tripped dimension first, then current and limit values of all three, e.g.
 * `Rate limit reached for requests per minute (rpm): 20/20 used; tokens per minute (tpm): 1234/60000;
 * max parallel requests: 1/100. Retry after 17 s.`
 */
export function formatLimitMessage(
  dimension: KeyDimension,
  counts: { requests: number; tokens: number; inFlight: number },
  limits: KeyLimits,
  estimate: number,
  retryAfterSec: number,
): string {
  const rpm = `requests per minute (rpm): ${ofLimit(counts.requests, limits.rpmLimit)}`;
  const tpm = `tokens per minute (tpm): ${ofLimit(counts.tokens, limits.tpmLimit)}`;
  const par = `max parallel requests: ${ofLimit(counts.inFlight, limits.maxParallel)}`;
  let parts: string[];
  if (dimension === 'requests') parts = [`${rpm} used`, tpm, par];
  else if (dimension === 'tokens') parts = [`${tpm} used, this request needs about ${estimate}`, rpm, par];
  else parts = [`${par} in flight`, rpm, tpm];
  return `Rate limit reached for ${parts.join('; ')}. Retry after ${retryAfterSec} s.`;
}

// Rendered elsewhere, re-exported for the modules that import them from here: the rate headers
// (rate-headers.ts) and the one token estimator (proxy/tokens.ts, docs/design.md#token-estimates).
