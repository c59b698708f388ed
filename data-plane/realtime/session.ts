// One open realtime session: the client's uWS socket relayed to its upstream link, both ways, with
// backpressure on both sides, and accounting of every `response.done` as it passes.
//
// Backpressure:
// - upstream → client: after each send, when uWS holds `maxBufferedBytes` or more for the client
//   (getBufferedAmount), the upstream is paused (its socket is not read, so its messages wait at the
//   upstream); uWS's `drain` resumes it once half of that has gone out.
// - client → upstream: uWS cannot stop reading a WebSocket, so the upstream link's unsent bytes are
//   watched instead: a client that keeps sending past `maxBufferedBytes` + one message of what the
//   upstream has not taken is closed (1008), never buffered without bound.
//
// Accounting: `response.done` usage (input and output tokens, validated) counts against the key's
// tpm in the current minute and is charged to the organisation at once (a usage record and the
// node's money slice), each response on its own. When the key's tpm is spent or the organisation's
// money runs out, the socket is closed after the response in flight (1008 for money, 1013 for tpm),
// with a reason that says why.
import type { WebSocket } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { tokenCostMicros } from '../../proto/lib/money.js';
import type { KeyRecord } from '../auth/key-table.js';
import { logBug } from '../http/reply.js';
import { findDuplicateKey } from '../http/validate-request.js';
import type { RequestContext } from '../http/request-context.js';
import { minuteOf, secondsToNextMinute, type Clock } from '../limits/clock.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../limits/lease-client.js';
import type { Reporter } from '../sync/reporter.js';
import { blockedReasonText, type OpenSocket, type OpenSockets } from './open-sockets.js';
import type { RealtimeSessionLog, SessionLogSink } from './session-log.js';
import type { UpstreamLink } from './upstream-link.js';

/** Close codes the gateway uses (RFC 6455 §7.4 and the IANA registry). */
export const CLOSE = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  POLICY: 1008,
  INTERNAL: 1011,
  TRY_AGAIN_LATER: 1013,
  BAD_GATEWAY: 1014,
});

/** Largest token count one `response.done` may report; anything else is malformed. */
const MAX_TOKENS_PER_RESPONSE = 100_000_000;

export interface SessionDeps {
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  reporter: Reporter;
  sockets: OpenSockets;
  logSession: SessionLogSink;
  /** Bytes uWS may hold for a client before the upstream is paused. */
  maxBufferedBytes: number;
  /** Largest message either way. */
  maxMessageBytes: number;
  stats: RealtimeStats;
  /** The Responses API's WebSocket mode: each response is billed on its final event instead. */
  responsesApi?: boolean;
}

/** The Responses API's final events (the WebSocket mode bills each): each carries the usage. */
const RESPONSES_FINAL = ['response.completed', 'response.incomplete', 'response.failed'];

/** Figures for the admin listener's GET /stats/realtime. */
export class RealtimeStats {
  open = 0;
  opened = 0;
  pausedUpstreams = 0;
  /** The most uWS held for one client at any time since start (or the last reset). */
  peakBufferedBytes = 0;

  snapshot(reset = false): { open: number; opened: number; paused_upstreams: number; peak_buffered_bytes: number } {
    const out = { open: this.open, opened: this.opened, paused_upstreams: this.pausedUpstreams, peak_buffered_bytes: this.peakBufferedBytes };
    if (reset) this.peakBufferedBytes = 0;
    return out;
  }
}

export interface UserData {
  session: RealtimeSession;
}

type Obj = Record<string, any>;

export class RealtimeSession implements OpenSocket {
  readonly keyHash: string;
  readonly orgId: string;
  readonly modelId: string;
  private ws: WebSocket<UserData> | null = null;
  private ended = false;
  private responsesInFlight = 0;
  private pendingClose: { code: number; reason: string } | null = null;
  private upstreamPaused = false;
  private orgWake: (() => void) | null = null;
  private readonly startedAtMs: number;
  private readonly counts = { fromClient: 0, toClient: 0, bytesFromClient: 0, bytesToClient: 0, responses: 0, prompt: 0, completion: 0, cost: 0 };

