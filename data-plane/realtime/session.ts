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
import { logBug } from '../http/reply.js';
import { findDuplicateKey } from '../http/validate-request.js';
import type { RequestContext } from '../http/request-context.js';
import { minuteOf, secondsToNextMinute, type Clock } from '../limits/clock.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../limits/lease-client.js';
import { cancelMoneyWait, moneyVerdict, reserveMoney, waitForMoney } from '../limits/money-pools.js';
import type { Reporter } from '../sync/reporter.js';
import { blockedReasonText, type OpenSocket, type OpenSockets } from './open-sockets.js';
import type { RealtimeSessionLog, SessionLogSink } from './session-log.js';
import type { UpstreamLink } from './upstream-link.js';
import type { MemoryMember, RealtimeMemory } from './realtime-memory.js';
import { AUDIO_DELTAS, base64Bytes, ResponseTally, TEXT_DELTAS } from './response-estimate.js';

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
/** Responses in flight tallied apart; past this many, a new one's counts join the last one's (still billed). */
const MAX_TALLIED_RESPONSES = 64;

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
  /** The node-wide bound on what all sessions hold together. */
  memory: RealtimeMemory;
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
  /** The node-wide bound, for its figures. */
  memory: RealtimeMemory | null = null;

  snapshot(reset = false): { open: number; opened: number; paused_upstreams: number; peak_buffered_bytes: number; node_buffered_bytes: number; node_max_buffered_bytes: number } {
    const out = {
      open: this.open,
      opened: this.opened,
      paused_upstreams: this.pausedUpstreams,
      peak_buffered_bytes: this.peakBufferedBytes,
      node_buffered_bytes: this.memory?.held ?? 0,
      node_max_buffered_bytes: this.memory?.maxBytes ?? 0,
    };
    if (reset) this.peakBufferedBytes = 0;
    return out;
  }
}

export interface UserData {
  session: RealtimeSession;
}

type Obj = Record<string, any>;

