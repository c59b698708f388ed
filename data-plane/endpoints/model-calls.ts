// Model calls with a JSON body: chat completions, embeddings, speech and creating a response (the
// Responses API). The body is read whole (intake.ts), its tokens estimated and reserved (tpm), the
// request validated (400), the model's scope checked (401), then the provider is called.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState } from '../state/key-table.js';
import { GatewayError } from '../errors.js';
import { checkModelScope } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { Admission } from '../request/admission.js';
import { type Reply } from '../request/reply.js';
import { logBug } from '../log.js';
import type { RequestContext } from '../request/request-context.js';
import { validateJson } from '../request/validate-request.js';
import { estimateTokens } from '../proxy/tokens.js';
import { requestWorstCase } from '../limits/worst-case.js';
import type { CallResult, ModelCall } from '../proxy/providers/provider.js';
import { dearestPrices } from '../proxy/providers/pooled-upstreams.js';
import { requestedTier } from '../../proto/lib/reported-prices.js';
import { failCall, refuseAdmitted, type Endpoint, type EndpointDeps } from './intake.js';
import { estimateResponseTokens, type ResponsesEndpoint } from './responses/responses.js';

/**
 * JSON bodies a model endpoint can accept, below the path's cap: a speech request is a short text
 * (the OpenAI API takes at most 4,096 characters of input), so it never needs the audio path's 200 MiB.
 */
const JSON_BODY_CAP_BYTES: Partial<Record<string, number>> = { speech: 64 * 1024 };

export class ModelCalls implements Endpoint {
  readonly discardsRefusedStream = false;

  constructor(
    private readonly deps: EndpointDeps,
    private readonly admission: Admission,
    private readonly responses: ResponsesEndpoint,
  ) {}

  bodyCap(r: ApiRequest): number {
    const cap = r.family.bodyCapBytes;
    return Math.min(cap, JSON_BODY_CAP_BYTES[r.route!.kind] ?? cap);
  }

  /** A JSON body that cannot be valid for the endpoint is refused before a byte is read. */
  before(r: ApiRequest): boolean {
    const cap = this.bodyCap(r);
    if (r.contentLength <= cap) return true;
    r.reply.sendError(new GatewayError('BODY_TOO_LARGE', `Request body is ${r.contentLength} bytes; ${r.path} accepts JSON bodies of at most ${cap} bytes.`), true);
    return false;
  }

  /** Admitted with the body read whole: tokens are reserved once the body is parsed. */
  serve(r: ApiRequest, body: Buffer | null): void {
    const raw = body ?? Buffer.alloc(0);
    const route = r.route!;
    const text = raw.length > 0 ? raw.toString('utf8') : '';
    let parsed: unknown;
    let parseError = false;
    try {
      parsed = text.length > 0 ? JSON.parse(text) : undefined;
    } catch {
      parseError = true;
    }
    const estimate = route.kind === 'responses' ? estimateResponseTokens(parsed) + this.responses.chainTokens(parsed, r.key!) : estimateTokens(parsed);
    const ctx = r.ctx!;
    this.admission.reserveOrWait(ctx, r.reply, r.key!, estimate, (ok) => {
      if (ok) this.reserved(r, ctx, parsed, parseError, estimate, raw, text);
    });
  }

  private reserved(r: ApiRequest, ctx: RequestContext, body: unknown, parseError: boolean, estimate: number, raw: Buffer, text: string): void {
    const deps = this.deps;
    const reply = r.reply;
    const route = r.route!;
    const key = r.key!;
    try {
      if (estimate > 0) reply.rateHeaders = deps.keyBudgets.headers(key.limits);
      const state = deps.holder.current;
      const invalid = validateJson(route, r.contentType, body, parseError, state, parseError ? undefined : text);
      if (invalid) return refuseAdmitted(ctx, reply, invalid);
      const obj = body as Record<string, unknown>;
      const model = state.view.models.get(obj.model as string)!;
      const scope = checkModelScope(state, key, model);
      if (scope) return refuseAdmitted(ctx, reply, scope);
      if (route.kind === 'speech') return this.call(r, ctx, model, obj, estimate, raw, text, state);
      // Near a money limit the request runs only if its worst case fits (docs/money-limits.md#the-last-request).
      const input = route.kind === 'responses' ? estimateTokens(obj) + this.responses.chainTokens(obj, key) : estimate;
      // A pooled model's at the dearest of its deployments: any of them may serve it.
      const worst = requestWorstCase(dearestPrices(model), route.kind === 'responses' ? 'responses' : 'chat', obj, input);
      // The common case, without a closure: the worst case is in the slice (or no limit is near).
      if (this.admission.reserveWorstCaseNow(key, ctx.spend, worst)) return this.call(r, ctx, model, obj, estimate, raw, text, state);
      this.admission.reserveWorstCaseOrWait(key, ctx.spend, worst, () => reply.done, (refusal) => {
        if (refusal === 'gone') return;
        if (refusal) return refuseAdmitted(ctx, reply, refusal);
        this.call(r, ctx, model, obj, estimate, raw, text, state);
      });
    } catch (e) {
      logBug(e);
      reply.sendError(e);
    }
  }

