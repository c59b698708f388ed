// The node's HTTP server: one uWS handler running the order of checks of docs/design.md#order-of-checks in one pass:
// edge IP budgets and body cap (429/413) → path sanity (400 bad_path) → credential (401) → route
// (404, 405 + Allow) → key budgets (429) → request validation (400) → model scope (401) → upstream.
// Nothing before the upstream call awaits, except reading a JSON body. Errors are rendered only by
// error-shapes.ts, through Reply.
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp } from 'uWebSockets.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { bearerToken } from '../auth/bearer.js';
import type { GatewayState, KeyRecord, StateHolder } from '../auth/key-table.js';
import { CATALOG, GatewayError } from '../errors.js';
import type { Clock } from '../limits/clock.js';
import type { BodyBudget } from '../limits/body-budget.js';
import { bodyCapBytes, presentsCredential, type EdgeBudgets } from '../limits/edge-budgets.js';
import { estimateTokens, type KeyBudgets, type RateHeaders } from '../limits/key-budgets.js';
import type { LeaseClient } from '../limits/lease-client.js';
import { boundaryOf, findModelField } from '../proxy/multipart-model.js';
import type { PoolRegistry } from '../proxy/providers/openai.js';
import { UploadSpill } from '../proxy/upload-spill.js';
import type { CallResult, ModelCall, Provider } from '../proxy/providers/provider.js';
import { forwardTool } from '../proxy/tool-router.js';
import { cancelUpstreamAtOnce } from '../proxy/stream-proxy.js';
import { ToolBackends } from '../proxy/tool-backends.js';
import { encodedBodyRefusal, findRemoteInBody } from '../proxy/pdf-guard.js';
import type { OpenStreams, StreamEndReason } from '../auth/open-streams.js';
import { familyOf } from '../routing/path-families.js';
import { renderError } from './error-shapes.js';
import type { Reporter } from '../sync/reporter.js';
import type { UsageSource } from '../sync/usage-client.js';
import { deriveClientIp, headerLines } from './client-ip.js';
import type { ErrorShape } from './error-shapes.js';
import { logBug, Reply } from './reply.js';
import { RequestContext } from './request-context.js';
import { Admission, blockedMessage, type WaitStats } from './admission.js';
import { validateJson } from './validate-request.js';
import { closesConnection, collectBody, streamBody, type BodyWatch } from './request-body.js';
import { LogDraft, logRow, unknownKeyPrefix, UnknownKeySampler } from './request-log.js';
import { isBadPath, shapeOf, type Route } from '../routing/routes.js';
import { parseUsageQuery, renderUsage } from './usage-endpoint.js';
import { RealtimeGateway, REALTIME_PATH, type RealtimeOptions } from '../realtime/gateway.js';
import { requestStarted } from '../metrics.js';
import { estimateResponseTokens, ResponsesEndpoint } from '../endpoints/responses.js';
import { ResponseOwners } from '../endpoints/response-owners.js';
import { DemoResponsesProvider } from '../proxy/providers/demo-responses.js';
import { OpenAIResponsesProvider } from '../proxy/providers/openai-responses.js';

export interface ServerDeps {
  holder: StateHolder;
  pepper: Buffer;
  clock: Clock;
  edge: EdgeBudgets;
  keyBudgets: KeyBudgets;
  /** Node-wide budget for request bodies held in memory. */
  bodyBudget?: BodyBudget;
  /** The least pace of a body read whole (408 below it). */
  bodyWatch?: BodyWatch;
  /** Money slices per organisation (and key minute slices, through keyBudgets) from the control plane. */
  leases?: LeaseClient;
  reporter: Reporter;
  providers: Readonly<Record<string, Provider>>;
  pools: PoolRegistry;
  instanceId: string;
  /** Where uploads are spilled past their in-memory threshold (upload-spill.ts). */
  spillDir: string;
  /** Node-wide budget for spilled upload bytes (a share per organisation and per account). */
  spillBudget?: BodyBudget;
  /** True when the node was cut off from the control plane longer than the configured maximum. */
  isStale(): boolean;
  /** GET /v1/usage reads the control plane's durable usage through this; absent: 503. */
  usage?: UsageSource;
  /** Realtime sessions: buffer and message limits, the request-log seam. */
  realtime?: RealtimeOptions;
  /** Tool backends: pools, the choice among a prefix's URLs, passive health. */
  toolBackends?: ToolBackends;
  /** Every request of a key from authentication to its end, so revocation can end it (open-streams.ts). */
  openStreams?: OpenStreams;
  /** Who owns each stored response (endpoints/response-owners.ts); shared with the sync client. */
  responseOwners?: ResponseOwners;
}

