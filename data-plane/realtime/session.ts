// One open realtime session: the client's uWS socket relayed to its upstream link, both ways, with
// backpressure on both sides. Each response on it is a turn (endpoints/socket-turns.ts), admitted and
// billed as a request; the session only relays, counts, and ends.
//
// Backpressure:
// - upstream → client: after each send, when uWS holds `maxBufferedBytes` or more for the client
//   (getBufferedAmount), the upstream is paused (its socket is not read, so its messages wait at the
//   upstream); uWS's `drain` resumes it once half of that has gone out.
// - client → upstream: uWS cannot stop reading a WebSocket, so the upstream link's unsent bytes (and
//   what waits behind a turn being admitted) are watched instead: a client that keeps sending past
//   `maxBufferedBytes` + one message of what the upstream has not taken is closed (1008), never
//   buffered without bound.
//
// Turns: a client's `response.create` is admitted (rpm, its tpm estimate, money) before it goes on;
// while its admission waits for a lease, the client's later messages wait behind it, in order. A
// refused turn is answered in-band and not forwarded. Each response's final event (`response.done`,
// or the Responses API's `response.completed|incomplete|failed`) settles its turn with the upstream's
// usage; one without usable usage, and every response still in flight when the session ends (revoked,
// blocked, drained, client or upstream gone), is billed the estimate of response-estimate.ts, counted
// as the messages pass, never kept. When the key's tpm is spent or the organisation's money runs
// out, the socket is closed after the response in flight (1013 for tpm, 1008 for money), with a
// reason that says why.
import type { WebSocket } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { TokenCounts } from '../../proto/lib/money.js';
import { serviceTierOf, tokenUsageOf } from '../proxy/usage/usage-readers.js';
import { toolCallsOfOutput, type ReportedFacts } from '../../proto/lib/reported-prices.js';
import type { KeyRecord } from '../state/key-table.js';
import { log, logBug } from '../log.js';
import type { RequestContext } from '../request/request-context.js';
import type { Clock } from '../limits/clock.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../leases/lease-client.js';
import type { SocketTurns, TurnSocket } from '../endpoints/socket-turns.js';
import type { EndReason, OpenEntry, OpenStreams } from '../state/open-streams.js';
import { closeReasonOf, type GatewayError } from '../errors.js';
import { openStreamGauge } from '../metrics.js';
import type { RealtimeSessionLog, SessionLogSink } from './session-log.js';
import type { UpstreamLink } from '../proxy/upstream-link.js';
import type { MemoryMember, RealtimeMemory } from './realtime-memory.js';
import { ResponseTallies } from './response-tallies.js';
import { eventTypeOf, parse, parseText, type Obj } from './event-scan.js';
import { clientEventRefusal, TRANSCRIPTION_DONE } from './client-events.js';
import { CLOSE, isSendableCode, truncateReason } from '../endpoints/close-codes.js';
import type { RealtimeStats } from './realtime-stats.js';
import { sendToClientSocket } from './client-send.js';
import { SessionLimits } from './session-limits.js';

export interface SessionDeps {
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  /** The session's turns, admitted and billed as requests (endpoints/sockets.ts makes them). */
  turns(socket: TurnSocket): SocketTurns;
  /**
   * A client message of the Responses API's WebSocket mode that is not passed on, as an error event
   * (endpoints/responses/responses-socket.ts `responsesEventRefusal`); absent on /v1/realtime.
   */
  eventRefusal?: (data: Buffer, isBinary: boolean) => Buffer | null;
  /** The node's one registry of what keys have open (state/open-streams.ts): its policy ends a session. */
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

export class RealtimeSession implements OpenEntry, MemoryMember, TurnSocket {
  readonly keyHash: string;
  readonly orgId: string;
  /** Its slot in the registry of what keys have open (slot-set.ts). */
  slot = -1;
  readonly modelId: string;
  private ws: WebSocket<UserData> | null = null;
  private ended = false;
  /** Registered and counted as open (`start`): a socket closed during its upgrade never was. */
  private started = false;
  private responsesInFlight = 0;
  private upstreamPaused = false;
  /** What this session held when last measured (its share of RealtimeMemory.held). */
  private heldBytes = 0;
  /** The key's tpm and the money, checked after each response (session-limits.ts). */
  private readonly limits: SessionLimits;
  private readonly startedAtMs: number;
  /** The counts of what went in and came out, per response in flight. */
  private readonly tallies = new ResponseTallies();
  private readonly counts = { fromClient: 0, toClient: 0, bytesFromClient: 0, bytesToClient: 0, responses: 0, prompt: 0, completion: 0, cost: 0 };
  /** Each response a turn: admitted, checked, billed (endpoints/socket-turns.ts). */
  private readonly turns: SocketTurns;
  /** Client messages that arrived while a turn was being admitted, in order, and their bytes. */
  private held: Array<[Buffer, boolean]> = [];
  private heldClientBytes = 0;

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
    this.turns = deps.turns(this);
    this.limits = new SessionLimits(deps, key, () => this.closeIfDecided());
  }

