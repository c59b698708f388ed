// THE order of checks (docs/design.md#order-of-checks, docs/design.md#the-gate), for HTTP requests and
// WebSocket upgrades alike: ready → [draining, session memory: upgrades] → edge IP budgets → [body cap:
// HTTP] → path sanity (400 bad_path) → [key in a subprotocol: upgrades] → credential (401) → log entry
// → stale (401) → organisation blocked (401) → money (can spend, 401) → route (404/405). Admission
// (key budgets, 429) follows in the endpoint, once it knows what the body costs. What differs between
// the two entrances is declared in entrances.ts and read from there only. One unknown-key sampler, one
// request-id counter and one model-scope message serve both. Nothing here awaits.
import type { HttpRequest, HttpResponse, us_socket_context_t } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { bearerToken } from './bearer.js';
import type { GatewayState, KeyRecord, StateHolder } from '../state/key-table.js';
import type { OpenStreams } from '../state/open-streams.js';
import { registerOpenRequest } from '../request/open-request.js';
import { isDraining } from '../drain.js';
import { GatewayError, type ErrorShape } from '../errors.js';
import { blockedMessage } from '../request/admission.js';
import { copiedHeaderLines, deriveClientIp, headerLines } from '../request/client-ip.js';
import { Reply } from '../request/reply.js';
import { LogDraft, logRow, refusalReason, unknownKeyPrefix, UnknownKeySampler } from '../request/request-log.js';
import type { Clock } from '../limits/clock.js';
import { presentsCredential, type EdgeBudgets } from '../limits/edge-budgets.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { RateHeaders } from '../limits/rate-headers.js';
import type { LeaseClient } from '../leases/lease-client.js';
import { moneyRefusal, orgRefusal } from '../leases/request-money.js';
import { requestStarted } from '../metrics.js';
import { familyOf } from '../routing/path-families.js';
import { REALTIME_PATH, SOCKET_ROUTES, type Route } from '../routing/routes.js';
import { isBadPath } from '../routing/path-sanity.js';
import type { Reporter } from '../sync/reporter.js';
import { HTTP, UPGRADE } from './entrances.js';
import { ApiRequest } from './api-request.js';

/** The error shape of a path the router does not know: the gateway layer's (the spec's Shape B). */
const UNROUTED_SHAPE: ErrorShape = 'gateway';

export interface GateDeps {
  holder: StateHolder;
  pepper: Buffer;
  clock: Clock;
  edge: EdgeBudgets;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  reporter: Reporter;
  /** True when the node was cut off from the control plane longer than the configured maximum. */
  isStale(): boolean;
  /** This process's instance id: every request id starts with it. */
  instanceId: string;
  /** Every HTTP request of a key from authentication to its end, so revocation can end it. */
  openStreams?: OpenStreams;
}

const REALTIME_FULL_MESSAGE = 'This gateway node holds too many realtime messages right now; reconnect after the time in the retry-after header.';

export class Gate {
  private seq = 0;
  /** 401s of unknown keys are logged only as far as this allows: one sampler for the node (request-log.ts). */
  readonly unknownKeys = new UnknownKeySampler();
  /** What realtime sessions hold together (realtime-memory.ts); set by the realtime gateway. */
  sessionMemory: { readonly full: boolean } | null = null;
  // What every request's log entry asks for, built once rather than per request.
  private readonly now = (): number => this.deps.clock.now();
  private readonly newRequestId = (): string => this.nextRequestId();

  constructor(private readonly deps: GateDeps) {}

  /** The request id every answer carries (x-request-id), its log entry and its usage: one counter per node. */
  nextRequestId(): string {
    return `${this.deps.instanceId}-${(++this.seq).toString(36)}`;
  }