const JSON_HEADERS = [['content-type', 'application/json']] as const;
const MODELS_CREATED = 1735689600;
/**
 * JSON bodies a model endpoint can accept, below the path's cap: a speech request is a short text
 * (the OpenAI API takes at most 4,096 characters of input), so it never needs the audio path's 200 MiB.
 */
const JSON_BODY_CAP_BYTES: Partial<Record<string, number>> = { speech: 64 * 1024 }; // 2025-01-01, a fixed `created` for configured models

/** What the handler copies out of HttpRequest before it dies (rule 1). */
interface RequestHead {
  method: string;
  path: string;
  query: string;
  authorization: string;
  contentType: string;
  contentLength: number;
  ip: string;
  userAgent: string;
  /** performance.now() on arrival, for the request log's latency. */
  startedAt: number;
}

export class ApiServer {
  readonly app: TemplatedApp;
  private seq = 0;
  /** 401s of unknown keys are logged only as far as this allows. */
  private readonly unknownKeys = new UnknownKeySampler();
  private readonly toolBackends: ToolBackends;
  /** Key budgets and money, waiting (bounded) for a lease when this node's is short. */
  private readonly admission: Admission;
  /** What waiting for leases cost the requests that waited (GET /stats/lease-waits on the admin listener). */
  get leaseWaits(): WaitStats {
    return this.admission.waits;
  }

  /** The `/v1/realtime` WebSocket gateway (data-plane/realtime/). */
  readonly realtime: RealtimeGateway;
  /** The Responses API (data-plane/endpoints/responses.ts). */
  readonly responses: ResponsesEndpoint;

  // What every request's log entry asks for, built once rather than per request.
  private readonly now = (): number => this.deps.clock.now();
  private readonly newRequestId = (): string => this.nextRequestId();

  constructor(private readonly deps: ServerDeps) {
    this.admission = new Admission(deps, (key, path, ticket, minute, requestId) => new RequestContext(deps, requestId || this.nextRequestId(), key, path, ticket, minute));
    this.toolBackends = deps.toolBackends ?? new ToolBackends();
    const demoResponses = new DemoResponsesProvider(() => deps.clock.now());
    this.responses = new ResponsesEndpoint({
      clock: deps.clock,
      owners: deps.responseOwners ?? new ResponseOwners(),
      providers: { demo: demoResponses, openai: new OpenAIResponsesProvider(deps.pools) },
      reportOwner: (id, projectId, model, createdAtMs) => deps.reporter.recordStoredResponse(id, projectId, model, createdAtMs),
    });
    this.app = uWS.App();
    this.realtime = new RealtimeGateway(deps, this.admission, deps.realtime);
    // The Responses API's WebSocket mode is the realtime gateway's (endpoints/responses-socket.ts).
    this.realtime.responses = { hooks: this.responses, demo: demoResponses };
    this.realtime.register(this.app);
    this.app.any('/*', (res, req) => this.onRequest(res, req));
  }

  private onRequest(res: HttpResponse, req: HttpRequest): void {
    let reply: Reply | null = null;
    try {
      // Rule 1: copy everything needed from req first.
      const head: RequestHead = {
        method: req.getCaseSensitiveMethod().toUpperCase(),
        path: req.getUrl(),
        query: req.getQuery() ?? '',
        authorization: req.getHeader('authorization'),
        contentType: req.getHeader('content-type'),
        contentLength: parseContentLength(req.getHeader('content-length')),
        ip: '',
        userAgent: req.getHeader('user-agent'),
        startedAt: performance.now(),
      };
      // The other credential headers are read only when Authorization presents none.
      const hasCredential = presentsCredential(head.authorization) || presentsCredential(undefined, req.getHeader('x-api-key'), req.getHeader('api-key'));
      // Tool pass-through needs every header; copied only on tool paths.
      let allHeaders: Array<[string, string]> | null = null;
      if (shapeOf(head.path) === 'gateway') {
        allHeaders = [];
        req.forEach((k, v) => allHeaders!.push([k, v]));
      }
      reply = new Reply(res);
      // Every answer carries it (x-request-id); the request's log entry and usage use the same id.
      reply.requestId = this.nextRequestId();
      reply.family = familyOf(head.path);
      reply.expectBody(head.contentLength, req.getHeader('transfer-encoding') !== '');
      reply.headRequest = head.method === 'HEAD';
      reply.clientCloses = /close/i.test(req.getHeader('connection'));
      requestStarted();
      // Every X-Forwarded-For line counts, read from req while it lives, and only behind a trusted peer.
      head.ip = deriveClientIp(Buffer.from(res.getRemoteAddressAsText()).toString(), this.deps.holder.current.view.trustedProxies, () =>
        headerLines(req, 'x-forwarded-for'),
      );
      this.pipeline(res, reply, head, hasCredential, allHeaders);
    } catch (err) {
      logBug(err);
      try {
        if (reply) reply.sendError(err, 'gateway');
        else res.cork(() => res.writeStatus('500 Internal Server Error').end());
      } catch (e) {
        logBug(e);
      }
    }
  }

