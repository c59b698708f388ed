// A pooled model's requests (issue 36): each goes to a deployment chosen on the node (upstream-pool.ts)
// and, when that one fails before any byte reached the client (a connect error, a timeout before the
// head, a 429 or 5xx head), to another, at most `max_attempts` deployments within
// `failover_timeout_ms`. The client sees one answer; the request is billed once, at the prices of the
// deployment that served it, and its log names every attempt. A deployment's rpm and tpm are held
// across nodes with the key-minute leases (docs/leases.md#minute-pools-by-id): when no deployment has
// room and some are short only of this node's lease, the request waits for the answer as admission
// waits for a key's (bounded), then is sent or refused (429, given back whole). A request naming a
// stored object of the Responses API is pinned to the deployment that holds it (affinity): that one
// or none, never another.
import type { ModelConfig, ModelDeployment } from '../../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../../errors.js';
import { logBug } from '../../log.js';
import type { Clock } from '../../limits/clock.js';
import { proxyRequest, type ProxyRequest } from '../stream-proxy.js';
import { DeploymentState, UpstreamPool, type MinuteLeases, type NoneAvailable, type PoolMember } from '../upstream-pool.js';
import { deploymentPoolId } from '../../../proto/lib/leases.js';
import type { Target, UpstreamTargets } from './upstream-targets.js';
import { setDeploymentSource, type DeploymentRow } from '../pool-metrics.js';
import { LEASE_WAIT_MS, LEASE_WAIT_RECLAIMING_MS } from '../../limits/lease-wait.js';

const DEFAULT_CIRCUIT_FAILURES = 5;
const DEFAULT_CIRCUIT_COOLDOWN_MS = 30_000;
/** How long a 429 without a usable retry-after cools its deployment. */
const DEFAULT_COOL_MS = 1_000;

/** What the pool needs of the provider's call. */
export interface PoolCall {
  fail(err: unknown): void;
  /** Refused before any upstream was asked (every deployment unavailable): given back whole. */
  refuse?(err: unknown): void;
  /** The deployment that served, the model priced as it bills, and every attempt ("id:outcome" …). */
  served?(billAs: ModelConfig, deployment: string, attempts: string): void;
}

/** One request's exchange, less what each attempt sets for its deployment. */
export interface PooledExchange extends Omit<ProxyRequest, 'pool' | 'path' | 'headers' | 'body' | 'timeoutMs' | 'retry' | 'retryStatus'> {
  /**
   * The path, headers and body of an attempt at a deployment (its base path, key, upstream model);
   * `billAs`: the model as that deployment prices it; `deployment`: its id ('' for a model's one upstream).
   */
  attempt(t: Target, billAs: ModelConfig, deployment: string): { path: string; headers: string[]; body: ProxyRequest['body'] };
}

/** The outcome word of an attempt that failed without a head. */
function errorOutcome(err: Error): string {
  const code = (err as { code?: string }).code ?? '';
  if (code === 'ECONNREFUSED') return 'refused';
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_CONNECT_TIMEOUT') return 'timeout';
  if (code === 'UND_ERR_SOCKET' || code === 'ECONNRESET') return 'reset';
  return 'unreachable';
}

/** retry-after as seconds or an HTTP date, in ms from `now`; absent or unreadable: the default. */
export function retryAfterMs(value: string | undefined, now: number): number {
  if (!value) return DEFAULT_COOL_MS;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isFinite(at) ? Math.max(0, at - now) : DEFAULT_COOL_MS;
}