  constructor(
    private readonly deps: SessionDeps,
    private readonly ctx: RequestContext,
    private readonly key: KeyRecord,
    private readonly model: ModelConfig,
    private readonly link: UpstreamLink,
    private readonly path: string,
    private readonly client: { clientIp: string; userAgent: string } = { clientIp: '', userAgent: '' },
  ) {
    this.keyHash = key.keyHash;
    this.orgId = key.orgId;
    this.modelId = model.id;
    this.startedAtMs = deps.clock.now();
  }

  /** uWS `open`: the client is upgraded; the upstream's messages may flow. */
  open(ws: WebSocket<UserData>): void {
    this.ws = ws;
    this.deps.sockets.add(this);
    this.deps.stats.open++;
    this.deps.stats.opened++;
    // Called from the upstream's event emitter: nothing may escape.
    this.link.events = {
      message: (data, isBinary) => {
        try {
          this.fromUpstream(data, isBinary);
        } catch (e) {
          logBug(e);
          this.close(CLOSE.INTERNAL, 'gateway error');
        }
      },
      closed: (code, reason) => {
        try {
          this.upstreamClosed(code, reason);
        } catch (e) {
          logBug(e);
        }
      },
    };
    this.link.resume();
  }

  /** uWS `message`: `data` is a copy the session may keep. */
  fromClient(data: Buffer, isBinary: boolean): void {
    if (this.ended) return;
    this.counts.fromClient++;
    this.counts.bytesFromClient += data.length;
    // The model is the one the session was admitted and is billed for: a client may not switch it,
    // however the event is spelled (a `\u` escape can write any of its characters) or framed (binary).
    if (data.includes('"session.update"') || data.includes('\\u')) {
      const refusal = clientEventRefusal(data, this.model);
      if (refusal) return this.sendToClient(Buffer.from(JSON.stringify(refusal)), false);
    }
    this.link.send(data, isBinary);
    if (this.link.bufferedAmount > this.deps.maxBufferedBytes + this.deps.maxMessageBytes) {
      this.close(CLOSE.POLICY, 'the client sends faster than the upstream accepts; slow down');
    }
  }

  /** uWS `drain`: the client took some of what was buffered. */
  drained(): void {
    if (this.ended || !this.ws || !this.upstreamPaused) return;
    if (this.ws.getBufferedAmount() <= this.deps.maxBufferedBytes / 2) {
      this.upstreamPaused = false;
      this.deps.stats.pausedUpstreams--;
      this.link.resume();
    }
  }

  /** uWS `close`: the socket is gone (whoever closed it). The single cleanup path. */
  clientClosed(code: number, reason: string): void {
    if (this.ended) return;
    this.ended = true;
    this.ws = null;
    this.link.close(code === CLOSE.NORMAL ? CLOSE.NORMAL : CLOSE.GOING_AWAY, code === CLOSE.NORMAL ? 'client closed the session' : 'client went away');
    this.finish(code, reason);
  }

  /** Closes the client now (revocation, blocked organisation, narrowed scope, stale node). */
  closeForPolicy(reason: string): void {
    this.close(CLOSE.POLICY, reason);
  }

  /** Closes the client with `code` and `reason`; the close handler runs from inside. */
  close(code: number, reason: string): void {
    if (this.ended || !this.ws) return;
    const ws = this.ws;
    try {
      ws.cork(() => ws.end(code, truncateReason(reason)));
    } catch (e) {
      logBug(e);
      this.clientClosed(code, reason);
    }
  }

  private fromUpstream(data: Buffer, isBinary: boolean): void {
    if (this.ended) return;
    let done: Obj | null = null;
    if (!isBinary) {
      if (data.includes('"response.created"')) {
        if (typeOf(data) === 'response.created') this.responsesInFlight++;
      } else if (data.includes('"response.done"')) {
        const ev = parse(data);
        if (ev?.type === 'response.done') done = ev;
      } else if (this.deps.responsesApi === true && RESPONSES_FINAL.some((t) => data.includes(`"${t}"`))) {
        const ev = parse(data);
        if (RESPONSES_FINAL.includes(ev?.type)) done = ev;
      }
    }
    this.sendToClient(data, isBinary);
    if (done) this.account(done);
  }