  private pipeline(res: HttpResponse, reply: Reply, head: RequestHead, hasCredential: boolean, allHeaders: Array<[string, string]> | null): void {
    const deps = this.deps;
    const familyShape = shapeOf(head.path);
    if (!deps.holder.ready) return reply.sendError(new GatewayError('NOT_READY'), familyShape);

    // Edge: IP budgets and the body cap.
    const edge = deps.edge.take(head.ip, head.path, hasCredential);
    if (!edge.ok) return reply.sendError(new GatewayError('EDGE_RATE_LIMITED', undefined, { retryAfterSec: edge.retryAfterSec }), 'openai');
    const capBytes = bodyCapBytes(head.path);
    if (head.contentLength > capBytes) {
      // Refused before the credential is checked, yet a known key still sees its rate headers.
      reply.rateHeaders = this.rateHeadersOfBearer(head.authorization);
      return reply.sendError(new GatewayError('BODY_TOO_LARGE', `Request body is ${head.contentLength} bytes; this path accepts at most ${capBytes}.`), familyShape, true);
    }

    if (isBadPath(head.path)) return reply.sendError(new GatewayError('BAD_PATH'), 'gateway');

    // Credential: one HMAC and one Map lookup.
    if (!head.authorization) return reply.sendError(new GatewayError('KEY_MISSING'), familyShape);
    const presented = bearerToken(head.authorization);
    if (presented === null) return reply.sendError(new GatewayError('KEY_MISSING', 'Malformed Authorization header: expected "Bearer <API_KEY>".'), familyShape);
    const state = deps.holder.current;
    const key = state.lookup(deps.pepper, presented, deps.clock.now());
    if (!key) {
      reply.sendError(new GatewayError('KEY_INVALID'), familyShape);
      return this.logRefusedKey(reply, head, presented);
    }
    // Every request of a known key is logged once it has ended (request-log.ts).
    const draft = new LogDraft(deps.reporter, head, key, this.now, this.newRequestId);
    draft.requestId = reply.requestId;
    reply.logDraft = draft;
    // From here every answer carries the key's rate headers (admission refreshes them).
    reply.rateHeaders = deps.keyBudgets.headers(key.limits);
    if (deps.isStale()) return reply.sendError(new GatewayError('KEY_STALE'), familyShape);
    if (key.org.blocked) return reply.sendError(new GatewayError('ORG_BLOCKED', blockedMessage(key.org.blockedReason)), familyShape);
    // The node's money slice of the organisation is spent and the control plane has nothing left,
    // even after reclaiming the other nodes' unused slices. (`wait`: a slice is on its way; the
    // admission step waits for it.)
    if (deps.leases?.canSpend(key.orgId) === 'no') return reply.sendError(new GatewayError('ORG_BLOCKED', blockedMessage('')), familyShape);
    deps.reporter.touch(key.keyId);
    // Until it ends, revoking the key or blocking its organisation ends this request (before the node acks).
    if (deps.openStreams) reply.onFinish(deps.openStreams.register(key.keyHash, key.orgId, (why) => endForRevocation(reply, familyShape, why)));

    const route = state.view.routes.match(head.path, head.method);
    if (route instanceof GatewayError) {
      return reply.sendError(route, route.code === 'METHOD_NOT_ALLOWED' ? familyShape : 'gateway');
    }

    switch (route.kind) {
      case 'chat':
      case 'embeddings':
      case 'speech':
      case 'responses':
        return this.jsonEndpoint(res, reply, head, key, route, capBytes);
      case 'stored-response':
        // One rpm, like the listings; the key's own project's responses only.
        return this.admission.admitOrWait(reply, key, head.path, 0, (ctx) => {
          if (ctx) this.responses.stored(ctx, reply, head.path, head.method, head.query, state, (err) => failCall(ctx, reply, 'openai', err));
        });
      case 'transcriptions':
        return this.transcription(res, reply, head, key, capBytes);
      case 'model':
        return this.admission.admitOrWait(reply, key, head.path, 0, (ctx) => {
          if (ctx) this.modelObject(ctx, reply, head, key, state);
        });
      case 'models':
      case 'voices':
        // Listings are requests like any other: one rpm each (docs/design.md#what-counts-as-a-request).
        return this.admission.admitOrWait(reply, key, head.path, 0, (ctx) => {
          if (!ctx) return;
          ctx.providerStarted = true;
          ctx.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
          reply.send(200, JSON_HEADERS, route.kind === 'models' ? modelList(state, key) : voiceList(state, key));
        });
      case 'usage':
        // One rpm, like the listings.
        return this.admission.admitOrWait(reply, key, head.path, 0, (ctx) => {
          if (ctx) this.usage(ctx, reply, head, key);
        });
      case 'realtime':
        // WebSocket upgrades are taken by the realtime gateway; a plain request here is not one.
        if (head.path !== REALTIME_PATH) return reply.sendError(new GatewayError('NOT_FOUND', `No route for ${head.path}.`), 'gateway');
        return reply.sendError(new GatewayError('INVALID_REQUEST', `${REALTIME_PATH} accepts WebSocket connections only: GET with "Upgrade: websocket" and ?model=MODEL.`, { param: null }), 'openai');
      case 'tool':
        return this.tool(res, reply, head, key, route, capBytes, allHeaders ?? []);
    }
  }

