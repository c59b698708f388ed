// A pooled model's deployments on one node (issue 36): which one a request goes to, chosen in memory
// with no round trip, and each one's health. Pure: the clock, the random draw and the leases are injected.
//
// Choice: among the deployments not yet tried by the request that are available (not drained or
// disabled by the operator; circuit closed, or
// half-open with no probe out; not cooling after a 429; room in their own parallel, rpm and tpm limits,
// counted on this node per UTC minute, and in what this node holds of the deployment's minute across
// the cluster: the key-minute leases, docs/leases.md#minute-pools-by-id), the least loaded (in flight
// per unit of weight), and among equally loaded ones a draw by weight.
//
// Health: `circuitFailures` consecutive failures open a deployment's circuit for `circuitCooldownMs`;
// then one real request at a time probes it (half-open): a success closes it, a failure opens it again.

import type { KeyLimits, MinuteAllowance } from '../limits/key-budgets.js';

/**
 * The node's minute leases (LeaseClient, data-plane/leases/), as the pool uses them for its
 * deployments' rpm and tpm: what this node may send to a deployment in a minute across the cluster.
 */
export interface MinuteLeases {
  allowanceFor(poolId: string, minute: number, limits: KeyLimits): MinuteAllowance;
  noteUsage(poolId: string, minute: number, requests: number, tokens: number): void;
  /** Asks for at least the need; `wake` once when an answer came. False: nothing to wait for. */
  waitForKey(poolId: string, minute: number, limits: KeyLimits, needRequests: number, needTokens: number, wake: () => void): boolean;
  cancelKeyWait(poolId: string, wake: () => void): void;
  /** Takes the need in advance of a late answer (docs/leases.md), told to the control plane. */
  advanceKey(poolId: string, minute: number, limits: KeyLimits, needRequests: number, needTokens: number, timedOut: boolean): boolean;
  /** The control plane said the answer waits for reclaims (or for nodes to rejoin): not late yet. */
  answerDeferred(startedAt: number): boolean;
}

/** What this node knows of one deployment; kept across config versions (keyed by model and id). */
export class DeploymentState {
  inFlight = 0;
  /** Consecutive failures (connect errors, timeouts before the head, 5xx). */
  failures = 0;
  /** 0: circuit closed; else open until then (ms), half-open after. */
  openUntil = 0;
  /** A half-open probe is out. */
  probing = false;
  /** An upstream 429's retry-after: not chosen until then (ms). */
  coolUntil = 0;
  /** Requests and tokens sent in `minute` (UTC minutes since the epoch). */
  minute = -1;
  requests = 0;
  tokens = 0;
  /** For the metrics (pool-metrics.ts): requests sent, failed over from, errors by kind. */
  sent = 0;
  failovers = 0;
  readonly errors = new Map<string, number>();
  /** Errors by kind in `errorsMinute` and the minute before it (`tollgate models status`). */
  errorsMinute = -1;
  minuteErrors = new Map<string, number>();
  lastMinuteErrors = new Map<string, number>();
  constructor(
    readonly id: string,
    /** The URL the counts are of: another URL is another upstream, its state new. */
    readonly baseUrl = '',
  ) {}

  /** A failed attempt of `kind` in UTC minute `minute`. */
  noteError(kind: string, minute: number): void {
    this.errors.set(kind, (this.errors.get(kind) ?? 0) + 1);
    if (minute !== this.errorsMinute) {
      this.lastMinuteErrors = minute === this.errorsMinute + 1 ? this.minuteErrors : new Map();
      this.minuteErrors = new Map();
      this.errorsMinute = minute;
    }
    this.minuteErrors.set(kind, (this.minuteErrors.get(kind) ?? 0) + 1);
  }

  /** Errors by kind in UTC minute `minute` and the one before. */
  recentErrors(minute: number): Map<string, number> {
    const out = new Map<string, number>();
    const add = (m: Map<string, number>) => {
      for (const [k, n] of m) out.set(k, (out.get(k) ?? 0) + n);
    };
    if (this.errorsMinute === minute) {
      add(this.minuteErrors);
      add(this.lastMinuteErrors);
    } else if (this.errorsMinute === minute - 1) add(this.minuteErrors);
    return out;
  }
}

export interface PoolMember {
  state: DeploymentState;
  weight: number;
  /** The upstream account's own limits; 0: none. */
  rpm: number;
  tpm: number;
  maxParallel: number;
  /** Its minute pool in the leases (a deployment with an rpm or tpm), with the limits it is leased by. */
  lease?: { poolId: string; limits: KeyLimits };
  /**
   * Drained or disabled by the operator (ModelDeployment.state): never chosen, but a request pinned to
   * a drained one (what it names lives there, affinity) still goes to it; a disabled one takes none.
   */
  steered?: '' | 'drained' | 'disabled';
}