/** The model as a deployment bills: the prices it overrides, over the model's. */
export function pricedAs(model: ModelConfig, d: ModelDeployment): ModelConfig {
  const o: Partial<ModelConfig> = {};
  if (d.inputMicrosPerMtok !== undefined) o.inputMicrosPerMtok = d.inputMicrosPerMtok;
  if (d.outputMicrosPerMtok !== undefined) o.outputMicrosPerMtok = d.outputMicrosPerMtok;
  if (d.audioMicrosPerUnit !== undefined) o.audioMicrosPerUnit = d.audioMicrosPerUnit;
  if (d.cachedInputMicrosPerMtok !== undefined) o.cachedInputMicrosPerMtok = d.cachedInputMicrosPerMtok;
  if (d.cacheWriteMicrosPerMtok !== undefined) o.cacheWriteMicrosPerMtok = d.cacheWriteMicrosPerMtok;
  if (d.inputAudioMicrosPerMtok !== undefined) o.inputAudioMicrosPerMtok = d.inputAudioMicrosPerMtok;
  if (d.outputAudioMicrosPerMtok !== undefined) o.outputAudioMicrosPerMtok = d.outputAudioMicrosPerMtok;
  return Object.keys(o).length === 0 ? model : { ...model, ...o };
}

const dearest = new WeakMap<ModelConfig, ModelConfig>();

/**
 * A pooled model priced at the dearest of its deployments, part by part (an unset part at the price it
 * falls back to): what a request's worst case is priced at, whichever deployment serves it.
 */
export function dearestPrices(model: ModelConfig): ModelConfig {
  if (model.deployments.length === 0) return model;
  let d = dearest.get(model);
  if (!d) {
    const each = model.deployments.map((x) => pricedAs(model, x));
    const max = (f: (m: ModelConfig) => number) => Math.max(...each.map(f));
    d = {
      ...model,
      inputMicrosPerMtok: max((m) => Number(m.inputMicrosPerMtok)),
      outputMicrosPerMtok: max((m) => Number(m.outputMicrosPerMtok)),
      audioMicrosPerUnit: max((m) => Number(m.audioMicrosPerUnit)),
      cachedInputMicrosPerMtok: max((m) => Number(m.cachedInputMicrosPerMtok ?? m.inputMicrosPerMtok)),
      cacheWriteMicrosPerMtok: max((m) => Number(m.cacheWriteMicrosPerMtok ?? m.inputMicrosPerMtok)),
      inputAudioMicrosPerMtok: max((m) => Number(m.inputAudioMicrosPerMtok ?? m.inputMicrosPerMtok)),
      outputAudioMicrosPerMtok: max((m) => Number(m.outputAudioMicrosPerMtok ?? m.outputMicrosPerMtok)),
    };
    dearest.set(model, d);
  }
  return d;
}

/** A model's pool for one config version: its members' states outlive the version. */
interface ModelPool {
  pool: UpstreamPool;
  billAs: ModelConfig[];
}

export class PooledUpstreams {
  private readonly pools = new WeakMap<ModelConfig, ModelPool>();
  /** Every deployment's state, by model and id: health and counts survive a config reload (not a new URL). */
  private readonly states = new Map<string, DeploymentState>();

  constructor(
    private readonly targets: UpstreamTargets,
    private readonly clock: Clock,
    private readonly random: () => number = Math.random,
    /** The node's minute leases: a deployment's rpm and tpm across the cluster (absent: per node). */
    private readonly leases?: MinuteLeases,
  ) {
    setDeploymentSource(() => this.rows());
  }

  /** Each deployment as the metrics show it (read when scraped). */
  private *rows(): Iterable<DeploymentRow> {
    const now = this.clock.now();
    for (const [k, state] of this.states) {
      const model = k.slice(0, k.indexOf('\n'));
      const circuit = state.openUntil === 0 ? 0 : now < state.openUntil ? 2 : 1;
      const minute = Math.floor(now / 60_000);
      yield { model, state, circuit, minute, minuteRequests: state.minute === minute ? state.requests : 0, minuteTokens: state.minute === minute ? state.tokens : 0 };
    }
  }