  /** TurnSocket: the session is over (a turn admitted late is given back). */
  get closed(): boolean {
    return this.ended;
  }

  /**
   * TurnSocket: the gateway's own answer to a client (a refused turn or event). Nothing upstream can be
   * paused for these, so a client that keeps sending what is refused without reading the answers is
   * closed once they pass what the node holds for one client.
   */
  toClient(data: Buffer): void {
    this.sendToClient(data, false);
    const ws = this.ws;
    if (ws && ws.getBufferedAmount() > this.deps.maxBufferedBytes + this.deps.maxMessageBytes) {
      this.close(CLOSE.POLICY, 'the client sends faster than it reads its answers; slow down');
    }
  }

  /** TurnSocket: an admitted, checked create goes on. */
  toUpstream(data: Buffer): void {
    this.forward(data, false);
  }

  /** TurnSocket: a turn's admission ended after a wait: what the client sent meanwhile goes on, in order. */
  settled(): void {
    while (!this.ended && !this.turns.admitting && this.held.length > 0) {
      const [data, isBinary] = this.held.shift()!;
      this.heldClientBytes -= data.length;
      this.relay(data, isBinary);
    }
  }

  /** uWS `open`, inside the upgrade's cork where nothing else may run (gateway.ts `upgrade`): the socket kept. */
  attach(ws: WebSocket<UserData>): void {
    this.ws = ws;
  }

  /** Right after the upgrade's cork: the session starts, and the upstream's messages may flow. */
  start(): void {
    if (this.ended) return;
    if (!this.ws) return this.clientClosed(CLOSE.INTERNAL, 'the socket did not open');
    this.started = true;
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
    if (!this.turns.admitting) return this.relay(data, isBinary);
    // Behind a turn being admitted: held in order, within the same bound as the upstream's buffer.
    this.held.push([data, isBinary]);
    this.heldClientBytes += data.length;
    if (this.heldClientBytes + this.link.bufferedAmount > this.deps.maxBufferedBytes + this.deps.maxMessageBytes) {
      this.close(CLOSE.POLICY, 'the client sends faster than the upstream accepts; slow down');
    }
  }

  /** A client message in its turn: refused in-band, admitted as a turn, or passed on. */
  private relay(data: Buffer, isBinary: boolean): void {
    const refused = this.deps.eventRefusal?.(data, isBinary);
    if (refused) return this.toClient(refused);
    // The model is the one the session was admitted and is billed for: a client may not switch it,
    // however the event is spelled (a `\u` escape can write any of its characters) or framed (binary).
    if (data.includes('"session.update"') || data.includes('\\u') || data.includes('transcription')) {
      const refusal = clientEventRefusal(data, this.model);
      if (refusal) return this.toClient(Buffer.from(JSON.stringify(refusal)));
    }
    // A create is a turn however it is framed: an upstream may read a binary frame as an event too.
    const type = eventTypeOf(data);
    if (!isBinary || type !== undefined) this.tallies.clientEvent(data, this.deps.responsesApi === true);
    // One that does not parse is a turn too: admitted, then refused as malformed, never forwarded.
    if (type === 'response.create') return this.turns.create(parseText(data.toString('utf8')) ?? {}, data, this.tallies.pendingInputTokens());
    this.forward(data, isBinary);
  }

  /** To the upstream, within what it may hold for this client. */
  private forward(data: Buffer, isBinary: boolean): void {
    if (this.ended) return;
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

  /** The registry's policy ends the session (state/open-streams.ts): closed now, 1008, the reason's one text. */
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
        const ev = parse(data);
        const id = typeof ev?.response?.id === 'string' ? (ev.response.id as string) : `#${this.counts.toClient}`;
        this.tallies.created(id);
        this.turns.began(id);
      } else if (type === 'response.done' || (this.deps.responsesApi === true && type !== undefined && RESPONSES_FINAL.includes(type))) done = parse(data);
      else if (type === TRANSCRIPTION_DONE) transcribed = parse(data);
      else if (type === 'error') this.turns.upstreamError(parse(data));
      else if (type !== undefined) this.tallies.upstreamEvent(type, data, this.deps.responsesApi === true);
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