  private sendToClient(data: Buffer, isBinary: boolean): void {
    if (this.ended || !this.ws) return;
    const ws = this.ws;
    let status = 1;
    ws.cork(() => {
      status = ws.send(data, isBinary);
    });
    this.counts.toClient++;
    this.counts.bytesToClient += data.length;
    const buffered = ws.getBufferedAmount();
    if (buffered > this.deps.stats.peakBufferedBytes) this.deps.stats.peakBufferedBytes = buffered;
    // Dropped: uWS's own limit (set well above the pause threshold) was passed; never lose silently.
    if (status === 2) return this.close(CLOSE.INTERNAL, 'the client did not read its messages');
    if (buffered >= this.deps.maxBufferedBytes && !this.upstreamPaused) {
      this.upstreamPaused = true;
      this.deps.stats.pausedUpstreams++;
      this.link.pause();
    }
  }

  private upstreamClosed(code: number, reason: string): void {
    if (this.ended) return;
    if (code === CLOSE.NORMAL) return this.close(CLOSE.NORMAL, reason ? `upstream: ${reason}` : 'the upstream ended the session');
    if (isSendableCode(code)) return this.close(code, `upstream: ${reason || 'closed'}`);
    this.close(CLOSE.BAD_GATEWAY, `upstream connection lost${reason ? `: ${reason}` : ''}`);
  }

  /** One `response.done`: tokens against tpm, cost to the organisation, then the limits checked. */
  private account(ev: Obj): void {
    const deps = this.deps;
    this.responsesInFlight = Math.max(0, this.responsesInFlight - 1);
    const usage = ev.response?.usage;
    const prompt = tokens(usage?.input_tokens);
    const completion = tokens(usage?.output_tokens);
    const cost = tokenCostMicros(prompt, completion, this.model.inputMicrosPerMtok, this.model.outputMicrosPerMtok);
    const now = deps.clock.now();
    const n = ++this.counts.responses;
    this.counts.prompt += prompt;
    this.counts.completion += completion;
    this.counts.cost += cost;
    const headers = deps.keyBudgets.useTokens(this.key.limits, prompt + completion);
    const reservation = deps.leases?.reserveSpend(this.key.orgId);
    deps.leases?.settleSpend(this.key.orgId, reservation, cost);
    deps.reporter.record({
      requestId: `${this.ctx.requestId}.${n}`,
      keyId: this.key.keyId,
      orgId: this.key.orgId,
      projectId: this.key.projectId,
      model: this.model.id,
      path: this.path,
      status: 200,
      promptTokens: prompt,
      completionTokens: completion,
      costMicros: cost,
      atMs: now,
      minute: minuteOf(now),
      leaseEpoch: reservation?.epoch ?? 0,
    });
    if (headers.limitTokens > 0 && headers.remainingTokens <= 0) {
      const retry = secondsToNextMinute(now);
      this.closeAfterResponse(CLOSE.TRY_AGAIN_LATER, `tokens: the key's tokens per minute (${headers.limitTokens}) are spent; retry after ${retry} s`);
    }
    this.checkMoney();
    if (this.pendingClose && this.responsesInFlight === 0) this.close(this.pendingClose.code, this.pendingClose.reason);
  }

  /** The organisation's money: spent (close), on its way (wait for the control plane), or there. */
  private checkMoney(): void {
    if (this.ended) return;
    const org = this.key.org;
    const verdict = org.blocked ? 'no' : (this.deps.leases?.canSpend(this.key.orgId) ?? 'yes');
    if (verdict === 'no') {
      this.closeAfterResponse(CLOSE.POLICY, `insufficient_quota: ${blockedReasonText(org.blockedReason)}`);
    } else if (verdict === 'wait' && !this.orgWake) {
      const wake = () => {
        this.orgWake = null;
        setImmediate(() => {
          this.checkMoney();
          if (this.pendingClose && this.responsesInFlight === 0) this.close(this.pendingClose.code, this.pendingClose.reason);
        });
      };
      if (this.deps.leases?.waitForOrg(this.key.orgId, wake)) this.orgWake = wake;
    }
  }