  private poolOf(model: ModelConfig): ModelPool {
    let p = this.pools.get(model);
    if (!p) {
      const members = model.deployments.map((d) => {
        const k = `${model.id}\n${d.id}`;
        let state = this.states.get(k);
        if (!state || state.baseUrl !== d.baseUrl) this.states.set(k, (state = new DeploymentState(d.id, d.baseUrl)));
        const tpm = Number(d.tpm);
        const poolId = deploymentPoolId(model.id, d.id);
        const lease = d.rpm > 0 || tpm > 0 ? { poolId, limits: { keyId: poolId, rpmLimit: d.rpm, tpmLimit: tpm, maxParallel: 0 } } : undefined;
        return { state, weight: d.weight > 0 ? d.weight : 1, rpm: d.rpm, tpm, maxParallel: d.maxParallelRequests, lease, steered: steerOf(d.state) };
      });
      const settings = {
        circuitFailures: model.circuitFailures || DEFAULT_CIRCUIT_FAILURES,
        circuitCooldownMs: Number(model.circuitCooldownMs) || DEFAULT_CIRCUIT_COOLDOWN_MS,
      };
      p = { pool: new UpstreamPool(members, settings, () => this.clock.now(), this.random, this.leases), billAs: model.deployments.map((d) => pricedAs(model, d)) };
      this.pools.set(model, p);
    }
    return p;
  }

  /**
   * Sends a pooled model's request (`model.deployments` not empty); `tokens`: its input estimate, for
   * the deployments' tpm. `pin`: the index of the one deployment it may go to (what it names lives
   * there), -1 for any.
   */
  send(model: ModelConfig, call: PoolCall, x: PooledExchange, tokens: number, once = false, pin = -1): void {
    new Attempts(this.targets, this.clock, model, this.poolOf(model), call, x, tokens, once, pin).next();
  }
}

/**
 * A model with one upstream: its exchange sent there. One literal, of one shape for every call (no
 * spread of the exchange: a spread built its object property by property, a hidden-class transition
 * each, per request; bench:where showed them).
 */
export function sendToOne(targets: UpstreamTargets, model: ModelConfig, x: PooledExchange): void {
  const t = targets.of(model);
  const r = x.attempt(t, model, '');
  proxyRequest({
    pool: t.pool,
    method: x.method,
    path: r.path,
    headers: r.headers,
    body: r.body,
    timeoutMs: t.timeoutMs,
    idleTimeoutMs: x.idleTimeoutMs,
    reply: x.reply,
    passAllHeaders: x.passAllHeaders,
    upstreamErrors: x.upstreamErrors,
    inspect: x.inspect,
    usageGraceMs: x.usageGraceMs,
    onAbort: x.onAbort,
    onResponseHead: x.onResponseHead,
    onDone: x.onDone,
  });
}

/** The operator's state of a deployment as the choice reads it; one this node does not know takes nothing. */
function steerOf(state: string): PoolMember['steered'] {
  return state === '' || state === 'drained' ? state : 'disabled';
}

/** The refusal of a request pinned to a deployment that is down (or gone from the config). */
export function storedObjectUnavailable(model: ModelConfig, retryAfterSec?: number): GatewayError {
  const when = retryAfterSec === undefined ? 'retry later' : `retry after ${retryAfterSec} s`;
  return new GatewayError('STORED_OBJECT_UNAVAILABLE', `What this request names lives on an upstream deployment of model ${model.id} that is unavailable right now; ${when}.`, retryAfterSec === undefined ? {} : { retryAfterSec });
}

/** One request's attempts, in order. */
class Attempts {
  private readonly tried: number[] = [];
  /** Pinned: every other deployment, never chosen. */
  private readonly others: number[] = [];
  private readonly log: string[] = [];
  private readonly maxAttempts: number;
  /** performance.now() by which an answer's head must have come. */
  private readonly deadline: number;

  constructor(
    private readonly targets: UpstreamTargets,
    private readonly clock: Clock,
    private readonly model: ModelConfig,
    private readonly p: ModelPool,
    private readonly call: PoolCall,
    private readonly x: PooledExchange,
    private readonly tokens: number,
    once: boolean,
    private readonly pin: number,
  ) {
    const n = model.deployments.length;
    if (pin >= 0) for (let i = 0; i < n; i++) if (i !== pin) this.others.push(i);
    this.maxAttempts = once || pin >= 0 ? 1 : Math.min(n, model.maxAttempts || n);
    const timeoutMs = model.timeoutMs > 0 ? Number(model.timeoutMs) : 60_000;
    this.deadline = performance.now() + (Number(model.failoverTimeoutMs) || timeoutMs * this.maxAttempts);
  }