export interface PoolSettings {
  circuitFailures: number;
  circuitCooldownMs: number;
}

export type CircuitState = 'closed' | 'open' | 'half-open';

/** When every deployment is unavailable: whether it is for capacity (limits, cooling) and when one has room again. */
export interface NoneAvailable {
  capacity: boolean;
  retryAfterMs: number;
  /** Deployments short only of this node's lease (the cluster may have room): worth an ask. */
  leaseShort: number[];
}

/** What blockedFor answers for a deployment short only of this node's lease: no known time. */
const LEASE_SHORT = -Infinity;

const MINUTE_MS = 60_000;
/** What a full parallel limit is retried after: a request ends soon, and no end time is known. */
const PARALLEL_RETRY_MS = 1_000;

export class UpstreamPool {
  constructor(
    readonly members: readonly PoolMember[],
    private readonly settings: PoolSettings,
    private readonly now: () => number,
    private readonly random: () => number = Math.random,
    /** Absent: each deployment's rpm and tpm are counted on this node only. */
    private readonly leases?: MinuteLeases,
  ) {}

  circuit(i: number): CircuitState {
    const s = this.members[i].state;
    if (s.openUntil === 0) return 'closed';
    return this.now() < s.openUntil ? 'open' : 'half-open';
  }

  /**
   * The index of the deployment to try next, or -1 when none of the untried ones is available.
   * `pinned`: the request may go to one deployment only (`tried` names every other): drained is no bar.
   */
  choose(tried: readonly number[], tokens: number, pinned = false): number {
    const members = this.members;
    let best = Infinity;
    let weights = 0;
    // First pass: the lowest load among the available; second: a draw by weight among those at it.
    for (let i = 0; i < members.length; i++) {
      if (tried.includes(i) || this.blockedFor(i, tokens, pinned) !== 0) continue;
      const m = members[i];
      const load = m.state.inFlight / m.weight;
      if (load < best) {
        best = load;
        weights = m.weight;
      } else if (load === best) weights += m.weight;
    }
    if (best === Infinity) return -1;
    let r = this.random() * weights;
    let last = -1;
    for (let i = 0; i < members.length; i++) {
      if (tried.includes(i) || this.blockedFor(i, tokens, pinned) !== 0) continue;
      const m = members[i];
      if (m.state.inFlight / m.weight !== best) continue;
      last = i;
      r -= m.weight;
      if (r < 0) return i;
    }
    return last;
  }

  /** Why no untried deployment is available, and the earliest time one will be. */
  whyNone(tried: readonly number[], tokens: number, pinned = false): NoneAvailable {
    let capacity = false;
    let retryAfterMs = Infinity;
    const leaseShort: number[] = [];
    for (let i = 0; i < this.members.length; i++) {
      if (tried.includes(i) || this.passedOver(i, pinned)) continue;
      const wait = this.blockedFor(i, tokens, pinned);
      if (wait === 0) continue;
      if (wait === LEASE_SHORT) {
        leaseShort.push(i);
        continue;
      }
      if (wait > 0) capacity = true;
      retryAfterMs = Math.min(retryAfterMs, Math.abs(wait));
    }
    return { capacity, retryAfterMs: retryAfterMs === Infinity ? 0 : retryAfterMs, leaseShort };
  }

  /**
   * Deployment i is short of this node's lease: asks for what the request needs and calls `wake`
   * once when an answer came. False: nothing to wait for (the cluster's minute is spent, or an
   * earlier want went unanswered past the bound: advanceLease then takes it).
   */
  waitLease(i: number, tokens: number, wake: () => void): boolean {
    const need = this.leaseNeed(i, tokens);
    return need !== null && this.leases!.waitForKey(need.poolId, need.minute, need.limits, need.requests, need.tokens, wake);
  }

  /**
   * Admission in advance of a late answer (docs/leases.md), as for a key: `timedOut`, the request
   * waited the whole bound (or an earlier want of the minute did) and the control plane did not say
   * the minute is spent; the need is taken, within the deployment's own limits counted on this node
   * (blockedFor checks them first), and told to the control plane. True when taken.
   */
  advanceLease(i: number, tokens: number, timedOut: boolean): boolean {
    const need = this.leaseNeed(i, tokens);
    return need !== null && this.leases!.advanceKey(need.poolId, need.minute, need.limits, need.requests, need.tokens, timedOut);
  }