  /** One response's final event: its turn billed (the upstream's usage, else what was counted), then the limits checked. */
  private account(ev: Obj): void {
    this.responsesInFlight = Math.max(0, this.responsesInFlight - 1);
    const id = typeof ev.response?.id === 'string' ? (ev.response.id as string) : undefined;
    const tally = this.tallies.take(id);
    const usage: (TokenCounts & ReportedFacts) | null = tokenUsageOf(ev.response?.usage) ?? null;
    // The Responses API's final event: the tier it ran on and its built-in tool calls are billed too
    // (proto/lib/reported-prices.ts), as over HTTP; they go with the usage to the turn's one bill.
    if (usage && this.deps.responsesApi === true) {
      usage.serviceTier = serviceTierOf(ev.response?.service_tier);
      if (Array.isArray(ev.response?.output)) usage.toolCalls = toolCallsOfOutput(ev.response.output);
    }
    const counts = usage ?? tally.counts();
    this.noteBilled(counts, this.turns.ended(id, usage, tally.counts()));
    this.checkLimits();
  }

  /** A transcription of input audio the upstream reports with token usage. */
  private accountTranscription(ev: Obj): void {
    const usage = tokenUsageOf(ev.usage);
    if (usage) this.noteBilled(usage, this.turns.extra(usage));
    this.checkLimits();
  }

  /** For the session's log entry. */
  private noteBilled(usage: TokenCounts, cost: number): void {
    this.counts.responses++;
    this.counts.prompt += usage.promptTokens;
    this.counts.completion += usage.completionTokens;
    this.counts.cost += cost;
  }

  /** After a response: the limits, then the close they decided once nothing is in flight. */
  private checkLimits(): void {
    if (this.ended) return;
    this.limits.check();
    this.closeIfDecided();
  }

  private closeIfDecided(): void {
    const c = this.limits.pendingClose;
    if (c && this.responsesInFlight === 0) this.close(c.code, c.reason);
  }

  private finish(code: number, reason: string): void {
    const deps = this.deps;
    if (this.started) {
      deps.sessions.delete(this);
      deps.openStreams?.remove(this);
      openSessions.closed();
      deps.stats.open--;
      if (this.upstreamPaused) deps.stats.pausedUpstreams--;
      deps.memory.leave(this, this.heldBytes);
    } else {
      // uWS shut the socket inside the upgrade's cork (gateway.ts `upgrade`): the client saw a bare 1006.
      log.warn({ requestId: this.ctx.requestId, closeCode: code, closeReason: reason }, 'realtime socket closed during its upgrade, before its session started');
    }
    this.heldBytes = 0;
    this.limits.stop();
    // Responses the upstream had begun and not finished: the upstream did the work, so they are
    // billed the estimate of what went in and what had come out; a create forwarded and not begun,
    // its input estimate.
    const counted = this.tallies.takeAll();
    for (const b of this.turns.endAll((id) => counted.get(id)?.counts())) this.noteBilled(b.counts, b.cost);
    // The session's request and slot: the slot is released, its tokens were counted per response.
    this.ctx.complete({ status: 101, promptTokens: 0, completionTokens: 0 });
    const now = deps.clock.now();
    const c = this.counts;
    const entry: RealtimeSessionLog = {
      requestId: this.ctx.requestId, keyId: this.key.keyId, orgId: this.key.orgId, projectId: this.key.projectId,
      model: this.model.id, path: this.path, clientIp: this.client.clientIp, userAgent: this.client.userAgent,
      startedAtMs: this.startedAtMs, durationMs: Math.max(0, now - this.startedAtMs),
      messagesFromClient: c.fromClient, messagesToClient: c.toClient, bytesFromClient: c.bytesFromClient, bytesToClient: c.bytesToClient,
      responses: c.responses, promptTokens: c.prompt, completionTokens: c.completion, costMicros: c.cost,
      closeCode: code, closeReason: reason,
    };
    try {
      deps.logSession(entry);
    } catch (e) {
      logBug(e);
    }
    // How it ended, on the node itself (debug): what a client saw as 1006 may have been a close of ours.
    log.debug({ requestId: entry.requestId, closeCode: code, closeReason: reason, responses: c.responses, messagesFromClient: c.fromClient, messagesToClient: c.toClient }, 'realtime session closed');
  }
}

