// The node's HTTP server: one uWS handler running the request pipeline of design.md in one pass:
// edge IP budgets and body cap (429/413) → path sanity (400 bad_path) → credential (401) → route
// (404, 405 + Allow) → key budgets (429) → request validation (400) → model scope (401) → upstream.
// Nothing before the upstream call awaits, except reading a JSON body. Errors are rendered only by
// error-shapes.ts, through Reply.
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp } from 'uWebSockets.js';
import type { ModelConfig, UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import { tokenCostMicros } from '../../proto/lib/money.js';
import type { GatewayState, KeyRecord, StateHolder } from '../auth/key-table.js';
import { GatewayError } from '../errors.js';
import { minuteOf, type Clock } from '../limits/clock.js';
import { bodyCapBytes, presentsCredential, type EdgeBudgets } from '../limits/edge-budgets.js';
import { estimateTokens, rateHeaderPairs, type KeyBudgets, type Ticket } from '../limits/key-budgets.js';
import type { LeaseClient, SpendReservation } from '../limits/lease-client.js';
import { boundaryOf, findModelField } from '../proxy/multipart-model.js';
import type { PoolRegistry } from '../proxy/providers/openai.js';
import { UploadSpill } from '../proxy/upload-spill.js';
import type { CallResult, ModelCall, Provider } from '../proxy/providers/provider.js';
import { countMessageTokens } from '../proxy/tokens.js';
import { forwardTool } from '../proxy/tool-router.js';
import type { Reporter } from '../sync/reporter.js';
import type { ErrorShape } from './error-shapes.js';
import { logBug, Reply } from './reply.js';
import { collectBody, streamBody } from './request-body.js';
import { isBadPath, shapeOf, type Route } from './routes.js';

export interface ServerDeps {
  holder: StateHolder;
  pepper: Buffer;
  clock: Clock;
  edge: EdgeBudgets;
  keyBudgets: KeyBudgets;
  /** Money slices per organisation (and key minute slices, through keyBudgets) from the control plane. */
  leases?: LeaseClient;
  reporter: Reporter;
  providers: Readonly<Record<string, Provider>>;
  pools: PoolRegistry;
  instanceId: string;
  /** Where uploads are spilled past their in-memory threshold (upload-spill.ts). */
  spillDir: string;
  /** True when the node was cut off from the control plane longer than the configured maximum. */
  isStale(): boolean;
}

const JSON_HEADERS = [['content-type', 'application/json']] as const;
const JSON_CONTENT_TYPE = /^application\/json\s*(;|$)/i;
const BEARER = /^Bearer +([^\s]+) *$/;
const MODELS_CREATED = 1735689600; // 2025-01-01, a fixed `created` for configured models

/** What the handler copies out of HttpRequest before it dies (rule 1). */
interface RequestHead {
  method: string;
  path: string;
  query: string;
  authorization: string;
  contentType: string;
  contentLength: number;
  ip: string;
}

/** One admitted request of a key: settled and recorded exactly once, however it ends. */
class RequestContext {
  completed = false;
  providerStarted = false;
  model: ModelConfig | null = null;
  estimatedPromptTokens = 0;
  readonly abortFns: Array<() => void> = [];
  /** The estimated cost reserved from the node's money slice while this request runs. */
  spend: SpendReservation | undefined;
  constructor(
    readonly deps: ServerDeps,
    readonly requestId: string,
    readonly key: KeyRecord,
    readonly path: string,
    readonly ticket: Ticket,
    readonly minute: number,
  ) {}

  /** Refused by a check after admission (400, 401 for the model): nothing is counted. */
  refuse(): void {
    if (this.completed) return;
    this.completed = true;
    this.ticket.refund();
    this.deps.leases?.settleSpend(this.key.orgId, this.spend, 0);
  }

  complete(r: CallResult): void {
    if (this.completed) return;
    this.completed = true;
    this.ticket.settle(r.promptTokens + r.completionTokens);
    const m = this.model;
    if (!m || !this.providerStarted) return;
    let cost = 0;
    if (m.kind === 'speech') cost = Math.ceil(((r.audioUnits ?? 0) * m.audioMicrosPerUnit) / 1000);
    else if (m.kind === 'transcription') cost = (r.audioUnits ?? 0) * m.audioMicrosPerUnit;
    else cost = tokenCostMicros(r.promptTokens, r.completionTokens, m.inputMicrosPerMtok, m.outputMicrosPerMtok);
    const u: UsageRecord = {
      requestId: this.requestId,
      keyId: this.key.keyId,
      orgId: this.key.orgId,
      projectId: this.key.projectId,
      model: m.id,
      path: this.path,
      status: r.status,
      promptTokens: r.promptTokens,
      completionTokens: r.completionTokens,
      costMicros: cost,
      atMs: this.deps.clock.now(),
      minute: this.minute,
    };
    this.deps.reporter.record(u);
    this.deps.leases?.settleSpend(this.key.orgId, this.spend, cost);
  }
}

export class ApiServer {
  readonly app: TemplatedApp;
  private seq = 0;

  constructor(private readonly deps: ServerDeps) {
    this.app = uWS.App();
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
      };
      const hasCredential = presentsCredential(head.authorization, req.getHeader('x-api-key'), req.getHeader('api-key'));
      const xff = req.getHeader('x-forwarded-for');
      // Tool pass-through needs every header; copied only on tool paths.
      let allHeaders: Array<[string, string]> | null = null;
      if (shapeOf(head.path) === 'B') {
        allHeaders = [];
        req.forEach((k, v) => allHeaders!.push([k, v]));
      }
      reply = new Reply(res);
      head.ip = this.clientIp(Buffer.from(res.getRemoteAddressAsText()).toString(), xff);
      this.pipeline(res, reply, head, hasCredential, allHeaders);
    } catch (err) {
      logBug(err);
      try {
        if (reply) reply.sendError(err, 'B');
        else res.cork(() => res.writeStatus('500 Internal Server Error').end());
      } catch (e) {
        logBug(e);
      }
    }
  }

  private clientIp(remote: string, xff: string): string {
    const trusted = this.deps.holder.current.view.trustedProxies;
    if (!xff || trusted.size === 0 || !trusted.has(remote)) return remote;
    // The right-most address that is not one of our proxies is the client.
    const hops = xff.split(',').map((s) => s.trim()).filter(Boolean);
    for (let i = hops.length - 1; i >= 0; i--) if (!trusted.has(hops[i])) return hops[i];
    return hops[0] ?? remote;
  }

  private pipeline(res: HttpResponse, reply: Reply, head: RequestHead, hasCredential: boolean, allHeaders: Array<[string, string]> | null): void {
    const deps = this.deps;
    const familyShape = shapeOf(head.path);
    if (!deps.holder.ready) return reply.sendError(new GatewayError('NOT_READY'), familyShape);

    // Edge: IP budgets and the body cap.
    const edge = deps.edge.take(head.ip, head.path, hasCredential);
    if (!edge.ok) return reply.sendError(new GatewayError('EDGE_RATE_LIMITED', undefined, { retryAfterSec: edge.retryAfterSec }), 'A');
    const capBytes = bodyCapBytes(head.path);
    if (head.contentLength > capBytes) {
      return reply.sendError(new GatewayError('BODY_TOO_LARGE', `Request body is ${head.contentLength} bytes; this path accepts at most ${capBytes}.`), familyShape, true);
    }

    if (isBadPath(head.path)) return reply.sendError(new GatewayError('BAD_PATH'), 'B');

    // Credential: one HMAC and one Map lookup.
    if (!head.authorization) return reply.sendError(new GatewayError('KEY_MISSING'), familyShape);
    const m = BEARER.exec(head.authorization);
    if (!m) return reply.sendError(new GatewayError('KEY_MISSING', 'Malformed Authorization header: expected "Bearer <API_KEY>".'), familyShape);
    const state = deps.holder.current;
    const key = state.lookup(deps.pepper, m[1]);
    if (!key) return reply.sendError(new GatewayError('KEY_INVALID'), familyShape);
    if (deps.isStale()) return reply.sendError(new GatewayError('KEY_STALE'), familyShape);
    if (key.org.blocked) return reply.sendError(new GatewayError('ORG_BLOCKED', blockedMessage(key.org.blockedReason)), familyShape);
    // The node's money slice of the organisation is spent and the control plane has nothing left.
    if (deps.leases && !deps.leases.canSpend(key.orgId)) return reply.sendError(new GatewayError('ORG_BLOCKED', blockedMessage('')), familyShape);
    deps.reporter.touch(key.keyId);

    const route = state.view.routes.match(head.path, head.method);
    if (route instanceof GatewayError) {
      reply.extraHeaders = rateHeaderPairs(deps.keyBudgets.headers(key.limits));
      return reply.sendError(route, route.code === 'METHOD_NOT_ALLOWED' ? familyShape : 'B');
    }

    switch (route.kind) {
      case 'chat':
      case 'embeddings':
      case 'speech':
        return this.jsonEndpoint(res, reply, head, key, route, capBytes);
      case 'transcriptions':
        return this.transcription(res, reply, head, key, capBytes);
      case 'models':
      case 'voices':
        // Listings cost the key nothing (no rpm, no slot); they carry its headers like every answer.
        reply.extraHeaders = rateHeaderPairs(deps.keyBudgets.headers(key.limits));
        reply.send(200, JSON_HEADERS, route.kind === 'models' ? modelList(state, key) : voiceList(state, key));
        return;
      case 'realtime':
        return reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', 'Realtime connections are not available on this gateway yet.'), 'B');
      case 'tool':
        return this.tool(res, reply, head, key, route, capBytes, allHeaders ?? []);
    }
  }

  /** Key budgets. On success the ticket is settled on every way the response ends. */
  private admit(reply: Reply, key: KeyRecord, path: string, estimatedTokens: number): RequestContext | null {
    const deps = this.deps;
    const now = deps.clock.now();
    const a = deps.keyBudgets.admit(key.limits, estimatedTokens);
    reply.extraHeaders = rateHeaderPairs(a.headers);
    if (!a.ok) {
      // Refused for lack of this node's slice: ask the control plane for more right away.
      deps.leases?.noteRefused(key.keyId, minuteOf(now), estimatedTokens);
      reply.sendError(new GatewayError('KEY_RATE_LIMITED', a.message, { type: a.dimension, param: null, retryAfterSec: a.retryAfterSec }), 'A');
      return null;
    }
    const ctx = new RequestContext(deps, `${deps.instanceId}-${(++this.seq).toString(36)}`, key, path, a.ticket, minuteOf(now));
    ctx.spend = deps.leases?.reserveSpend(key.orgId);
    reply.onFinish((aborted) => {
      if (aborted) for (const fn of ctx.abortFns) fn();
      // A request that ended before any upstream call (refused by validation or model scope, too
      // large, aborted early) consumes no request, tokens or slot.
      const fallback = () =>
        ctx.providerStarted ? ctx.complete({ status: aborted ? 499 : 500, promptTokens: ctx.estimatedPromptTokens, completionTokens: 0 }) : ctx.refuse();
      // A provider that ended its response completes right after; this is only a safety net for it.
      // Anything else (an error answered before the provider, an abort) settles here.
      if (ctx.providerStarted && !aborted) setImmediate(fallback);
      else fallback();
    });
    return ctx;
  }

  private jsonEndpoint(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, route: Route, capBytes: number): void {
    collectBody(res, reply, capBytes, head.contentLength, (err, raw) => {
      try {
        if (err) return reply.sendError(err, route.shape, true);
        let body: unknown;
        let parseError = false;
        try {
          body = raw.length > 0 ? JSON.parse(raw.toString('utf8')) : undefined;
        } catch {
          parseError = true;
        }
        const ctx = this.admit(reply, key, head.path, estimateTokens(body));
        if (!ctx) return;
        const invalid = validateJson(route, head.contentType, body, parseError, this.deps.holder.current);
        if (invalid) return reply.sendError(invalid, 'A');
        const obj = body as Record<string, unknown>;
        const model = this.deps.holder.current.view.models.get(obj.model as string)!;
        const scope = this.checkScope(key, model);
        if (scope) return reply.sendError(scope, 'A');
        const provider = this.deps.providers[model.provider];
        if (!provider) return reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`), 'A');
        ctx.model = model;
        ctx.providerStarted = true;
        ctx.estimatedPromptTokens = route.kind === 'chat' ? countMessageTokens(obj.messages) : 0;
        const call = this.modelCall(ctx, reply, model, route.shape);
        const full: ModelCall = { ...call, body: obj, rawBody: raw };
        if (route.kind === 'chat') provider.chat(full);
        else if (route.kind === 'embeddings') provider.embeddings(full);
        else provider.speech(full);
      } catch (e) {
        logBug(e);
        reply.sendError(e, route.shape);
      }
    });
  }

  private transcription(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, capBytes: number): void {
    // onData must be attached before returning (rule 2), so the stream exists before any check answers.
    const stream = streamBody(res, reply, capBytes);
    stream.on('error', () => {});
    const ctx = this.admit(reply, key, head.path, 0);
    if (!ctx) return;
    const boundary = boundaryOf(head.contentType);
    if (!boundary) {
      return reply.sendError(new GatewayError('INVALID_REQUEST', 'Content-Type must be multipart/form-data with a boundary.', { param: null }), 'A');
    }
    // The parts before `model` may go to a temporary file: deleted however the request ends.
    const spill = new UploadSpill(this.deps.spillDir);
    reply.onFinish(() => spill.remove());
    findModelField(stream, boundary, spill, (err, field) => {
      try {
        if (reply.done) return;
        // Answered before the body was read to its end: the rest is not wanted.
        const refuse = (e: unknown) => {
          stream.discard();
          reply.sendError(e, 'A', isTooLarge(e));
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
        provider.transcription({ ...this.modelCall(ctx, reply, model, 'A'), contentType: head.contentType, upload: field });
      } catch (e) {
        logBug(e);
        reply.sendError(e, 'A');
      }
    });
  }

  private tool(res: HttpResponse, reply: Reply, head: RequestHead, key: KeyRecord, route: Route, capBytes: number, headers: Array<[string, string]>): void {
    if (!route.backend) {
      return reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', `No backend is configured for ${head.path}.`), 'B');
    }
    const hasBody = head.method !== 'GET' && head.method !== 'HEAD';
    const body = hasBody ? streamBody(res, reply, capBytes) : null;
    body?.on('error', () => {});
    const ctx = this.admit(reply, key, head.path, 0);
    if (!ctx) return;
    forwardTool(this.deps.pools, {
      backend: route.backend,
      method: head.method,
      pathAndQuery: head.query ? `${head.path}?${head.query}` : head.path,
      headers,
      body,
      reply,
      clientIp: head.ip,
      onAbort: (fn) => ctx.abortFns.push(fn),
      onDone: (status) => ctx.complete({ status, promptTokens: 0, completionTokens: 0 }),
    });
  }

  private modelCall(ctx: RequestContext, reply: Reply, model: ModelConfig, shape: ErrorShape) {
    return {
      requestId: ctx.requestId,
      reply,
      model,
      complete: (r: CallResult) => ctx.complete(r),
      onAbort: (fn: () => void) => ctx.abortFns.push(fn),
      fail: (err: unknown) => {
        if (!reply.headersSent) reply.sendError(err, shape, isTooLarge(err));
        else reply.close();
        ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
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

function isTooLarge(err: unknown): boolean {
  return err instanceof GatewayError && err.code === 'BODY_TOO_LARGE';
}

function parseContentLength(v: string): number {
  if (!v) return -1;
  const n = Number(v);
  return Number.isSafeInteger(n) && n >= 0 ? n : -1;
}

function blockedMessage(reason: string): string {
  if (reason === 'monthly_cap_reached') return "The organisation's monthly spend cap was reached; requests are refused until next month or until the cap is raised.";
  if (reason === 'balance_exhausted') return "The organisation's balance is exhausted; add credits to continue.";
  return "The organisation's balance is exhausted or its monthly spend cap was reached.";
}

const KIND_OF_ROUTE: Record<string, string> = { chat: 'chat', embeddings: 'embeddings', speech: 'speech' };

/** Request validation of the JSON endpoints (400, Shape A). Returns null when valid. */
export function validateJson(route: Route, contentType: string, body: unknown, parseError: boolean, state: GatewayState): GatewayError | null {
  if (!JSON_CONTENT_TYPE.test(contentType)) {
    return new GatewayError('INVALID_REQUEST', 'Content-Type must be application/json.', { param: null });
  }
  if (parseError) {
    return new GatewayError(
      'INVALID_REQUEST',
      'We could not parse the JSON body of your request. The body must be valid JSON.',
      { param: null },
    );
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return new GatewayError('INVALID_REQUEST', 'The request body must be a JSON object.', { param: null });
  }
  const obj = body as Record<string, unknown>;
  if (obj.model === undefined || obj.model === null || obj.model === '') {
    return new GatewayError('INVALID_REQUEST', "Missing required parameter: 'model'.", { param: 'model' });
  }
  if (typeof obj.model !== 'string') return new GatewayError('INVALID_REQUEST', "Invalid type for 'model': expected a string.", { param: 'model' });
  if (route.kind === 'chat') {
    if (obj.messages === undefined) return new GatewayError('INVALID_REQUEST', "Missing required parameter: 'messages'.", { param: 'messages' });
    if (!Array.isArray(obj.messages)) return new GatewayError('INVALID_REQUEST', "Invalid type for 'messages': expected an array.", { param: 'messages' });
    if (obj.messages.length === 0) return new GatewayError('INVALID_REQUEST', "'messages' must contain at least one message.", { param: 'messages' });
  }
  if (route.kind === 'embeddings') {
    const input = obj.input;
    const ok = typeof input === 'string' || (Array.isArray(input) && input.length > 0);
    if (!ok) return new GatewayError('INVALID_REQUEST', "Missing or invalid parameter: 'input' (a string or a non-empty array).", { param: 'input' });
  }
  const model = state.view.models.get(obj.model);
  if (!model) return new GatewayError('UNKNOWN_MODEL', `The model \`${obj.model}\` does not exist.`, { param: 'model' });
  if (model.kind !== KIND_OF_ROUTE[route.kind]) {
    return new GatewayError('INVALID_REQUEST', `The model \`${obj.model}\` is a ${model.kind} model and cannot be used on this endpoint.`, { param: 'model' });
  }
  if (route.kind === 'speech') {
    if (typeof obj.input !== 'string' || obj.input.length === 0) return new GatewayError('INVALID_REQUEST', "Missing required parameter: 'input'.", { param: 'input' });
    if (model.voices.length > 0 && !model.voices.includes(String(obj.voice))) {
      return new GatewayError('INVALID_REQUEST', `Unknown voice; this model has: ${model.voices.join(', ')}.`, { param: 'voice' });
    }
  }
  return null;
}

function modelList(state: GatewayState, key: KeyRecord): string {
  let body = state.modelListCache.get(key.keyId);
  if (body === undefined) {
    const data = state.modelsFor(key).map((m) => ({ id: m.id, object: 'model', created: MODELS_CREATED, owned_by: m.provider === 'demo' ? 'tollgate' : m.provider }));
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