  /** An HTTP request as it arrives: everything needed is copied from `req` (rule 1). */
  http(res: HttpResponse, req: HttpRequest): ApiRequest {
    const path = req.getUrl();
    const reply = new Reply(res);
    const r = new ApiRequest(HTTP, res, reply, familyOf(path));
    r.method = req.getCaseSensitiveMethod().toUpperCase();
    r.path = path;
    r.query = req.getQuery() ?? '';
    r.authorization = req.getHeader('authorization');
    r.contentType = req.getHeader('content-type');
    r.contentLength = parseContentLength(req.getHeader('content-length'));
    r.userAgent = req.getHeader('user-agent');
    r.startedAt = performance.now();
    // The other credential headers are read only when Authorization presents none.
    r.hasCredential = presentsCredential(r.authorization) || presentsCredential(undefined, req.getHeader('x-api-key'), req.getHeader('api-key'));
    // Tool pass-through needs every header; copied only on tool paths.
    if (r.family.shape === 'gateway') {
      const all: Array<[string, string]> = [];
      req.forEach((k, v) => all.push([k, v]));
      r.headers = all;
    }
    // Every answer carries it (x-request-id); the request's log entry and usage use the same id.
    reply.requestId = this.nextRequestId();
    reply.family = r.family;
    reply.expectBody(r.contentLength, req.getHeader('transfer-encoding') !== '');
    reply.headRequest = r.method === 'HEAD';
    reply.clientCloses = /close/i.test(req.getHeader('connection'));
    requestStarted();
    r.ip = this.clientIp(res, req, r.headers);
    return r;
  }

  /** A WebSocket upgrade as it arrives (uWS's `upgrade` handler), copied from `req` likewise. */
  upgrade(res: HttpResponse, req: HttpRequest, context: us_socket_context_t): ApiRequest {
    const path = req.getUrl();
    const reply = new Reply(res);
    const r = new ApiRequest(UPGRADE, res, reply, familyOf(path));
    r.method = 'GET';
    r.path = path;
    r.query = req.getQuery() ?? '';
    r.authorization = req.getHeader('authorization');
    // An upgrade carries no body: its log entry says 0 bytes in.
    r.contentLength = 0;
    r.userAgent = req.getHeader('user-agent');
    r.startedAt = performance.now();
    r.hasCredential = presentsCredential(r.authorization) || presentsCredential(undefined, req.getHeader('x-api-key'), req.getHeader('api-key'));
    r.wsKey = req.getHeader('sec-websocket-key');
    r.protocol = req.getHeader('sec-websocket-protocol');
    r.extensions = req.getHeader('sec-websocket-extensions');
    r.socketContext = context;
    reply.requestId = this.nextRequestId();
    r.ip = this.clientIp(res, req);
    return r;
  }

  /** Every X-Forwarded-For line counts, read from req while it lives, and only behind a trusted peer. */
  private clientIp(res: HttpResponse, req: HttpRequest, copied: Array<[string, string]> | null = null): string {
    this.ipReq = req;
    this.ipHeaders = copied;
    const ip = deriveClientIp(Buffer.from(res.getRemoteAddressAsText()).toString('latin1'), this.deps.holder.current.view.trustedProxies, this.forwardedFor);
    this.ipReq = null;
    this.ipHeaders = null;
    return ip;
  }

  // The request clientIp is deriving for (synchronously), so its one callback is made once, not per request.
  private ipReq: HttpRequest | null = null;
  private ipHeaders: Array<[string, string]> | null = null;
  /** The X-Forwarded-For lines: from the headers when a tool path copied them all already, else one walk of req. */
  private readonly forwardedFor = (): string => (this.ipHeaders ? copiedHeaderLines(this.ipHeaders, 'x-forwarded-for') : this.ipReq ? headerLines(this.ipReq, 'x-forwarded-for') : '');