  /** What deployment i's lease lacks for a request of `tokens` now (null: no lease). */
  private leaseNeed(i: number, tokens: number): { poolId: string; minute: number; limits: KeyLimits; requests: number; tokens: number } | null {
    const m = this.members[i];
    if (!this.leases || !m.lease) return null;
    const minute = Math.floor(this.now() / MINUTE_MS);
    const s = m.state;
    const a = this.leases.allowanceFor(m.lease.poolId, minute, m.lease.limits);
    const requests = Math.max(0, (s.minute === minute ? s.requests : 0) + 1 - a.requests);
    const need = Math.max(0, (s.minute === minute ? s.tokens : 0) + tokens - a.tokens);
    return { poolId: m.lease.poolId, minute, limits: m.lease.limits, requests, tokens: need };
  }

  cancelLeaseWait(i: number, wake: () => void): void {
    const lease = this.members[i].lease;
    if (this.leases && lease) this.leases.cancelKeyWait(lease.poolId, wake);
  }

  /** The control plane said its answer waits for reclaims since `startedAt`: keep waiting. */
  leaseDeferred(startedAt: number): boolean {
    return this.leases?.answerDeferred(startedAt) ?? false;
  }

  /** A request goes to deployment i: counted in flight and in its minute; a half-open one is probed. */
  begin(i: number, tokens: number): void {
    const s = this.members[i].state;
    this.roll(s);
    s.inFlight++;
    s.sent++;
    s.requests++;
    s.tokens += tokens;
    if (s.openUntil !== 0) s.probing = true;
    const lease = this.members[i].lease;
    if (this.leases && lease) this.leases.noteUsage(lease.poolId, s.minute, s.requests, s.tokens);
  }

  /** Its request ended, however (every begin has one end). */
  end(i: number): void {
    const s = this.members[i].state;
    if (s.inFlight > 0) s.inFlight--;
    s.probing = false;
  }

  /** The deployment answered (a head that is not a 429 or 5xx): its circuit closes. */
  succeeded(i: number): void {
    const s = this.members[i].state;
    s.failures = 0;
    s.openUntil = 0;
    s.probing = false;
  }

  /** A connect error, a timeout before the head, a 5xx: one more consecutive failure. */
  failed(i: number): void {
    const s = this.members[i].state;
    s.failures++;
    const halfOpen = s.openUntil !== 0;
    s.probing = false;
    if (halfOpen || s.failures >= this.settings.circuitFailures) s.openUntil = this.now() + this.settings.circuitCooldownMs;
  }

  /** An upstream 429 said to wait `ms`: the deployment is not chosen until then. */
  cool(i: number, ms: number): void {
    const s = this.members[i].state;
    s.coolUntil = Math.max(s.coolUntil, this.now() + ms);
  }

  /** Steered out by the operator, for this request. */
  private passedOver(i: number, pinned: boolean): boolean {
    const steered = this.members[i].steered;
    return steered === 'disabled' || (steered === 'drained' && !pinned);
  }

  /**
   * 0 when deployment i can take a request of `tokens` now; else how long until it may, positive when
   * for capacity (its limits, a 429's cooling, its minute spent across the cluster), negative when
   * its circuit is open (or probed), LEASE_SHORT when only this node's lease of its minute is short.
   */
  private blockedFor(i: number, tokens: number, pinned: boolean): number {
    const m = this.members[i];
    if (this.passedOver(i, pinned)) return -MINUTE_MS;
    const s = m.state;
    const now = this.now();
    if (s.openUntil !== 0) {
      if (now < s.openUntil) return -(s.openUntil - now);
      if (s.probing) return -PARALLEL_RETRY_MS;
    }
    if (s.coolUntil > now) return s.coolUntil - now;
    if (m.maxParallel > 0 && s.inFlight >= m.maxParallel) return PARALLEL_RETRY_MS;
    const minute = Math.floor(now / MINUTE_MS);
    const thisMinute = s.minute === minute;
    const toNextMinute = (minute + 1) * MINUTE_MS - now;
    if (m.rpm > 0 && thisMinute && s.requests >= m.rpm) return toNextMinute;
    if (m.tpm > 0 && (thisMinute ? s.tokens : 0) + tokens > m.tpm) return toNextMinute;
    if (this.leases && m.lease) {
      const a = this.leases.allowanceFor(m.lease.poolId, minute, m.lease.limits);
      if ((thisMinute ? s.requests : 0) + 1 > a.requests) return a.requestsFinal ? toNextMinute : LEASE_SHORT;
      const needTokens = (thisMinute ? s.tokens : 0) + tokens - a.tokens;
      if (needTokens > 0) return needTokens >= (a.tokensFinalNeed ?? Infinity) ? toNextMinute : LEASE_SHORT;
    }
    return 0;
  }

  private roll(s: DeploymentState): void {
    const minute = Math.floor(this.now() / MINUTE_MS);
    if (s.minute === minute) return;
    s.minute = minute;
    s.requests = 0;
    s.tokens = 0;
  }
}
