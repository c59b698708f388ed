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
//
// A response the upstream reports no usage for (none, or malformed), and every response still in
// flight when the session ends (revoked, blocked, drained, client or upstream gone), is billed the
// estimate of response-estimate.ts: counted as the messages pass, never kept.
import type { WebSocket } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { usageCostMicros, type TokenCounts } from '../../proto/lib/money.js';
import { tokenUsageOf } from '../proxy/usage-readers.js';
import type { KeyRecord } from '../auth/key-table.js';
import { logBug } from '../log.js';
import type { RequestContext } from '../http/request-context.js';
import { minuteOf, secondsToNextMinute, type Clock } from '../limits/clock.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../limits/lease-client.js';
import { cancelMoneyWait, moneyVerdict, reserveMoney, waitForMoney } from '../limits/money-pools.js';
import type { Reporter } from '../sync/reporter.js';
import type { EndReason, OpenEntry, OpenStreams } from '../auth/open-streams.js';
import { closeReasonOf, endError, type GatewayError } from '../errors.js';
import { openStreamGauge } from '../metrics.js';
import type { RealtimeSessionLog, SessionLogSink } from './session-log.js';
import type { UpstreamLink } from './upstream-link.js';
import type { MemoryMember, RealtimeMemory } from './realtime-memory.js';
import { AUDIO_DELTAS, TEXT_DELTAS } from './response-estimate.js';
import { ResponseTallies } from './response-tallies.js';
import { eventTypeOf, parse, type Obj } from './event-scan.js';
import { clientEventRefusal, TRANSCRIPTION_DONE } from './client-events.js';
import { CLOSE, isSendableCode, truncateReason } from './close-codes.js';
import type { RealtimeStats } from './realtime-stats.js';
import { sendToClientSocket } from './client-send.js';

// Re-exported: the gateway and the tests import them from here.
export { CLOSE, truncateReason } from './close-codes.js';
export { RealtimeStats } from './realtime-stats.js';
export { clientEventRefusal } from './client-events.js';
export { eventTypeOf, stringMemberSpans, tokens } from './event-scan.js';

export interface SessionDeps {
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  reporter: Reporter;
  /** The node's one registry of what keys have open (auth/open-streams.ts): its policy ends a session. */
  openStreams?: OpenStreams;
  /** The node's open sessions (the drain ends them). */
  sessions: Set<RealtimeSession>;
  logSession: SessionLogSink;
  /** Bytes uWS may hold for a client before the upstream is paused. */
  maxBufferedBytes: number;
  /** Largest message either way. */
  maxMessageBytes: number;
  stats: RealtimeStats;
  /** The node-wide bound on what all sessions hold together. */
  memory: RealtimeMemory;
  /** The Responses API's WebSocket mode: each response is billed on its final event instead. */
  responsesApi?: boolean;
}

/** The Responses API's final events (the WebSocket mode bills each): each carries the usage. */
const RESPONSES_FINAL = ['response.completed', 'response.incomplete', 'response.failed'];

export interface UserData {
  session: RealtimeSession;
}


/** Open realtime sessions, for the `tollgate_node_open_streams{kind="realtime"}` gauge. */
const openSessions = openStreamGauge('realtime');

