// The `/v1/realtime` WebSocket gateway. Every check of the HTTP pipeline (docs/design.md#order-of-checks)
// runs in uWS's `upgrade` handler before the socket is accepted: edge IP budgets (60 connection
// attempts per minute per IP, plus the general /v1 budget) → path sanity (400 bad_path) → credential
// (Authorization: Bearer only; a key offered as a WebSocket subprotocol is refused) → route → key
// budgets (the attempt is a request: one rpm, and a parallel slot held while the socket is open,
// waiting for a lease across nodes like any request) → `?model=` (400) → model scope (401) → the
// upstream (a ws handshake; refused or unreachable: 502). Refusals are plain HTTP answers in the model
// endpoints' shape (A) with the key's rate headers. Only then is the client upgraded.
import { RealtimeMemory } from './realtime-memory.js';
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp, type us_socket_context_t, type WebSocketBehavior } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { bearerToken } from '../auth/bearer.js';
import type { KeyRecord, StateHolder } from '../auth/key-table.js';
import { GatewayError } from '../errors.js';
import { deriveClientIp, headerLines } from '../http/client-ip.js';
import { isDraining } from '../drain.js';
import { logBug, Reply } from '../http/reply.js';
import type { RequestContext } from '../http/request-context.js';
import type { Admission } from '../http/admission.js';
import { blockedMessage } from '../http/admission.js';
import { LogDraft, logRow, unknownKeyPrefix, UnknownKeySampler, type LogHead } from '../http/request-log.js';
import { isBadPath } from '../routing/routes.js';
import type { Clock } from '../limits/clock.js';
import { presentsCredential, type EdgeBudgets } from '../limits/edge-budgets.js';
import { writeRateHeaders, type KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../limits/lease-client.js';
import { DemoRealtimeLink } from '../proxy/providers/demo-realtime.js';
import type { Reporter } from '../sync/reporter.js';
import { OpenSockets } from './open-sockets.js';
import { CLOSE, RealtimeSession, RealtimeStats, type UserData } from './session.js';
import type { SessionLogSink } from './session-log.js';
import type { UpstreamLink } from './upstream-link.js';
import { connectWsUpstream } from './ws-upstream.js';
import { DemoResponsesSocketLink, RESPONSES_PATH, ResponsesSocketLink, type ResponsesSocketHooks } from '../endpoints/responses-socket.js';
import type { DemoResponsesProvider } from '../proxy/providers/demo-responses.js';

/** The one path that accepts realtime sessions (OpenAI's: `wss://…/v1/realtime?model=…`). */
export const REALTIME_PATH = '/v1/realtime';
export const DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024;
export const DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024;
/** Seconds without any frame from the client (uWS pings it automatically before that). */
export const IDLE_TIMEOUT_SEC = 120;
const STALE_CHECK_MS = 1000;
const DEFAULT_MAX_NODE_BUFFERED_BYTES = 256 * 1024 * 1024;
const REALTIME_FULL_MESSAGE = 'This gateway node holds too many realtime messages right now; reconnect after the time in the retry-after header.';

export interface RealtimeDeps {
  holder: StateHolder;
  pepper: Buffer;
  clock: Clock;
  edge: EdgeBudgets;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  reporter: Reporter;
  isStale(): boolean;
  /** This process's instance id: request ids of attempts refused before admission start with it. */
  instanceId: string;
}

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

interface UpgradeHead {
  path: string;
  query: string;
  authorization: string;
  wsKey: string;
  protocol: string;
  extensions: string;
  ip: string;
  userAgent: string;
  /** performance.now() on arrival, for the request log's latency. */
  startedAt: number;
}

export class RealtimeGateway {
  /** Open sockets by key: what revocation, blocking and staleness close. */
  readonly sockets = new OpenSockets();
  readonly stats = new RealtimeStats();
  /** What every session holds together, bounded node-wide (realtime-memory.ts). */
  readonly memory: RealtimeMemory;
  private readonly maxBufferedBytes: number;
  private readonly maxMessageBytes: number;
  private readonly logSession: SessionLogSink;
  private staleTimer: NodeJS.Timeout | null = null;
  /** 401s of unknown keys are logged only as far as this allows (request-log.ts). */
  private readonly unknownKeys = new UnknownKeySampler();
  private seq = 0;
  /** The Responses API's WebSocket mode on `/v1/responses` (endpoints/responses-socket.ts); set by the HTTP server. */
  responses: { hooks: ResponsesSocketHooks; demo: DemoResponsesProvider } | null = null;

  constructor(
    private readonly deps: RealtimeDeps,
    private readonly admission: Admission,
    opts: RealtimeOptions = {},
  ) {
    this.maxBufferedBytes = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.memory = new RealtimeMemory(opts.maxNodeBufferedBytes ?? DEFAULT_MAX_NODE_BUFFERED_BYTES);
    this.stats.memory = this.memory;
    this.logSession = opts.logSession ?? (() => {});
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
    this.staleTimer = setInterval(() => {
      if (this.sockets.size > 0 && this.deps.isStale()) this.sockets.closeAll('invalid_api_key: this gateway node cannot currently verify API keys');
      this.memory.remeasureAll();
    }, STALE_CHECK_MS);
    this.staleTimer.unref();
  }

  /** After the node applied a snapshot or delta, before it acks: see OpenSockets.enforce. */
  enforce(): void {
    this.sockets.enforce(this.deps.holder.current);
  }

  /** Open sessions (the drain waits for them). */
  get open(): number {
    return this.sockets.size;
  }

  /** A stopping node ends every session with 1001; answers how many it closed. */
  closeAll(reason: string): number {
    const open = this.sockets.list();
    for (const s of open) (s as RealtimeSession).close(CLOSE.GOING_AWAY, reason);
    return open.length;
  }

  private upgrade(res: HttpResponse, req: HttpRequest, context: us_socket_context_t): void {
    let reply: Reply | null = null;
    try {
      // Rule 1: everything needed from req, before any check.
      const head: UpgradeHead = {
        path: req.getUrl(),
        query: req.getQuery() ?? '',
        authorization: req.getHeader('authorization'),
        wsKey: req.getHeader('sec-websocket-key'),
        protocol: req.getHeader('sec-websocket-protocol'),
        extensions: req.getHeader('sec-websocket-extensions'),
        ip: '',
        userAgent: req.getHeader('user-agent'),
        startedAt: performance.now(),
      };
      const hasCredential = presentsCredential(head.authorization, req.getHeader('x-api-key'), req.getHeader('api-key'));
      reply = new Reply(res);
      reply.requestId = this.nextRequestId();
      head.ip = deriveClientIp(Buffer.from(res.getRemoteAddressAsText()).toString(), this.deps.holder.current.view.trustedProxies, () => headerLines(req, 'x-forwarded-for'));
      this.check(res, reply, head, hasCredential, context);
    } catch (err) {
      logBug(err);
      try {
        if (reply) reply.sendError(err, 'openai');
        else res.cork(() => res.writeStatus('500 Internal Server Error').end());
      } catch (e) {
        logBug(e);
      }
    }
  }

  private check(res: HttpResponse, reply: Reply, head: UpgradeHead, hasCredential: boolean, context: us_socket_context_t): void {
    const deps = this.deps;
    if (!deps.holder.ready) return reply.sendError(new GatewayError('NOT_READY'), 'openai');
    // A draining node opens no new long-lived session (it would only be cut at the deadline).
    if (isDraining()) return reply.sendError(new GatewayError('NODE_DRAINING', undefined, { retryAfterSec: 1 }), 'openai', true);
    // The node-wide bound on what realtime sessions hold: no new session while it is reached.
    if (this.memory.full) return reply.sendError(new GatewayError('NODE_BUSY', REALTIME_FULL_MESSAGE, { retryAfterSec: 1 }), 'openai');
    const edge = deps.edge.take(head.ip, head.path, hasCredential);
    if (!edge.ok) return reply.sendError(new GatewayError('EDGE_RATE_LIMITED', undefined, { retryAfterSec: edge.retryAfterSec }), 'openai');
    if (isBadPath(head.path)) return reply.sendError(new GatewayError('BAD_PATH'), 'gateway');
    // Browser-style credentials (`openai-insecure-api-key.<key>` subprotocols) are refused: keys
    // never go in browser code (spec, Authentication 10). The value is never echoed.
    if (offersKeyInProtocol(head.protocol)) {
      return reply.sendError(
        new GatewayError('KEY_MISSING', 'API keys are not accepted in Sec-WebSocket-Protocol: connect from a server with "Authorization: Bearer <API_KEY>", and revoke a key that was put in browser code.'),
        'openai',
      );
    }
    if (!head.authorization) return reply.sendError(new GatewayError('KEY_MISSING'), 'openai');
    const presented = bearerToken(head.authorization);
    if (presented === null) return reply.sendError(new GatewayError('KEY_MISSING', 'Malformed Authorization header: expected "Bearer <API_KEY>".'), 'openai');
    const key = deps.holder.current.lookup(deps.pepper, presented, deps.clock.now());
    if (!key) {
      reply.sendError(new GatewayError('KEY_INVALID'), 'openai');
      return this.logRefusedKey(reply, head, presented);
    }
    // Every attempt of a known key is in its request log: a refusal when the reply ends, an accepted
    // session by the session itself when it closes (an upgraded reply never ends, so its entry is
    // never written twice).
    const draft = new LogDraft(deps.reporter, logHeadOf(head), key, () => deps.clock.now(), () => this.nextRequestId());
    draft.requestId = reply.requestId;
    reply.logDraft = draft;
    reply.rateHeaders = deps.keyBudgets.headers(key.limits);
    if (deps.isStale()) return reply.sendError(new GatewayError('KEY_STALE'), 'openai');
    if (key.org.blocked) return reply.sendError(new GatewayError('ORG_BLOCKED', blockedMessage(key.org.blockedReason)), 'openai');
    if (deps.leases?.canSpend(key.orgId) === 'no') return reply.sendError(new GatewayError('ORG_BLOCKED', blockedMessage('')), 'openai');
    deps.reporter.touch(key.keyId);
    if (head.path !== REALTIME_PATH && head.path !== RESPONSES_PATH) return reply.sendError(new GatewayError('NOT_FOUND', `No realtime endpoint at ${head.path}; connect to ${REALTIME_PATH}?model=MODEL.`), 'gateway');
    this.admission.admitOrWait(reply, key, head.path, 0, (ctx) => {
      if (ctx) this.admitted(ctx, res, reply, head, key, context);
    });
  }

  private admitted(ctx: RequestContext, res: HttpResponse, reply: Reply, head: UpgradeHead, key: KeyRecord, context: us_socket_context_t): void {
    // Refused by a later check: the attempt costs nothing, and its rate headers say so.
    const refuse = (err: GatewayError) => {
      ctx.refuse();
      reply.rateHeaders = this.deps.keyBudgets.headers(key.limits);
      reply.sendError(err, 'openai');
    };
    try {
      const state = this.deps.holder.current;
      const modelId = new URLSearchParams(head.query).get('model') ?? '';
      if (!modelId) return refuse(new GatewayError('INVALID_REQUEST', 'Missing required query parameter: model (connect to /v1/realtime?model=MODEL).', { param: 'model' }));
      const model = state.view.models.get(modelId);
      if (!model) return refuse(new GatewayError('UNKNOWN_MODEL', `The model \`${modelId}\` does not exist.`, { param: 'model' }));
      if (head.path === RESPONSES_PATH) return this.admitResponses(ctx, res, reply, head, key, model, context, refuse);
      if (model.kind !== 'realtime') {
        return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a realtime model; /v1/realtime needs a model of kind realtime.`, { param: 'model' }));
      }
      if (!state.mayUseModel(key, model.id)) {
        const tier = state.view.tiers.get(key.org.tier);
        const why = tier?.plan.has(model.id) ? "it is not in this key's allowed_models" : `it is not in the organisation's plan (${key.org.tier || 'no tier'})`;
        return refuse(new GatewayError('MODEL_NOT_ALLOWED', `This API key may not use the model \`${model.id}\`: ${why}.`, { param: 'model' }));
      }
      // ctx.model stays null: the session bills each response.done itself, never the context.
      if (model.provider === 'demo') return this.accept(ctx, res, reply, head, key, model, new DemoRealtimeLink(model), context);
      const upstream = state.view.config.realtimeUpstreams.find((u) => u.model === model.id);
      if (model.provider !== 'openai' || !upstream) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No realtime upstream is configured for \`${model.id}\`.`));
      const pending = connectWsUpstream(
        upstream,
        model.upstreamModel || model.id,
        { maxMessageBytes: this.maxMessageBytes },
        (link) => this.accept(ctx, res, reply, head, key, model, link, context),
        (err) =>
          guard(() => {
            // The upstream was tried: the attempt counts (as an HTTP call an upstream failed does).
            ctx.providerStarted = true;
            ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
            reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', err.message), 'openai');
          }),
      );
      ctx.abortFns.push(() => pending.cancel());
    } catch (e) {
      logBug(e);
      reply.sendError(e, 'openai');
    }
  }

  /** `/v1/responses` as a WebSocket: a chat model, its provider's Responses API over the socket. */
  private admitResponses(ctx: RequestContext, res: HttpResponse, reply: Reply, head: UpgradeHead, key: KeyRecord, model: ModelConfig, context: us_socket_context_t, refuse: (err: GatewayError) => void): void {
    const state = this.deps.holder.current;
    const r = this.responses;
    if (!r) return refuse(new GatewayError('NOT_FOUND', `No WebSocket endpoint at ${head.path}.`));
    if (model.kind !== 'chat') return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a chat model; ${RESPONSES_PATH} needs one.`, { param: 'model' }));
    if (!state.mayUseModel(key, model.id)) {
      const why = state.view.tiers.get(key.org.tier)?.plan.has(model.id) ? "it is not in this key's allowed_models" : `it is not in the organisation's plan (${key.org.tier || 'no tier'})`;
      return refuse(new GatewayError('MODEL_NOT_ALLOWED', `This API key may not use the model \`${model.id}\`: ${why}.`, { param: 'model' }));
    }
    const wrap = (link: UpstreamLink) => new ResponsesSocketLink(link, r.hooks, key, model, () => this.deps.holder.current);
    if (model.provider === 'demo') return this.accept(ctx, res, reply, head, key, model, wrap(new DemoResponsesSocketLink(r.demo, model.id)), context);
    if (model.provider !== 'openai' || !model.baseUrl) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No Responses upstream is configured for \`${model.id}\`.`));
    const url = new URL(model.baseUrl);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    url.pathname = `${url.pathname.replace(/\/+$/, '')}/responses`;
    const upstream = { model: model.id, url: url.toString(), upstreamApiKey: model.upstreamApiKey, upstreamModel: model.upstreamModel || model.id, connectTimeoutMs: 0 };
    const pending = connectWsUpstream(
      upstream,
      model.upstreamModel || model.id,
      { maxMessageBytes: this.maxMessageBytes },
      (link) => this.accept(ctx, res, reply, head, key, model, wrap(link), context),
      (err) =>
        guard(() => {
          ctx.providerStarted = true;
          ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
          reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', err.message), 'openai');
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

  private nextRequestId(): string {
    return `${this.deps.instanceId}-rt-${(++this.seq).toString(36)}`;
  }

  /**
   * A 401 for a key that matched no credential: logged against the key when it is a revoked key's
   * tombstone (the leak procedure reads these), else sampled with the IP and the first characters.
   */
  private logRefusedKey(reply: Reply, head: UpgradeHead, presented: string): void {
    const deps = this.deps;
    const outcome = { status: reply.status, bytesOut: reply.bytesOut, reason: reply.refusal };
    const dead = deps.holder.current.tombstone(deps.pepper, presented);
    if (dead) return deps.reporter.log(logRow(reply.requestId || this.nextRequestId(), deps.clock.now(), logHeadOf(head), dead, outcome, null));
    if (!this.unknownKeys.take(deps.clock.now())) return;
    deps.reporter.log(logRow(reply.requestId || this.nextRequestId(), deps.clock.now(), logHeadOf(head), { keyId: '', projectId: '', orgId: '' }, outcome, null, unknownKeyPrefix(presented)));
  }

  /** Upgrades the client (inside one cork, with the rate headers on the 101) and starts the session. */
  private accept(ctx: RequestContext, res: HttpResponse, reply: Reply, head: UpgradeHead, key: KeyRecord, model: ModelConfig, link: UpstreamLink, context: us_socket_context_t): void {
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
      this.upgradeClient(ctx, res, reply, head, key, model, link, context);
    } catch (e) {
      // Called from a ws event too: nothing may escape. The session never opened: release its slot.
      logBug(e);
      link.close(CLOSE.INTERNAL, 'gateway error');
      ctx.complete({ status: 500, promptTokens: 0, completionTokens: 0 });
      if (!reply.done) reply.sendError(e, 'openai');
    }
  }

  private upgradeClient(ctx: RequestContext, res: HttpResponse, reply: Reply, head: UpgradeHead, key: KeyRecord, model: ModelConfig, link: UpstreamLink, context: us_socket_context_t): void {
    ctx.providerStarted = true;
    const session = new RealtimeSession(
      {
        clock: this.deps.clock,
        keyBudgets: this.deps.keyBudgets,
        leases: this.deps.leases,
        reporter: this.deps.reporter,
        sockets: this.sockets,
        logSession: this.logSession,
        maxBufferedBytes: this.maxBufferedBytes,
        maxMessageBytes: this.maxMessageBytes,
        stats: this.stats,
        memory: this.memory,
        responsesApi: head.path === RESPONSES_PATH,
      },
      ctx,
      key,
      model,
      link,
      head.path,
      { clientIp: head.ip, userAgent: head.userAgent },
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
      res.upgrade<UserData>({ session }, head.wsKey, firstProtocol(head.protocol), head.extensions, context);
    });
  }
}

function logHeadOf(head: UpgradeHead): LogHead {
  return { method: 'GET', path: head.path, ip: head.ip, userAgent: head.userAgent, contentLength: 0, startedAt: head.startedAt };
}

function guard(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    logBug(e);
  }
}

/** A subprotocol that carries a credential: OpenAI's browser style, or a bare key. */
export function offersKeyInProtocol(protocolHeader: string): boolean {
  if (!protocolHeader) return false;
  return protocolHeader.split(',').some((p) => {
    const t = p.trim().toLowerCase();
    return t.includes('api-key') || t.includes('api_key') || t.startsWith('sk-') || t.includes('.sk-') || t.startsWith('bearer');
  });
}

/** The subprotocol answered: the client's first offer, if it made any (ws clients insist on one then). */
function firstProtocol(protocolHeader: string): string {
  return protocolHeader.split(',')[0]?.trim() ?? '';
}