  private closeAfterResponse(code: number, reason: string): void {
    this.pendingClose ??= { code, reason };
  }

  private finish(code: number, reason: string): void {
    const deps = this.deps;
    deps.sockets.remove(this);
    deps.stats.open--;
    if (this.upstreamPaused) deps.stats.pausedUpstreams--;
    if (this.orgWake) deps.leases?.cancelOrgWait(this.key.orgId, this.orgWake);
    // The session's request and slot: the slot is released, its tokens were counted per response.
    this.ctx.complete({ status: 101, promptTokens: 0, completionTokens: 0 });
    const now = deps.clock.now();
    const c = this.counts;
    const entry: RealtimeSessionLog = {
      requestId: this.ctx.requestId,
      keyId: this.key.keyId,
      orgId: this.key.orgId,
      projectId: this.key.projectId,
      model: this.model.id,
      path: this.path,
      clientIp: this.client.clientIp,
      userAgent: this.client.userAgent,
      startedAtMs: this.startedAtMs,
      durationMs: Math.max(0, now - this.startedAtMs),
      messagesFromClient: c.fromClient,
      messagesToClient: c.toClient,
      bytesFromClient: c.bytesFromClient,
      bytesToClient: c.bytesToClient,
      responses: c.responses,
      promptTokens: c.prompt,
      completionTokens: c.completion,
      costMicros: c.cost,
      closeCode: code,
      closeReason: reason,
    };
    try {
      deps.logSession(entry);
    } catch (e) {
      logBug(e);
    }
  }
}

/** A validated token count: a whole number in [0, MAX_TOKENS_PER_RESPONSE], anything else 0. */
export function tokens(v: unknown): number {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.min(Math.floor(v), MAX_TOKENS_PER_RESPONSE) : 0;
}

function parse(data: Buffer): Obj | null {
  return parseText(data.toString('utf8'));
}

function parseText(text: string): Obj | null {
  try {
    const v = JSON.parse(text);
    return v && typeof v === 'object' ? v : null;
  } catch {
    return null;
  }
}

function typeOf(data: Buffer): string | undefined {
  const ev = parse(data);
  return typeof ev?.type === 'string' ? ev.type : undefined;
}

/**
 * An `error` event for a client event the gateway will not pass on, else null: a session.update that
 * names another model than the session's, or an event that repeats a key inside one object (the
 * upstream may read the other copy of `type` or `model` than the one checked here).
 */
export function clientEventRefusal(data: Buffer, model: ModelConfig): Obj | null {
  const text = data.toString('utf8');
  const ev = parseText(text);
  if (!ev) return null;
  const eventId = typeof ev.event_id === 'string' ? ev.event_id : null;
  const repeated = findDuplicateKey(text);
  if (repeated !== null) {
    return errorEvent('invalid_request_error', `The event repeats the key \`${repeated.slice(0, 64)}\`; send each key once.`, repeated.slice(0, 64), eventId);
  }
  if (ev.type !== 'session.update') return null;
  const wanted = ev.session?.model;
  if (wanted === undefined || wanted === model.id || wanted === model.upstreamModel) return null;
  return errorEvent('model_not_allowed', `This session is for the model \`${model.id}\`; open a new session to use another model.`, 'session.model', eventId);
}

function errorEvent(code: string, message: string, param: string, eventId: string | null): Obj {
  return {
    type: 'error',
    event_id: `event_gw_${Date.now().toString(36)}`,
    error: { type: 'invalid_request_error', code, message, param, event_id: eventId },
  };
}

/** A code a server may send in a close frame (not 1005, 1006, 1015 or out of range). */
function isSendableCode(code: number): boolean {
  return (code >= 1000 && code <= 1014 && code !== 1004 && code !== 1005 && code !== 1006) || (code >= 3000 && code <= 4999);
}

/** A close reason is at most 123 bytes of UTF-8. */
export function truncateReason(reason: string): string {
  if (Buffer.byteLength(reason) <= 123) return reason;
  const chars = [...reason];
  while (Buffer.byteLength(chars.join('')) > 123) chars.pop();
  return chars.join('');
}