  /**
   * The checks up to the route, in order. Answers the first that fails and returns null; else the
   * request's key (also on `r.key`), its log entry started and its rate headers on the reply.
   */
  pass(r: ApiRequest): KeyRecord | null {
    const deps = this.deps;
    const reply = r.reply;
    const entrance = r.entrance;
    if (!deps.holder.ready) return refuse(reply, new GatewayError('NOT_READY'));
    if (entrance.refusesWhileDraining && isDraining()) return refuse(reply, new GatewayError('NODE_DRAINING', undefined, { retryAfterSec: 1 }), true);
    if (entrance.boundBySessionMemory && this.sessionMemory?.full) return refuse(reply, new GatewayError('NODE_BUSY', REALTIME_FULL_MESSAGE, { retryAfterSec: 1 }));

    // Edge: IP budgets and the body cap.
    const edge = deps.edge.take(r.ip, r.family, r.hasCredential);
    if (!edge.ok) return refuse(reply, new GatewayError('EDGE_RATE_LIMITED', undefined, { retryAfterSec: edge.retryAfterSec }));
    if (entrance.capsBody && r.contentLength > r.family.bodyCapBytes) {
      // Refused before the credential is checked, yet a known key still sees its rate headers.
      reply.rateHeaders = this.rateHeadersOfBearer(r.authorization);
      return refuse(reply, new GatewayError('BODY_TOO_LARGE', `Request body is ${r.contentLength} bytes; this path accepts at most ${r.family.bodyCapBytes}.`), true);
    }

    if (isBadPath(r.path)) return refuse(reply, new GatewayError('BAD_PATH'));

    // Browser-style credentials (`openai-insecure-api-key.<key>` subprotocols) are refused: keys
    // never go in browser code (spec, Authentication 10). The value is never echoed.
    if (entrance.refusesKeyInSubprotocol && offersKeyInProtocol(r.protocol)) {
      const message = 'API keys are not accepted in Sec-WebSocket-Protocol: connect from a server with "Authorization: Bearer <API_KEY>", and revoke a key that was put in browser code.';
      return refuse(reply, new GatewayError('KEY_MISSING', message));
    }
    // Credential: one HMAC and one lookup.
    if (!r.authorization) return refuse(reply, new GatewayError('KEY_MISSING'));
    const presented = bearerToken(r.authorization);
    if (presented === null) return refuse(reply, new GatewayError('KEY_MISSING', 'Malformed Authorization header: expected "Bearer <API_KEY>".'));
    const key = deps.holder.current.lookup(deps.pepper, presented, deps.clock.now());
    if (!key) {
      reply.sendError(new GatewayError('KEY_INVALID'));
      this.logRefusedKey(r, presented);
      return null;
    }
    r.key = key;
    // Every request of a known key is logged once it has ended (request-log.ts). An accepted socket's
    // entry is written by its session when it closes (an upgraded reply never ends, so never twice).
    const draft = new LogDraft(deps.reporter, r, key, this.now, this.newRequestId);
    draft.requestId = reply.requestId;
    reply.logDraft = draft;
    r.log = draft;
    // From here every answer carries the key's rate headers (admission refreshes them).
    reply.rateHeaders = deps.keyBudgets.headers(key.limits);
    if (deps.isStale()) return refuse(reply, new GatewayError('KEY_STALE'));
    if (key.org.blocked) return refuse(reply, new GatewayError('ORG_BLOCKED', blockedMessage(key.org.blockedReason)));
    const money = this.canSpend(key);
    if (money) return refuse(reply, money);
    deps.reporter.touch(key.keyId);
    // Until it ends, the request is in the registry of what keys have open, whose policy may end it
    // (state/open-streams.ts: a revoked key, a blocked organisation, a narrowed scope, a stale node).
    if (entrance.registersOpenStream && deps.openStreams) registerOpenRequest(deps.openStreams, reply, key);
    return key;
  }

  /**
   * The money step: whether the key's organisation may spend on this node now. The node's money slice
   * of the organisation is spent and the control plane has nothing left, even after reclaiming the
   * other nodes' unused slices: refused. (`wait`: a slice is on its way; admission waits for it.)
   */
  canSpend(key: KeyRecord): GatewayError | null {
    const leases = this.deps.leases;
    if (leases?.canSpend(key.orgId) !== 'no') return null;
    // A key's limit or project's cap that refuses too is named instead (request-money.ts orgRefusal).
    return moneyRefusal(orgRefusal(leases, key, this.deps.clock.now()), blockedMessage(''));
  }