  private nextRequestId(): string {
    return `${this.deps.instanceId}-${(++this.seq).toString(36)}`;
  }

  /**
   * A 401 for a key that matched no credential: logged against the key when it is a revoked key's
   * tombstone, else (sampled) with the client's IP and the first characters of what was presented.
   */
  private logRefusedKey(reply: Reply, head: RequestHead, presented: string): void {
    const deps = this.deps;
    const outcome = { status: reply.status, bytesOut: reply.bytesOut, reason: reply.refusal };
    const dead = deps.holder.current.tombstone(deps.pepper, presented);
    if (dead) {
      deps.reporter.log(logRow(reply.requestId || this.nextRequestId(), deps.clock.now(), head, dead, outcome, null));
      return;
    }
    if (!this.unknownKeys.take(deps.clock.now())) return;
    deps.reporter.log(logRow(reply.requestId || this.nextRequestId(), deps.clock.now(), head, { keyId: '', projectId: '', orgId: '' }, outcome, null, unknownKeyPrefix(presented)));
  }

  /** GET /v1/models/{id}. */
  private modelObject(ctx: RequestContext, reply: Reply, head: RequestHead, key: KeyRecord, state: GatewayState): void {
    const id = decodeURIComponent(head.path.slice('/v1/models/'.length));
    const model = state.modelsFor(key).find((m) => m.id === id);
    // A model the key may not use is as unknown to it as one that does not exist (and costs nothing).
    if (!model) {
      ctx.refuse();
      return reply.sendError(new GatewayError('NOT_FOUND', `The model \`${id}\` does not exist or you do not have access to it.`, { param: 'model' }), 'openai');
    }
    ctx.providerStarted = true;
    ctx.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
    reply.send(200, JSON_HEADERS, JSON.stringify(modelObject(model)));
  }