  /** Starts the next attempt; false when none may be made (tried enough, out of time, none available). */
  next(): boolean {
    const first = this.tried.length === 0;
    if (!first && (this.tried.length >= this.maxAttempts || performance.now() >= this.deadline)) return false;
    const passed = this.passed();
    const i = this.p.pool.choose(passed, this.tokens, this.pin >= 0);
    if (i >= 0) {
      this.attempt(i);
      return true;
    }
    if (!first) return false;
    const why = this.p.pool.whyNone(passed, this.tokens, this.pin >= 0);
    if (why.leaseShort.length > 0) this.waitForLease();
    else this.refuse(why);
    return true;
  }

  /** What may not be chosen: what was tried, and, pinned, every other deployment. */
  private passed(): number[] {
    return this.others.length > 0 ? this.others.concat(this.tried) : this.tried;
  }

  /** No deployment can take the request: refused before any upstream was asked, given back whole. */
  private refuse(why: NoneAvailable): void {
    const retryAfterSec = Math.max(1, Math.ceil(why.retryAfterMs / 1000));
    const m = this.model.id;
    const capacity = why.capacity || why.leaseShort.length > 0;
    const err =
      this.pin >= 0
        ? capacity
          ? new GatewayError('MODEL_AT_CAPACITY', `The upstream deployment of model ${m} that holds what this request names is at its capacity; retry after ${retryAfterSec} s.`, { retryAfterSec })
          : storedObjectUnavailable(this.model, retryAfterSec)
        : capacity
          ? new GatewayError('MODEL_AT_CAPACITY', `Every upstream deployment of model ${m} is at its capacity; retry after ${retryAfterSec} s.`, { retryAfterSec })
          : new GatewayError('UPSTREAM_UNREACHABLE', `Every upstream deployment of model ${m} is failing; retry after ${retryAfterSec} s.`, { retryAfterSec });
    if (this.call.refuse) this.call.refuse(err);
    else this.call.fail(err);
  }

  /**
   * No deployment can take the first attempt, and some are short only of this node's lease of their
   * minute: the request waits for the control plane's answer (which reclaims what other nodes hold
   * unused before it says the minute is spent), at most LEASE_WAIT_MS, as admission waits for a key's.
   * Out of time with no answer, the need is taken in advance within the deployment's own limits counted
   * here (docs/leases.md). A client that leaves meanwhile is given back whole: nothing was sent.
   */
  private waitForLease(): void {
    const pool = this.p.pool;
    const started = performance.now();
    let done = false;
    let timer: NodeJS.Timeout | null = null;
    let asked: number[] = [];
    const wake = (): void => {
      setImmediate(() => attempt(false));
    };
    const stopWaiting = () => {
      for (const i of asked) pool.cancelLeaseWait(i, wake);
      asked = [];
    };
    const finish = () => {
      done = true;
      if (timer) clearTimeout(timer);
      stopWaiting();
    };
    this.x.onAbort(() => {
      if (done) return;
      finish();
      this.call.refuse?.(new GatewayError('MODEL_AT_CAPACITY'));
    });
    const attempt = (lastTry: boolean): void => {
      if (done) return;
      try {
        if (this.x.reply.done) return finish();
        // Out of time, but the control plane said the answer waits for reclaims: not late, wait on.
        if (lastTry && pool.leaseDeferred(started) && performance.now() - started < LEASE_WAIT_RECLAIMING_MS) {
          timer = setTimeout(() => attempt(true), 50);
          return;
        }
        let i = pool.choose(this.passed(), this.tokens, this.pin >= 0);
        if (i < 0) {
          // Out of time with no answer, or while an earlier want of the minute is so: taken in advance.
          for (const j of pool.whyNone(this.passed(), this.tokens, this.pin >= 0).leaseShort) {
            if (!pool.advanceLease(j, this.tokens, lastTry)) continue;
            i = pool.choose(this.passed(), this.tokens, this.pin >= 0);
            if (i >= 0) break;
          }
        }
        if (i < 0 && !lastTry) {
          stopWaiting();
          for (const j of pool.whyNone(this.passed(), this.tokens, this.pin >= 0).leaseShort) if (pool.waitLease(j, this.tokens, wake)) asked.push(j);
          if (asked.length > 0) {
            timer ??= setTimeout(() => attempt(true), LEASE_WAIT_MS);
            return;
          }
        }
        finish();
        if (i >= 0) this.attempt(i);
        else this.refuse(pool.whyNone(this.passed(), this.tokens, this.pin >= 0));
      } catch (e) {
        // Out of a timer or a lease answer: nothing may escape; the request ends as a failure.
        logBug(e);
        if (!done) finish();
        this.call.fail(e);
      }
    };
    attempt(false);
  }

