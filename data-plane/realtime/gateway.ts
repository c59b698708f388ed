// The `/v1/realtime` WebSocket gateway (and the Responses API's WebSocket mode on `/v1/responses`).
// Every check runs in uWS's `upgrade` handler before the socket is accepted, through the same gate as
// HTTP requests (gate/gate.ts; the differences are declared in gate/entrances.ts): readiness, drain,
// session memory, edge IP budgets (60 connection attempts per minute per IP, plus the general /v1
// budget), path sanity, a key offered as a subprotocol, the credential, stale, blocked, money, the
// route; then key budgets (the attempt is a request: one rpm, and a parallel slot held while the
// socket is open) → `?model=` (400) → model scope (401) → the upstream (a ws handshake; refused or
// unreachable: 502). Refusals are plain HTTP answers with the key's rate headers. Only then is the
// client upgraded.
import { RealtimeMemory } from './realtime-memory.js';
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp, type us_socket_context_t, type WebSocketBehavior } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyRecord, StateHolder } from '../auth/key-table.js';
import { GatewayError } from '../errors.js';
import type { Endpoint } from '../endpoints/intake.js';
import { offersKeyInProtocol, checkModelScope, type Gate } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import { logBug } from '../http/reply.js';
import type { Admission } from '../http/admission.js';
import { blockedMessage } from '../http/admission.js';
import { writeRateHeaders, type KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../limits/lease-client.js';
import type { Clock } from '../limits/clock.js';
import { DemoRealtimeLink } from '../proxy/providers/demo-realtime.js';
import type { Reporter } from '../sync/reporter.js';
import { REALTIME_PATH, RESPONSES_SOCKET_PATH as RESPONSES_PATH } from '../routing/routes.js';
import type { OpenStreams } from '../auth/open-streams.js';
import { CLOSE, RealtimeSession, RealtimeStats, type UserData } from './session.js';
import type { SessionLogSink } from './session-log.js';
import type { UpstreamLink } from './upstream-link.js';
import { connectWsUpstream } from './ws-upstream.js';
import { DemoResponsesSocketLink, ResponsesSocketLink, ResponsesTurnRules, responsesEventRefusal, type ResponsesSocketHooks } from '../endpoints/responses-socket.js';
import { RealtimeTurnRules } from '../endpoints/realtime-turns.js';
import { refuseAdmitted } from '../endpoints/intake.js';
import type { DemoResponsesProvider } from '../proxy/providers/demo-responses.js';

export { REALTIME_PATH, offersKeyInProtocol };
export const DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024;
export const DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024;
/** Seconds without any frame from the client (uWS pings it automatically before that). */
export const IDLE_TIMEOUT_SEC = 120;
const REMEASURE_MS = 1000;
const DEFAULT_MAX_NODE_BUFFERED_BYTES = 256 * 1024 * 1024;

export interface RealtimeDeps {
  holder: StateHolder;
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  reporter: Reporter;
  isStale(): boolean;
  /** What keys have open (auth/open-streams.ts): every session registers there until it closes. */
  openStreams?: OpenStreams;
}

/** `/v1/realtime` asked without an upgrade: not a request the HTTP endpoints serve (answered before admission). */
export const REALTIME_OVER_HTTP: Endpoint = {
  discardsRefusedStream: false,
  before(r: ApiRequest): boolean {
    r.reply.sendError(new GatewayError('INVALID_REQUEST', `${REALTIME_PATH} accepts WebSocket connections only: GET with "Upgrade: websocket" and ?model=MODEL.`, { param: null }), 'openai');
    return false;
  },
  bodyCap: (r) => r.family.bodyCapBytes,
  serve() {},
};

export interface RealtimeOptions {
  /** Bytes held for one client before its upstream is paused (default 1 MiB). */
  maxBufferedBytes?: number;
  /** Largest message either way (default 8 MiB). */
  maxMessageBytes?: number;
  /** Bytes all sessions together may hold before new ones are refused and upstreams paused (default 256 MiB). */
  maxNodeBufferedBytes?: number;
  /** THE seam for each session's request-log entry (session-log.ts). */
  logSession?: SessionLogSink;
}

export class RealtimeGateway {
  /** Open sessions (the drain ends them; revocation, blocking and staleness reach them through deps.openStreams). */
  readonly sessions = new Set<RealtimeSession>();
  readonly stats = new RealtimeStats();
  /** What every session holds together, bounded node-wide (realtime-memory.ts). */
  readonly memory: RealtimeMemory;
  private readonly maxBufferedBytes: number;
  private readonly maxMessageBytes: number;
  private readonly logSession: SessionLogSink;
  private remeasureTimer: NodeJS.Timeout | null = null;
  /** The Responses API's WebSocket mode on `/v1/responses` (endpoints/responses-socket.ts); set by the HTTP server. */
  responses: { hooks: ResponsesSocketHooks; demo: DemoResponsesProvider } | null = null;

  constructor(
    private readonly deps: RealtimeDeps,
    private readonly gate: Gate,
    private readonly admission: Admission,
    opts: RealtimeOptions = {},
  ) {
    this.maxBufferedBytes = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.memory = new RealtimeMemory(opts.maxNodeBufferedBytes ?? DEFAULT_MAX_NODE_BUFFERED_BYTES);
    this.stats.memory = this.memory;
    this.logSession = opts.logSession ?? (() => {});
    gate.sessionMemory = this.memory;
  }

  /** Registers the WebSocket routes (before the app's catch-all HTTP route). */
  register(app: TemplatedApp): void {
    const behavior: WebSocketBehavior<UserData> = {
      maxPayloadLength: this.maxMessageBytes,
      // Above the pause threshold by a message and a socket read, so uWS itself never drops one.
      maxBackpressure: this.maxBufferedBytes + 2 * this.maxMessageBytes + 256 * 1024,
      closeOnBackpressureLimit: 0,
      idleTimeout: IDLE_TIMEOUT_SEC,
      sendPingsAutomatically: true,
      // No compression: client-send.ts sets uWS's compress flag on every message only to avoid a
      // broken write path, and relies on this to keep the bytes uncompressed.
      compression: uWS.DISABLED,
      upgrade: (res, req, context) => this.upgrade(res, req, context),
      open: (ws) => guard(() => ws.getUserData().session.open(ws)),
      // The message buffer dies when the handler returns: copied (Buffer.from of a view copies).
      message: (ws, msg, isBinary) => guard(() => ws.getUserData().session.fromClient(Buffer.from(new Uint8Array(msg)), isBinary)),
      drain: (ws) => guard(() => ws.getUserData().session.drained()),
      close: (ws, code, msg) => guard(() => ws.getUserData().session.clientClosed(code, Buffer.from(msg).toString('utf8'))),
    };
    // A plain GET (no Sec-WebSocket-Key) falls through to the HTTP pipeline (uWS yields it).
    app.ws(REALTIME_PATH, behavior);
    app.ws(`${REALTIME_PATH}/*`, behavior);
    app.ws(RESPONSES_PATH, behavior);
    this.remeasureTimer = setInterval(() => {
      this.memory.remeasureAll();
    }, REMEASURE_MS);
    this.remeasureTimer.unref();
  }

  /** Open sessions (the drain waits for them). */
  get open(): number {
    return this.sessions.size;
  }

  /** A stopping node ends every session with 1001; answers how many it closed. */
  closeAll(reason: string): number {
    const open = [...this.sessions];
    for (const s of open) s.close(CLOSE.GOING_AWAY, reason);
    return open.length;
  }

  private upgrade(res: HttpResponse, req: HttpRequest, context: us_socket_context_t): void {
    let r: ApiRequest | null = null;
    try {
      r = this.gate.upgrade(res, req, context);
      const key = this.gate.pass(r);
      if (!key || !this.gate.route(r)) return;
      const attempt = r;
      this.admission.admitOrWait(
        r.reply,
        key,
        r.path,
        0,
        (ctx) => {
          if (!ctx) return;
          attempt.ctx = ctx;
          this.admitted(attempt);
        },
        undefined,
        r.shape,
      );
    } catch (err) {
      logBug(err);
      try {
        if (r) r.reply.sendError(err, 'openai');
        else res.cork(() => res.writeStatus('500 Internal Server Error').end());
      } catch (e) {
        logBug(e);
      }
    }
  }

  private admitted(r: ApiRequest): void {
    const ctx = r.ctx!;
    const reply = r.reply;
    const key = r.key!;
    // Refused by a later check: as an HTTP request is (the one rule, errors.ts `keepsRequest`: a 400
    // for what the attempt holds keeps its request of rpm), and its rate headers say so.
    const refuse = (err: GatewayError) => refuseAdmitted(ctx, reply, err, 'openai', false, this.deps.keyBudgets);
    try {
      const state = this.deps.holder.current;
      const modelId = new URLSearchParams(r.query).get('model') ?? '';
      if (!modelId) return refuse(new GatewayError('INVALID_REQUEST', 'Missing required query parameter: model (connect to /v1/realtime?model=MODEL).', { param: 'model' }));
      const model = state.view.models.get(modelId);
      if (!model) return refuse(new GatewayError('UNKNOWN_MODEL', `The model \`${modelId}\` does not exist.`, { param: 'model' }));
      if (r.path === RESPONSES_PATH) return this.admitResponses(r, model, refuse);
      if (model.kind !== 'realtime') {
        return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a realtime model; /v1/realtime needs a model of kind realtime.`, { param: 'model' }));
      }
      const scope = checkModelScope(state, key, model);
      if (scope) return refuse(scope);
      // ctx.model stays null: the session bills each response.done itself, never the context.
      if (model.provider === 'demo') return this.accept(r, model, new DemoRealtimeLink(model));
      const upstream = state.view.config.realtimeUpstreams.find((u) => u.model === model.id);
      if (model.provider !== 'openai' || !upstream) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No realtime upstream is configured for \`${model.id}\`.`));
      this.connect(r, model, upstream, (link) => link);
    } catch (e) {
      logBug(e);
      reply.sendError(e, 'openai');
    }
  }

  /** `/v1/responses` as a WebSocket: a chat model, its provider's Responses API over the socket. */
  private admitResponses(r: ApiRequest, model: ModelConfig, refuse: (err: GatewayError) => void): void {
    const state = this.deps.holder.current;
    const key = r.key!;
    const api = this.responses;
    if (!api) return refuse(new GatewayError('NOT_FOUND', `No WebSocket endpoint at ${r.path}.`));
    if (model.kind !== 'chat') return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a chat model; ${RESPONSES_PATH} needs one.`, { param: 'model' }));
    const scope = checkModelScope(state, key, model);
    if (scope) return refuse(scope);
    const wrap = (link: UpstreamLink) => new ResponsesSocketLink(link, api.hooks, key, model);
    if (model.provider === 'demo') return this.accept(r, model, wrap(new DemoResponsesSocketLink(api.demo, model.id)));
    if (model.provider !== 'openai' || !model.baseUrl) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No Responses upstream is configured for \`${model.id}\`.`));
    const url = new URL(model.baseUrl);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    url.pathname = `${url.pathname.replace(/\/+$/, '')}/responses`;
    this.connect(r, model, { model: model.id, url: url.toString(), upstreamApiKey: model.upstreamApiKey, upstreamModel: model.upstreamModel || model.id, connectTimeoutMs: 0 }, wrap);
  }

  /** Opens the upstream socket; the client is upgraded once it is open, refused with 502 if it fails. */
  private connect(r: ApiRequest, model: ModelConfig, upstream: Parameters<typeof connectWsUpstream>[0], wrap: (link: UpstreamLink) => UpstreamLink): void {
    const ctx = r.ctx!;
    const pending = connectWsUpstream(
      upstream,
      model.upstreamModel || model.id,
      { maxMessageBytes: this.maxMessageBytes },
      (link) => this.accept(r, model, wrap(link)),
      (err) =>
        guard(() => {
          // The upstream was tried: the attempt counts (as an HTTP call an upstream failed does).
          ctx.providerStarted = true;
          ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
          r.reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', err.message), 'openai');
        }),
    );
    ctx.abortFns.push(() => pending.cancel());
  }

  /** Why a key admitted before the upstream handshake may no longer open its session, or null. */
  private changedSinceAdmission(key: KeyRecord, model: ModelConfig): GatewayError | null {
    const state = this.deps.holder.current;
    const now = state.keysByHash.get(key.keyHash);
    if (!now) return new GatewayError('KEY_INVALID', 'This API key was revoked while the session was being opened.');
    if (this.deps.isStale()) return new GatewayError('KEY_STALE');
    if (now.org.blocked) return new GatewayError('ORG_BLOCKED', blockedMessage(now.org.blockedReason));
    if (!state.mayUseModel(now, model.id)) return new GatewayError('MODEL_NOT_ALLOWED', `This API key may no longer use the model \`${model.id}\`.`, { param: 'model' });
    return null;
  }

  /** Upgrades the client (inside one cork, with the rate headers on the 101) and starts the session. */
  private accept(r: ApiRequest, model: ModelConfig, link: UpstreamLink): void {
    const ctx = r.ctx!;
    const reply = r.reply;
    const key = r.key!;
    if (reply.done) {
      // The client left while the upstream was being opened: the context was settled by the abort.
      link.close(CLOSE.GOING_AWAY, 'client went away');
      return;
    }
    // The key, its organisation or its scope may have changed while the upstream was being opened (a
    // revocation acknowledged meanwhile must not be followed by a new session).
    const changed = this.changedSinceAdmission(key, model);
    if (changed) {
      link.close(CLOSE.GOING_AWAY, 'the client was refused');
      ctx.refuse();
      // A revoked key is unknown again: no rate headers, as for any unknown key.
      reply.rateHeaders = changed.code === 'KEY_INVALID' ? null : this.deps.keyBudgets.headers(key.limits);
      reply.sendError(changed, 'openai');
      return;
    }
    try {
      this.upgradeClient(r, model, link);
    } catch (e) {
      // Called from a ws event too: nothing may escape. The session never opened: release its slot.
      logBug(e);
      link.close(CLOSE.INTERNAL, 'gateway error');
      ctx.complete({ status: 500, promptTokens: 0, completionTokens: 0 });
      if (!reply.done) reply.sendError(e, 'openai');
    }
  }

  private upgradeClient(r: ApiRequest, model: ModelConfig, link: UpstreamLink): void {
    const ctx = r.ctx!;
    const reply = r.reply;
    const res = r.res;
    ctx.providerStarted = true;
    const responsesApi = r.path === RESPONSES_PATH;
    const session = new RealtimeSession(
      {
        clock: this.deps.clock,
        keyBudgets: this.deps.keyBudgets,
        leases: this.deps.leases,
        admission: this.admission,
        turnRules: responsesApi ? new ResponsesTurnRules(this.responses!.hooks, r.key!, model, () => this.deps.holder.current) : new RealtimeTurnRules(),
        eventRefusal: responsesApi ? responsesEventRefusal : undefined,
        openStreams: this.deps.openStreams,
        sessions: this.sessions,
        logSession: this.logSession,
        maxBufferedBytes: this.maxBufferedBytes,
        maxMessageBytes: this.maxMessageBytes,
        stats: this.stats,
        memory: this.memory,
        responsesApi,
      },
      ctx,
      r.key!,
      model,
      link,
      r.path,
      { clientIp: r.ip, userAgent: r.userAgent },
    );
    const headers = reply.extraHeaders;
    const rate = reply.rateHeaders;
    const requestId = reply.requestId;
    reply.markUpgraded();
    res.cork(() => {
      res.writeStatus('101 Switching Protocols');
      if (headers) for (const [k, v] of headers) res.writeHeader(k, v);
      if (rate) writeRateHeaders(rate, res);
      if (requestId) res.writeHeader('x-request-id', requestId);
      res.upgrade<UserData>({ session }, r.wsKey, firstProtocol(r.protocol), r.extensions, r.socketContext!);
    });
  }
}

function guard(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    logBug(e);
  }
}

/** The subprotocol answered: the client's first offer, if it made any (ws clients insist on one then). */
function firstProtocol(protocolHeader: string): string {
  return protocolHeader.split(',')[0]?.trim() ?? '';
}