  /** Within every limit, money included: the provider is called. */
  private call(r: ApiRequest, ctx: RequestContext, model: ModelConfig, obj: Record<string, unknown>, estimate: number, raw: Buffer, text: string, state: GatewayState): void {
    const deps = this.deps;
    const reply = r.reply;
    const route = r.route!;
    try {
      if (route.kind === 'responses') return this.createResponse(ctx, reply, model, obj, raw, text, state);
      const provider = deps.providers[model.provider];
      if (!provider) return refuseAdmitted(ctx, reply, new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`));
      ctx.model = model;
      ctx.providerStarted = true;
      // An answer that reports no tier is billed at the one asked for (request-context.ts).
      ctx.requestedTier = requestedTier(obj);
      // What an end without the upstream's usage bills: the estimate the tpm reservation took.
      ctx.estimatedPromptTokens = estimate;
      const call = modelCall(ctx, reply, model, obj, raw, text);
      if (route.kind === 'chat') provider.chat(call);
      else if (route.kind === 'embeddings') provider.embeddings(call);
      else provider.speech(call);
    } catch (e) {
      logBug(e);
      reply.sendError(e);
    }
  }

  /** `POST /v1/responses`, validated and in scope: every id it names must be the project's own (owned-ids.ts). */
  private createResponse(ctx: RequestContext, reply: Reply, model: ModelConfig, obj: Record<string, unknown>, raw: Buffer, text: string, state: GatewayState): void {
    // A miss before this node holds the project's records waits for them (responses.ts checked).
    this.responses.checked(ctx.key, reply, () => this.responses.checkIds(ctx.key, obj, state), (foreign) => {
      try {
        if (foreign) return refuseAdmitted(ctx, reply, foreign);
        this.createOwned(ctx, reply, model, obj, raw, text, state);
      } catch (e) {
        logBug(e);
        reply.sendError(e);
      }
    });
  }

  /** A create whose ids are all the project's own. */
  private createOwned(ctx: RequestContext, reply: Reply, model: ModelConfig, obj: Record<string, unknown>, raw: Buffer, text: string, state: GatewayState): void {
    // A pooled model: to the deployment where what it names lives, if it names anything stored.
    const pin = this.responses.pinOf(model, obj, state);
    if (pin instanceof GatewayError) return refuseAdmitted(ctx, reply, pin);
    const provider = this.responses.providerOf(model);
    if (!provider) return refuseAdmitted(ctx, reply, new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`));
    ctx.model = model;
    ctx.providerStarted = true;
    ctx.requestedTier = requestedTier(obj);
    // What an end without the upstream's usage bills: its input, a chain's context included.
    ctx.estimatedPromptTokens = estimateTokens(obj) + this.responses.chainTokens(obj, ctx.key);
    this.responses.create(ctx, provider, modelCall(ctx, reply, model, obj, raw, text), pin);
  }
}

/** The call a provider is handed. */
function modelCall(ctx: RequestContext, reply: Reply, model: ModelConfig, body: Record<string, unknown>, rawBody: Buffer, bodyText: string): ModelCall {
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
    inputTokens: ctx.estimatedPromptTokens,
    caller: ctx.key,
    complete(r: CallResult) {
      ctx.complete(r);
    },
    onAbort(fn: () => void) {
      ctx.abortFns.push(fn);
    },
    fail(err: unknown) {
      failCall(ctx, reply, err);
    },
    served(billAs: ModelConfig, deployment: string, attempts: string) {
      ctx.model = billAs;
      ctx.upstream = { deployment, attempts };
    },
    refuse(err: unknown) {
      refuseAdmitted(ctx, reply, err);
    },
  };
}