  /** The route of a request that passed (also on `r.route`), or null once the 404/405 was answered. */
  route(r: ApiRequest): Route | null {
    if (r.entrance.routes === 'sockets') {
      const socket = SOCKET_ROUTES.get(r.path);
      if (!socket) {
        r.reply.shape = UNROUTED_SHAPE;
        r.reply.sendError(new GatewayError('NOT_FOUND', `No realtime endpoint at ${r.path}; connect to /v1/realtime?model=MODEL.`));
        return null;
      }
      r.route = socket;
      return socket;
    }
    const route = this.deps.holder.current.view.routes.match(r.path, r.method, r.family);
    if (route instanceof GatewayError) {
      // A method a known path does not take is refused in its family's shape; an unknown path is the gateway's.
      if (route.code !== 'METHOD_NOT_ALLOWED') r.reply.shape = UNROUTED_SHAPE;
      r.reply.sendError(route);
      return null;
    }
    // The realtime family routes to the realtime gateway, whose one endpoint is `/v1/realtime` itself
    // (asked without an upgrade, it answers 400): any other path under it is not found, as for upgrades.
    if (route.kind === 'realtime' && r.path !== REALTIME_PATH) {
      r.reply.shape = UNROUTED_SHAPE;
      r.reply.sendError(new GatewayError('NOT_FOUND', `No route for ${r.path}.`));
      return null;
    }
    r.route = route;
    return route;
  }

  /**
   * A 401 for a key that matched no credential: logged against the key when it is a revoked key's
   * tombstone (the leak procedure reads these), else (sampled) with the client's IP and the first
   * characters of what was presented.
   */
  private logRefusedKey(r: ApiRequest, presented: string): void {
    const deps = this.deps;
    const reply = r.reply;
    const outcome = { status: reply.status, bytesOut: reply.bytesOut, reason: refusalReason(reply.refusal) };
    const dead = deps.holder.current.tombstone(deps.pepper, presented);
    if (dead) {
      deps.reporter.log(logRow(reply.requestId || this.nextRequestId(), deps.clock.now(), r, dead, outcome, null));
      return;
    }
    if (!this.unknownKeys.take(deps.clock.now())) return;
    deps.reporter.log(logRow(reply.requestId || this.nextRequestId(), deps.clock.now(), r, { keyId: '', projectId: '', orgId: '' }, outcome, null, unknownKeyPrefix(presented)));
  }

  /** The rate headers of the key a bearer credential names, if it names a known key. */
  private rateHeadersOfBearer(authorization: string): RateHeaders | null {
    const presented = bearerToken(authorization);
    const key = presented !== null ? this.deps.holder.current.lookup(this.deps.pepper, presented, this.deps.clock.now()) : undefined;
    return key ? this.deps.keyBudgets.headers(key.limits) : null;
  }
}

function refuse(reply: Reply, err: GatewayError, closeConnection = false): null {
  reply.sendError(err, closeConnection);
  return null;
}

/**
 * Model scope, THE one message for every endpoint: the plan is a ceiling; allowed_models narrows it.
 * Null when the key may use the model.
 */
export function checkModelScope(state: GatewayState, key: KeyRecord, model: ModelConfig): GatewayError | null {
  if (state.mayUseModel(key, model.id)) return null;
  const tier = state.view.tiers.get(key.org.tier);
  const inPlan = !!tier && tier.plan.has(model.id);
  const why = inPlan ? "it is not in this key's allowed_models" : `it is not in the organisation's plan (${key.org.tier || 'no tier'})`;
  return new GatewayError('MODEL_NOT_ALLOWED', `This API key may not use the model \`${model.id}\`: ${why}.`, { param: 'model' });
}

/** A subprotocol that carries a credential: OpenAI's browser style, or a bare key. */
export function offersKeyInProtocol(protocolHeader: string): boolean {
  if (!protocolHeader) return false;
  return protocolHeader.split(',').some((p) => {
    const t = p.trim().toLowerCase();
    return t.includes('api-key') || t.includes('api_key') || t.startsWith('sk-') || t.includes('.sk-') || t.startsWith('bearer');
  });
}

function parseContentLength(v: string): number {
  if (!v) return -1;
  const n = Number(v);
  return Number.isSafeInteger(n) && n >= 0 ? n : -1;
}