export class RealtimeSession implements OpenEntry, MemoryMember {
  readonly keyHash: string;
  readonly orgId: string;
  /** Its slot in the registry of what keys have open (slot-set.ts). */
  slot = -1;
  readonly modelId: string;
  private ws: WebSocket<UserData> | null = null;
  private ended = false;
  private responsesInFlight = 0;
  private pendingClose: { code: number; reason: string } | null = null;
  private upstreamPaused = false;
  /** What this session held when last measured (its share of RealtimeMemory.held). */
  private heldBytes = 0;
  private orgWake: (() => void) | null = null;
  private readonly startedAtMs: number;
  /** The counts of what went in and came out, per response in flight. */
  private readonly tallies = new ResponseTallies();
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
    this.deps.sessions.add(this);
    this.deps.openStreams?.add(this);
    openSessions.opened();
    this.deps.stats.open++;
    this.deps.stats.opened++;
    this.deps.memory.join(this);
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
    if (data.includes('"session.update"') || data.includes('\\u') || data.includes('transcription')) {
      const refusal = clientEventRefusal(data, this.model);
      if (refusal) return this.sendToClient(Buffer.from(JSON.stringify(refusal)), false);
    }
    if (!isBinary) this.tallies.clientEvent(data);
    this.link.send(data, isBinary);
    if (this.link.bufferedAmount > this.deps.maxBufferedBytes + this.deps.maxMessageBytes) {
      this.close(CLOSE.POLICY, 'the client sends faster than the upstream accepts; slow down');
      return;
    }
    // The node is full and this client's messages wait for its upstream: it adds to what is held.
    if (this.remeasured() >= this.deps.memory.maxBytes && this.link.bufferedAmount > 0) {
      this.close(CLOSE.TRY_AGAIN_LATER, 'this gateway node holds too many realtime messages right now; reconnect later');
    }
  }

  /** uWS `drain`: the client took some of what was buffered. */
  drained(): void {
    if (this.ended || !this.ws) return;
    this.remeasured();
    this.resumeIfRoom();
    this.deps.memory.relieve();
  }

  /** RealtimeMemory: measure again (bytes go out without an event on some paths). */
  remeasure(): void {
    if (!this.ended) this.remeasured();
  }

  /** RealtimeMemory: the node is back under its bound. */
  roomAgain(): void {
    this.resumeIfRoom();
  }

  /** Resumes a paused upstream once the client took half of its own limit and the node has room. */
  private resumeIfRoom(): void {
    if (this.ended || !this.ws || !this.upstreamPaused) return;
    if (this.ws.getBufferedAmount() > this.deps.maxBufferedBytes / 2) return;
    if (this.deps.memory.full) {
      this.deps.memory.waitForRoom(this);
      return;
    }
    this.upstreamPaused = false;
    this.deps.stats.pausedUpstreams--;
    this.link.resume();
  }

  /** What this session holds now (its client's uWS buffer and its link's unsent bytes), reported; the node's total. */
  private remeasured(): number {
    const now = (this.ws?.getBufferedAmount() ?? 0) + this.link.bufferedAmount;
    const total = this.deps.memory.update(this.heldBytes, now);
    this.heldBytes = now;
    return total;
  }

  /** uWS `close`: the socket is gone (whoever closed it). The single cleanup path. */
  clientClosed(code: number, reason: string): void {
    if (this.ended) return;
    this.ended = true;
    this.ws = null;
    this.link.close(code === CLOSE.NORMAL ? CLOSE.NORMAL : CLOSE.GOING_AWAY, code === CLOSE.NORMAL ? 'client closed the session' : 'client went away');
    this.finish(code, reason);
  }

  /** The registry's policy ends the session (auth/open-streams.ts): closed now, 1008, the reason's one text. */
  end(_why: EndReason, err: GatewayError): void {
    this.close(CLOSE.POLICY, closeReasonOf(err));
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
    let transcribed: Obj | null = null;
    if (!isBinary) {
      // Told apart by the event's own `type` member, never by text found anywhere in it (a client's
      // metadata, echoed back, can hold any text). The Responses API's WebSocket mode bills each
      // response on its final event instead of `response.done`.
      const type = eventTypeOf(data);
      if (type === 'response.created') {
        this.responsesInFlight++;
        this.tallies.created(parse(data), `#${this.counts.toClient}`);
      } else if (type === 'response.done' || (this.deps.responsesApi === true && type !== undefined && RESPONSES_FINAL.includes(type))) done = parse(data);
      else if (type === TRANSCRIPTION_DONE) transcribed = parse(data);
      else if (type !== undefined && (TEXT_DELTAS.has(type) || AUDIO_DELTAS.has(type))) this.tallies.delta(data, AUDIO_DELTAS.has(type));
    }
    this.sendToClient(data, isBinary);
    if (done) this.account(done);
    // Input-audio transcription is refused (clientEventRefusal); one the upstream ran anyway (its
    // own session default) is billed at the session's prices, never given away.
    if (transcribed) this.accountTranscription(transcribed);
  }

  private sendToClient(data: Buffer, isBinary: boolean): void {
    if (this.ended || !this.ws) return;
    const ws = this.ws;
    const status = sendToClientSocket(ws, data, isBinary);
    this.counts.toClient++;
    this.counts.bytesToClient += data.length;
    const buffered = ws.getBufferedAmount();
    if (buffered > this.deps.stats.peakBufferedBytes) this.deps.stats.peakBufferedBytes = buffered;
    // Dropped: uWS's own limit (set well above the pause threshold) was passed; never lose silently.
    if (status === 2) return this.close(CLOSE.INTERNAL, 'the client did not read its messages');
    const nodeFull = this.remeasured() >= this.deps.memory.maxBytes;
    if ((buffered >= this.deps.maxBufferedBytes || nodeFull) && !this.upstreamPaused) {
      this.upstreamPaused = true;
      this.deps.stats.pausedUpstreams++;
      this.link.pause();
      // Held for the node, not for this client: nothing of its own may drain, so room wakes it.
      if (nodeFull && buffered <= this.deps.maxBufferedBytes / 2) this.deps.memory.waitForRoom(this);
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
    this.responsesInFlight = Math.max(0, this.responsesInFlight - 1);
    const tally = this.tallies.take(ev);
    // The upstream's usage when it reports one; else the estimate of what went in and came out.
    this.charge(tokenUsageOf(ev.response?.usage) ?? tally.counts());
  }

  /** A transcription of input audio the upstream reports with token usage. */
  private accountTranscription(ev: Obj): void {
    const usage = tokenUsageOf(ev.usage);
    if (usage) this.charge(usage);
    else this.checkLimits();
  }

  /** Usage as the upstream reported it (or the estimate): each part at its price (audio as audio, cached as cached). */
  private charge(usage: TokenCounts): void {
    const deps = this.deps;
    const prompt = usage.promptTokens;
    const completion = usage.completionTokens;
    const cost = usageCostMicros(usage, this.model);
    const now = deps.clock.now();
    const n = ++this.counts.responses;
    this.counts.prompt += prompt;
    this.counts.completion += completion;
    this.counts.cost += cost;
    const headers = deps.keyBudgets.useTokens(this.key.limits, prompt + completion);
    const reservation = reserveMoney(deps.leases, this.key, now);
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
    this.checkLimits();
  }

  private checkLimits(): void {
    this.checkMoney();
    if (this.pendingClose && this.responsesInFlight === 0) this.close(this.pendingClose.code, this.pendingClose.reason);
  }

  /** The organisation's money: spent (close), on its way (wait for the control plane), or there. */
  private checkMoney(): void {
    if (this.ended) return;
    const org = this.key.org;
    // The organisation's money, the project's cap and the key's own limit (docs/money-limits.md).
    const leases = this.deps.leases;
    const money = org.blocked ? null : leases ? moneyVerdict(leases, this.key, this.deps.clock.now()) : { verdict: 'yes' as const };
    if (money === null || money.verdict === 'no') {
      this.closeAfterResponse(CLOSE.POLICY, money && money.pool ? `insufficient_quota: ${money.short}` : closeReasonOf(endError('org_blocked', { blockedReason: org.blockedReason })));
    } else if (money.verdict === 'wait' && !this.orgWake) {
      const wake = () => {
        this.orgWake = null;
        setImmediate(() => {
          this.checkMoney();
          if (this.pendingClose && this.responsesInFlight === 0) this.close(this.pendingClose.code, this.pendingClose.reason);
        });
      };
      if (leases && waitForMoney(leases, money.pool, wake)) this.orgWake = wake;
    }
  }

  private closeAfterResponse(code: number, reason: string): void {
    this.pendingClose ??= { code, reason };
  }

  private finish(code: number, reason: string): void {
    const deps = this.deps;
    deps.sessions.delete(this);
    deps.openStreams?.remove(this);
    openSessions.closed();
    deps.stats.open--;
    if (this.upstreamPaused) deps.stats.pausedUpstreams--;
    deps.memory.leave(this, this.heldBytes);
    this.heldBytes = 0;
    if (this.orgWake && deps.leases) cancelMoneyWait(deps.leases, this.key, this.orgWake);
    // Responses the upstream had begun and not finished: the upstream did the work, so they are
    // billed the estimate of what went in and what had come out.
    for (const tally of this.tallies.takeAll()) this.charge(tally.counts());
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