  /**
   * GET /v1/usage: the key's own project only (the control plane takes the project from its record of
   * the key). Only this request waits for the control plane, bounded by the usage client's deadline.
   */
  private usage(ctx: RequestContext, reply: Reply, head: RequestHead, key: KeyRecord): void {
    // Refused or not served: the request is given back, and the rate headers say so.
    const refuse = (err: unknown) => {
      ctx.refuse();
      reply.rateHeaders = this.deps.keyBudgets.headers(key.limits);
      reply.sendError(err, 'openai');
    };
    const q = parseUsageQuery(head.query, this.deps.clock.now());
    if (q instanceof GatewayError) return refuse(q);
    const source = this.deps.usage;
    if (!source) {
      return refuse(new GatewayError('CONTROL_PLANE_UNAVAILABLE', undefined, { param: null, retryAfterSec: 5 }));
    }
    ctx.providerStarted = true;
    const request = { keyId: key.keyId, sinceMs: q.startTime * 1000, untilMs: q.endTime === null ? 0 : q.endTime * 1000, groupBy: q.groupBy };
    const cancel = source.query(request, (err, res) => {
      try {
        if (reply.done) return;
        if (err || !res) return refuse(err);
        ctx.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
        reply.send(200, JSON_HEADERS, renderUsage(q, res));
      } catch (e) {
        logBug(e);
        reply.sendError(e, 'openai');
      }
    });
    ctx.abortFns.push(cancel);
  }

  /** The rate headers of the key a bearer credential names, if it names a known key. */
  private rateHeadersOfBearer(authorization: string): RateHeaders | null {
    const presented = bearerToken(authorization);
    const key = presented !== null ? this.deps.holder.current.lookup(this.deps.pepper, presented, this.deps.clock.now()) : undefined;
    return key ? this.deps.keyBudgets.headers(key.limits) : null;
  }

  private jsonEndpoint(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, route: Route, capBytes: number): void {
    const deps = this.deps;
    // A JSON body that cannot be valid for the endpoint is refused before a byte is read.
    const jsonCap = Math.min(capBytes, JSON_BODY_CAP_BYTES[route.kind] ?? capBytes);
    if (head.contentLength > jsonCap) {
      return reply.sendError(new GatewayError('BODY_TOO_LARGE', `Request body is ${head.contentLength} bytes; ${head.path} accepts JSON bodies of at most ${jsonCap} bytes.`), 'openai', true);
    }
    // The request and its parallel slot are taken before the body is buffered, so a key's parallel
    // limit also bounds the memory its bodies hold; tokens are reserved once the body is parsed. When
    // admission waits for a lease, the body is read meanwhile (onData must be attached before this
    // handler returns), still within the node-wide body budget. Whichever of the two comes last goes on.
    let ctx: RequestContext | null | undefined;
    let bodyDone = false;
    let bodyErr: GatewayError | null = null;
    let bodyRaw: Buffer | undefined;
    this.admission.admitOrWait(
      reply,
      key,
      head.path,
      0,
      (c) => {
        ctx = c;
        if (c && bodyDone) this.jsonBody(c, reply, head, key, route, bodyErr, bodyRaw!);
      },
      () => !bodyDone,
    );
    if (ctx === null) return;
    collectBody(
      res,
      reply,
      jsonCap,
      head.contentLength,
      (err, raw) => {
        bodyDone = true;
        bodyErr = err;
        bodyRaw = raw;
        if (ctx) this.jsonBody(ctx, reply, head, key, route, err, raw);
      },
      deps.bodyBudget && { budget: deps.bodyBudget, owner: key.orgId, account: key.org.ownerAccountId },
      deps.bodyWatch,
    );
  }