  private attempt(i: number): void {
    const { p, x } = this;
    const pool = p.pool;
    const d = this.model.deployments[i];
    const t = this.targets.ofDeployment(this.model, d);
    pool.begin(i, this.tokens);
    this.tried.push(i);
    let released = false;
    let failure = '';
    const release = () => {
      if (released) return;
      released = true;
      pool.end(i);
    };
    const self = this;
    const state = pool.members[i].state;
    const countError = (kind: string) => state.noteError(kind, Math.floor(self.clock.now() / 60_000));
    /** This attempt failed as `outcome`: another is made if it may be (then true), logged before it. */
    const moveOn = (outcome: string): boolean => {
      release();
      self.log.push(`${d.id}:${outcome}`);
      if (self.next()) {
        state.failovers++;
        return true;
      }
      // None: this attempt answers after all, and its end logs it.
      self.log.pop();
      return false;
    };
    const r = x.attempt(t, p.billAs[i], d.id);
    proxyRequest({
      pool: t.pool,
      method: x.method,
      path: r.path,
      headers: r.headers,
      body: r.body,
      timeoutMs: Math.max(1, Math.min(t.timeoutMs, Math.floor(this.deadline - performance.now()))),
      idleTimeoutMs: x.idleTimeoutMs ?? t.timeoutMs,
      reply: x.reply,
      passAllHeaders: x.passAllHeaders,
      upstreamErrors: x.upstreamErrors,
      inspect: x.inspect,
      usageGraceMs: x.usageGraceMs,
      onAbort: x.onAbort,
      onResponseHead(status) {
        if (status !== 429 && status < 500) pool.succeeded(i);
        x.onResponseHead?.(status);
      },
      retry(err) {
        failure = errorOutcome(err);
        countError(failure);
        pool.failed(i);
        if (self.pin < 0) return moveOn(failure);
        // Pinned: no other account holds what it names, so the answer says where it lives, not a 502.
        release();
        self.log.push(`${d.id}:${failure}`);
        self.call.served?.(p.billAs[i], d.id, self.log.join(' '));
        self.call.fail(storedObjectUnavailable(self.model));
        return true;
      },
      retryStatus(status, retryAfter) {
        countError(status === 429 ? '429' : '5xx');
        if (status === 429) pool.cool(i, retryAfterMs(retryAfter, self.clock.now()));
        else pool.failed(i);
        return moveOn(String(status));
      },
      onDone(status, outcome, upstreamStatus) {
        release();
        // The attempt that answered: its status, or what it failed with.
        self.log.push(`${d.id}:${upstreamStatus ? upstreamStatus : failure || (outcome === 'aborted' ? 'aborted' : 'unreachable')}`);
        self.call.served?.(p.billAs[i], d.id, self.log.join(' '));
        x.onDone(status, outcome, upstreamStatus);
      },
    });
  }
}