export class RealtimeSession implements OpenSocket, MemoryMember {
  readonly keyHash: string;
  readonly orgId: string;
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
  /** What the client sent since the last response began: the next response's input. */
  private pendingInput = new ResponseTally();
  /** The responses in flight (response.created seen, no response.done), by id, with their counts. */
  private readonly tallies = new Map<string, ResponseTally>();
  private lastTally: ResponseTally | null = null;
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
    if (!isBinary) this.tallyClientEvent(data);
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
    let transcribed: Obj | null = null;
    if (!isBinary) {
      // Told apart by the event's own `type` member, never by text found anywhere in it (a client's
      // metadata, echoed back, can hold any text). The Responses API's WebSocket mode bills each
      // response on its final event instead of `response.done`.
      const type = eventTypeOf(data);
      if (type === 'response.created') {
        this.responsesInFlight++;
        this.responseCreated(parse(data));
      } else if (type === 'response.done' || (this.deps.responsesApi === true && type !== undefined && RESPONSES_FINAL.includes(type))) done = parse(data);
      else if (type === TRANSCRIPTION_DONE) transcribed = parse(data);
      else if (type !== undefined && (TEXT_DELTAS.has(type) || AUDIO_DELTAS.has(type))) this.tallyDelta(data, AUDIO_DELTAS.has(type));
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

  /** A client event that adds to the next response's input: counted, then forgotten. */
  private tallyClientEvent(data: Buffer): void {
    const type = eventTypeOf(data);
    const t = this.pendingInput;
    if (type === 'input_audio_buffer.append') {
      const [audio] = stringMemberSpans(data, ['audio']);
      if (audio) t.audioInBytes += base64SpanBytes(data, audio);
    } else if (type === 'conversation.item.create') t.addItem(parse(data)?.item);
    else if (type === 'session.update') t.addConfig(parse(data)?.session);
    else if (type === 'response.create') t.addConfig(parse(data)?.response);
  }

  /** A response began upstream: what the client sent since the last one is its input. */
  private responseCreated(ev: Obj | null): void {
    const tally = this.pendingInput;
    this.pendingInput = new ResponseTally();
    const id = typeof ev?.response?.id === 'string' ? ev.response.id : `#${this.counts.toClient}`;
    const known = this.tallies.get(id);
    if (known) known.add(tally);
    else if (this.tallies.size >= MAX_TALLIED_RESPONSES && this.lastTally) this.lastTally.add(tally);
    else this.tallies.set(id, tally);
    this.lastTally = this.tallies.get(id) ?? this.lastTally;
  }

  /** An output delta, to the response it names (else the last one begun). */
  private tallyDelta(data: Buffer, audio: boolean): void {
    const [delta, responseId] = stringMemberSpans(data, ['delta', 'response_id']);
    if (!delta) return;
    const id = responseId ? decodeString(data, responseId[0], responseId[1]) : undefined;
    const tally = (id !== undefined ? this.tallies.get(id) : undefined) ?? this.lastTally ?? this.pendingInput;
    if (audio) tally.audioOutBytes += base64SpanBytes(data, delta);
    else tally.addTextOut(decodeString(data, delta[0], delta[1]) ?? '');
  }

  /**
   * The counts of the response `ev` ends, taken out of those in flight: by its id, else the oldest in
   * flight, else (no response.created was seen) what the client sent since the last one.
   */
  private takeTally(ev: Obj): ResponseTally {
    const named = ev.response?.id;
    const id = typeof named === 'string' && this.tallies.has(named) ? named : this.tallies.keys().next().value;
    if (id === undefined) {
      const waiting = this.pendingInput;
      this.pendingInput = new ResponseTally();
      return waiting;
    }
    const tally = this.tallies.get(id)!;
    this.tallies.delete(id);
    if (this.lastTally === tally) {
      this.lastTally = null;
      for (const t of this.tallies.values()) this.lastTally = t;
    }
    return tally;
  }

  /** One `response.done`: tokens against tpm, cost to the organisation, then the limits checked. */
  private account(ev: Obj): void {
    this.responsesInFlight = Math.max(0, this.responsesInFlight - 1);
    const tally = this.takeTally(ev);
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
      this.closeAfterResponse(CLOSE.POLICY, `insufficient_quota: ${money && money.pool ? money.short : blockedReasonText(org.blockedReason)}`);
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
    deps.sockets.remove(this);
    deps.stats.open--;
    if (this.upstreamPaused) deps.stats.pausedUpstreams--;
    deps.memory.leave(this, this.heldBytes);
    this.heldBytes = 0;
    if (this.orgWake && deps.leases) cancelMoneyWait(deps.leases, this.key, this.orgWake);
    // Responses the upstream had begun and not finished: the upstream did the work, so they are
    // billed the estimate of what went in and what had come out.
    for (const tally of this.tallies.values()) this.charge(tally.counts());
    this.tallies.clear();
    this.lastTally = null;
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

/**
 * The top-level `type` of a JSON event, as JSON.parse would read it (the last `type` member wins),
 * found by one scan that skips every value without decoding it: strings by the native indexOf of their
 * closing quote, so large audio deltas cost little. Undefined when the text is not a JSON object with a
 * string `type`.
 */
export function eventTypeOf(data: Buffer): string | undefined {
  const n = data.length;
  let i = skipSpace(data, 0);
  if (data[i] !== 123 /* { */) return undefined;
  i = skipSpace(data, i + 1);
  if (data[i] === 125 /* } */) return undefined;
  let type: string | undefined;
  while (i < n) {
    if (data[i] !== 34 /* " */) return undefined;
    const keyEnd = stringEnd(data, i);
    if (keyEnd < 0) return undefined;
    const isType = isTypeKey(data, i, keyEnd);
    i = skipSpace(data, keyEnd);
    if (data[i] !== 58 /* : */) return undefined;
    i = skipSpace(data, i + 1);
    const valueEnd = skipValue(data, i);
    if (valueEnd < 0) return undefined;
    if (isType) type = data[i] === 34 ? decodeString(data, i, valueEnd) : undefined;
    i = skipSpace(data, valueEnd);
    if (data[i] === 125) return skipSpace(data, i + 1) === n ? type : undefined;
    if (data[i] !== 44 /* , */) return undefined;
    i = skipSpace(data, i + 1);
  }
  return undefined;
}

/**
 * The spans ([start, end), quotes included) of top-level string members of a JSON object event, one
 * per name (the last occurrence, as JSON.parse reads it), found by the same scan as eventTypeOf
 * without decoding any value. Undefined for a name absent, not a string, or a text that is no object.
 */
export function stringMemberSpans(data: Buffer, names: readonly string[]): Array<[number, number] | undefined> {
  const found: Array<[number, number] | undefined> = names.map(() => undefined);
  const n = data.length;
  let i = skipSpace(data, 0);
  if (data[i] !== 123 /* { */) return found;
  i = skipSpace(data, i + 1);
  while (i < n && data[i] === 34) {
    const keyEnd = stringEnd(data, i);
    if (keyEnd < 0) break;
    const key = keyEnd - i <= 66 ? (data.subarray(i, keyEnd).includes(92) ? decodeString(data, i, keyEnd) : data.toString('latin1', i + 1, keyEnd - 1)) : undefined;
    i = skipSpace(data, keyEnd);
    if (data[i] !== 58 /* : */) break;
    i = skipSpace(data, i + 1);
    const valueEnd = skipValue(data, i);
    if (valueEnd < 0) break;
    const at = key === undefined ? -1 : names.indexOf(key);
    if (at >= 0) found[at] = data[i] === 34 ? [i, valueEnd] : undefined;
    i = skipSpace(data, valueEnd);
    if (data[i] !== 44 /* , */) break;
    i = skipSpace(data, i + 1);
  }
  return found;
}

/** The bytes the base64 JSON string at `span` (quotes included) decodes to, without decoding it. */
function base64SpanBytes(data: Buffer, [start, end]: [number, number]): number {
  const close = end - 1;
  const padding = data[close - 1] === 61 /* = */ ? (data[close - 2] === 61 ? 2 : 1) : 0;
  return base64Bytes(close - start - 1, padding);
}

/** Whether the key string in [start, end) is `"type"`, spelled plainly or with escapes. */
function isTypeKey(data: Buffer, start: number, end: number): boolean {
  if (end - start === 6) return data[start + 1] === 116 && data[start + 2] === 121 && data[start + 3] === 112 && data[start + 4] === 101;
  if (end - start > 64) return false;
  return data.subarray(start, end).includes(92) && decodeString(data, start, end) === 'type';
}

function skipSpace(data: Buffer, from: number): number {
  let i = from;
  while (i < data.length && (data[i] === 32 || data[i] === 10 || data[i] === 13 || data[i] === 9)) i++;
  return i;
}

/** The index after the closing quote of the string opening at `at`, or -1. */
function stringEnd(data: Buffer, at: number): number {
  let i = at + 1;
  for (;;) {
    const q = data.indexOf(34, i);
    if (q < 0) return -1;
    // Escaped when an odd number of backslashes precede it.
    let b = q - 1;
    while (b > at && data[b] === 92) b--;
    if ((q - 1 - b) % 2 === 0) return q + 1;
    i = q + 1;
  }
}

function decodeString(data: Buffer, start: number, end: number): string | undefined {
  try {
    const v = JSON.parse(data.toString('utf8', start, end)) as unknown;
    return typeof v === 'string' ? v : undefined;
  } catch {
    return undefined;
  }
}

/** The index after the JSON value starting at `at`, or -1 (nested values by their brackets). */
function skipValue(data: Buffer, at: number): number {
  const c = data[at];
  if (c === 34) return stringEnd(data, at);
  if (c === 123 || c === 91 /* [ */) {
    let depth = 0;
    for (let i = at; i < data.length; i++) {
      const d = data[i];
      if (d === 34) {
        i = stringEnd(data, i);
        if (i < 0) return -1;
        i--;
      } else if (d === 123 || d === 91) depth++;
      else if ((d === 125 || d === 93) && --depth === 0) return i + 1;
    }
    return -1;
  }
  // A number or a literal: up to the next delimiter.
  let i = at;
  while (i < data.length && data[i] !== 44 && data[i] !== 125 && data[i] !== 93 && data[i] !== 32 && data[i] !== 10 && data[i] !== 13 && data[i] !== 9) i++;
  return i > at ? i : -1;
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
  if (ev.type === 'transcription_session.update' || (ev.type === 'session.update' && turnsOnTranscription(ev.session))) {
    return errorEvent(
      'feature_not_available',
      'Input audio transcription is not available through this gateway: it is billed by the upstream apart from the session. Transcribe with /v1/audio/transcriptions instead.',
      'session.audio.input.transcription',
      eventId,
    );
  }
  if (ev.type !== 'session.update') return null;
  const wanted = ev.session?.model;
  if (wanted === undefined || wanted === model.id || wanted === model.upstreamModel) return null;
  return errorEvent('model_not_allowed', `This session is for the model \`${model.id}\`; open a new session to use another model.`, 'session.model', eventId);
}

/** The upstream event that reports a transcription of the input audio (with its own usage). */
const TRANSCRIPTION_DONE = 'conversation.item.input_audio_transcription.completed';

/** Whether a session.update's session asks for input audio transcription (beta and GA shapes). */
function turnsOnTranscription(session: unknown): boolean {
  if (!session || typeof session !== 'object') return false;
  const s = session as Obj;
  if (s.input_audio_transcription !== undefined && s.input_audio_transcription !== null) return true;
  const t = s.audio?.input?.transcription;
  return t !== undefined && t !== null;
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