  private jsonBody(ctx: RequestContext, reply: Reply, head: RequestHead, key: KeyRecord, route: Route, err: GatewayError | null, raw: Buffer): void {
    const deps = this.deps;
    try {
      if (reply.done) return;
      if (err) return reply.sendError(err, 'openai', closesConnection(err));
      const text = raw.length > 0 ? raw.toString('utf8') : '';
      let body: unknown;
      let parseError = false;
      try {
        body = text.length > 0 ? JSON.parse(text) : undefined;
      } catch {
        parseError = true;
      }
      const estimate = route.kind === 'responses' ? estimateResponseTokens(body) : estimateTokens(body);
      this.admission.reserveOrWait(ctx, reply, key, estimate, (ok) => {
        if (!ok) return;
        try {
          if (estimate > 0) reply.rateHeaders = deps.keyBudgets.headers(key.limits);
          const state = deps.holder.current;
          const invalid = validateJson(route, head.contentType, body, parseError, state, parseError ? undefined : text);
          if (invalid) {
            countRefused(ctx);
            return reply.sendError(invalid, 'openai');
          }
          const obj = body as Record<string, unknown>;
          const model = state.view.models.get(obj.model as string)!;
          const scope = this.checkScope(key, model);
          if (scope) return reply.sendError(scope, 'openai');
          if (route.kind === 'responses') return this.createResponse(ctx, reply, model, obj, raw, text, state);
          const provider = deps.providers[model.provider];
          if (!provider) return reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`), 'openai');
          ctx.model = model;
          ctx.providerStarted = true;
          // What an end without the upstream's usage bills: the estimate the tpm reservation took.
          ctx.estimatedPromptTokens = estimate;
          const call = this.modelCall(ctx, reply, model, route.shape, obj, raw, text);
          if (route.kind === 'chat') provider.chat(call);
          else if (route.kind === 'embeddings') provider.embeddings(call);
          else provider.speech(call);
        } catch (e) {
          logBug(e);
          reply.sendError(e, route.shape);
        }
      });
    } catch (e) {
      logBug(e);
      reply.sendError(e, route.shape);
    }
  }

  /** `POST /v1/responses`, validated and in scope: its `previous_response_id` must be the project's own. */
  private createResponse(ctx: RequestContext, reply: Reply, model: ModelConfig, obj: Record<string, unknown>, raw: Buffer, text: string, state: GatewayState): void {
    const prev = this.responses.checkPrevious(ctx.key, obj, state);
    if (prev) return reply.sendError(prev, 'openai');
    const provider = this.responses.providerOf(model);
    if (!provider) return reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`), 'openai');
    ctx.model = model;
    ctx.providerStarted = true;
    this.responses.create(ctx, provider, this.modelCall(ctx, reply, model, 'openai', obj, raw, text));
  }

  private transcription(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, capBytes: number): void {
    // onData must be attached before returning (rule 2), so the stream exists before any check answers.
    const stream = streamBody(res, reply, capBytes);
    stream.on('error', () => {});
    // While admission waits for a lease, the upload waits in the stream (its buffer pauses the socket).
    // Refused: the rest of the body is dropped and the socket unpaused before the answer goes out.
    const dropBody = () => {
      stream.discard();
      return false;
    };
    this.admission.admitOrWait(reply, key, head.path, 0, (ctx) => {
      if (ctx) this.transcribe(ctx, reply, head, key, stream);
    }, dropBody);
  }

  private transcribe(ctx: RequestContext, reply: Reply, head: RequestHead, key: KeyRecord, stream: ReturnType<typeof streamBody>): void {
    const boundary = boundaryOf(head.contentType);
    if (!boundary) {
      stream.discard();
      return reply.sendError(new GatewayError('INVALID_REQUEST', 'Content-Type must be multipart/form-data with a boundary.', { param: null }), 'openai');
    }
    // The parts before `model` may go to a temporary file: deleted however the request ends.
    const spillBudget = this.deps.spillBudget;
    const spill = new UploadSpill(this.deps.spillDir, undefined, spillBudget && { budget: spillBudget, owner: key.orgId, account: key.org.ownerAccountId });
    reply.onFinish(() => spill.remove());
    findModelField(stream, boundary, spill, (err, field) => {
      try {
        if (reply.done) return;
        // Answered before the body was read to its end: the rest is not wanted. A 400 for what the
        // body holds keeps its one request of rpm (docs/design.md#what-counts-as-a-request).
        const refuse = (e: unknown) => {
          stream.discard();
          if (isContentRefusal(e)) countRefused(ctx);
          reply.sendError(e, 'openai', e instanceof GatewayError && closesConnection(e));
        };
        if (err || !field) return refuse(err ?? new GatewayError('INVALID_REQUEST'));
        const state = this.deps.holder.current;
        const model = state.view.models.get(field.model);
        if (!field.model) return refuse(new GatewayError('INVALID_REQUEST', 'Missing required parameter: model.', { param: 'model' }));
        if (!model) return refuse(new GatewayError('UNKNOWN_MODEL', `The model \`${field.model}\` does not exist.`, { param: 'model' }));
        if (model.kind !== 'transcription') {
          return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a transcription model.`, { param: 'model' }));
        }
        const scope = this.checkScope(key, model);
        if (scope) return refuse(scope);
        const provider = this.deps.providers[model.provider];
        if (!provider) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`));
        ctx.model = model;
        ctx.providerStarted = true;
        reply.upstreamAt = performance.now();
        provider.transcription({
          requestId: ctx.requestId,
          reply,
          model,
          contentType: head.contentType,
          upload: field,
          complete(r: CallResult) {
            ctx.complete(r);
          },
          onAbort(fn: () => void) {
            ctx.abortFns.push(fn);
          },
          fail(err: unknown) {
            failCall(ctx, reply, 'openai', err);
          },
        });
      } catch (e) {
        logBug(e);
        reply.sendError(e, 'openai');
      }
    });
  }

  private tool(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, route: Route, capBytes: number, headers: Array<[string, string]>): void {
    if (!route.backend) {
      return reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', `No backend is configured for ${head.path}.`), 'gateway');
    }
    const hasBody = head.method !== 'GET' && head.method !== 'HEAD';
    if (hasBody && familyOf(head.path).name === 'pdf') return this.pdfTool(res, reply, head, key, route, capBytes, headers);
    const body = hasBody ? streamBody(res, reply, capBytes) : null;
    body?.on('error', () => {});
    this.admission.admitOrWait(
      reply,
      key,
      head.path,
      0,
      (ctx) => {
        if (ctx) this.forward(ctx, reply, head, route, body, headers);
      },
      () => false,
      'gateway',
    );
  }

  /**
   * `/v1/pdf*` with a body: read whole (within the path's cap and the node's body budget), refused
   * with 400 Shape C naming the first remote reference before the backend sees a byte, else forwarded.
   */
  private pdfTool(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, route: Route, capBytes: number, headers: Array<[string, string]>): void {
    let ctx: RequestContext | null | undefined;
    let body: { err: GatewayError | null; raw: Buffer } | undefined;
    let bodyDone = false;
    const proceed = () => {
      if (!ctx || body === undefined || reply.done) return;
      if (body.err) return reply.sendError(body.err, 'gateway', closesConnection(body.err));
      const encoded = encodedBodyRefusal(headers);
      if (encoded) return reply.sendError(encoded, 'passthrough');
      const found = findRemoteInBody(body.raw, head.contentType);
      if (found) {
        const message = `The HTML references a remote resource (${found.where}: ${JSON.stringify(found.url)}); only local references (data: URIs, fragments, relative paths) are allowed.`;
        return reply.sendError(new GatewayError('REMOTE_REFERENCE', message), 'passthrough');
      }
      this.forward(ctx, reply, head, route, body.raw, headers);
    };
    this.admission.admitOrWait(
      reply,
      key,
      head.path,
      0,
      (c) => {
        ctx = c;
        proceed();
      },
      () => !bodyDone,
      'gateway',
    );
    if (ctx === null) return;
    collectBody(
      res,
      reply,
      capBytes,
      head.contentLength,
      (err, raw) => {
        bodyDone = true;
        body = { err, raw };
        proceed();
      },
      this.deps.bodyBudget && { budget: this.deps.bodyBudget, owner: key.orgId, account: key.org.ownerAccountId },
      this.deps.bodyWatch,
    );
  }

  private forward(ctx: RequestContext, reply: Reply, head: RequestHead, route: Route, body: ReturnType<typeof streamBody> | Buffer | null, headers: Array<[string, string]>): void {
    if (!route.backend) return;
    // From here the request counts against rpm whatever the backend answers.
    ctx.providerStarted = true;
    reply.upstreamAt = performance.now();
    forwardTool(this.toolBackends, {
      backend: route.backend,
      method: head.method,
      pathAndQuery: head.query ? `${head.path}?${head.query}` : head.path,
      headers,
      body,
      reply,
      clientIp: head.ip,
      caller: { requestId: ctx.requestId, keyId: ctx.key.keyId, projectId: ctx.key.projectId, orgId: ctx.key.orgId },
      onAbort(fn) {
        ctx.abortFns.push(fn);
      },
      onDone(status) {
        ctx.complete({ status, promptTokens: 0, completionTokens: 0 });
      },
    });
  }

  private modelCall(ctx: RequestContext, reply: Reply, model: ModelConfig, shape: ErrorShape, body: Record<string, unknown>, rawBody: Buffer, bodyText: string): ModelCall {
    reply.upstreamAt = performance.now();
    // Methods, not arrow properties: under tsx (esbuild keepNames) every named arrow made per request
    // costs a defineProperty of its name. They use no `this`, so a provider may pass them on unbound.
    return {
      requestId: ctx.requestId,
      reply,
      model,
      body,
      rawBody,
      bodyText,
      complete(r: CallResult) {
        ctx.complete(r);
      },
      onAbort(fn: () => void) {
        ctx.abortFns.push(fn);
      },
      fail(err: unknown) {
        failCall(ctx, reply, shape, err);
      },
    };
  }

  /** Model scope: the plan is a ceiling; allowed_models narrows it. */
  private checkScope(key: KeyRecord, model: ModelConfig): GatewayError | null {
    const state = this.deps.holder.current;
    if (state.mayUseModel(key, model.id)) return null;
    const tier = state.view.tiers.get(key.org.tier);
    const inPlan = !!tier && tier.plan.has(model.id);
    const why = inPlan ? "it is not in this key's allowed_models" : `it is not in the organisation's plan (${key.org.tier || 'no tier'})`;
    return new GatewayError('MODEL_NOT_ALLOWED', `This API key may not use the model \`${model.id}\`: ${why}.`, { param: 'model' });
  }
}

/**
 * Ends a request whose key was revoked (or whose organisation was blocked) while it ran: not yet
 * answered, a 401 in the path's shape; a model event stream (SSE chat), one terminal error event;
 * any other stream (tool downloads, tool event streams), a reset. Every way runs the request's abort
 * path: the upstream is cancelled at once, as the client's answer is, and what it did is billed.
 */
function endForRevocation(reply: Reply, shape: ErrorShape, why: StreamEndReason): void {
  if (reply.done) return;
  cancelUpstreamAtOnce(reply);
  const err =
    why === 'key_revoked'
      ? new GatewayError('KEY_INVALID', 'This API key was revoked while the request was running.')
      : new GatewayError('ORG_BLOCKED', "The organisation was blocked while the request was running: its balance is exhausted or its monthly spend cap was reached.");
  if (!reply.headersSent) {
    // Ended as an abort: the request's cleanups stop its upstream and bill it (not a normal answer
    // that waits for the provider to report).
    reply.aborted = true;
    return reply.sendError(err, shape, true);
  }
  // Tool streams (MCP, …) speak their backend's protocol: closed, never given an event of ours.
  if (shape === 'openai' && reply.isEventStream) return reply.endEarly(`data: ${renderError(err, 'openai').body}\n\n`);
  reply.close();
}

/** A provider's `fail`: the error in the route's shape if nothing was sent yet, else the stream closed. */
function failCall(ctx: RequestContext, reply: Reply, shape: ErrorShape, err: unknown): void {
  if (!reply.headersSent) reply.sendError(err, shape, isTooLarge(err));
  else reply.close();
  ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
}

/** A 400 for what a body holds, once it was read: it counts one request (rpm), no tokens, no money. */
function isContentRefusal(err: unknown): boolean {
  return err instanceof GatewayError && CATALOG[err.code].status === 400;
}

function countRefused(ctx: RequestContext): void {
  ctx.complete({ status: 400, promptTokens: 0, completionTokens: 0 });
}

function isTooLarge(err: unknown): boolean {
  return err instanceof GatewayError && err.code === 'BODY_TOO_LARGE';
}

function parseContentLength(v: string): number {
  if (!v) return -1;
  const n = Number(v);
  return Number.isSafeInteger(n) && n >= 0 ? n : -1;
}


/** A model as the OpenAI API lists it. */
function modelObject(m: ModelConfig): { id: string; object: 'model'; created: number; owned_by: string } {
  return { id: m.id, object: 'model', created: MODELS_CREATED, owned_by: m.provider === 'demo' ? 'tollgate' : m.provider };
}

function modelList(state: GatewayState, key: KeyRecord): string {
  let body = state.modelListCache.get(key.keyId);
  if (body === undefined) {
    const data = state.modelsFor(key).map(modelObject);
    body = JSON.stringify({ object: 'list', data });
    state.modelListCache.set(key.keyId, body);
  }
  return body;
}

function voiceList(state: GatewayState, key: KeyRecord): string {
  const data: Array<{ id: string; object: string; model: string }> = [];
  for (const m of state.modelsFor(key)) if (m.kind === 'speech') for (const v of m.voices) data.push({ id: v, object: 'voice', model: m.id });
  return JSON.stringify({ object: 'list', data });
}

/** Listens and resolves with the bound port; rejects if the address cannot be bound. */
export function listen(app: TemplatedApp, host: string, port: number): Promise<{ socket: uWS.us_listen_socket; port: number }> {
  return new Promise((resolve, reject) => {
    app.listen(host, port, (socket) => {
      if (!socket) reject(new Error(`cannot listen on ${host}:${port}`));
      else resolve({ socket, port: uWS.us_socket_local_port(socket as unknown as uWS.us_socket) });
    });
  });
}
