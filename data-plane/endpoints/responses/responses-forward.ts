// The Responses API beyond creating and reading responses: `POST /v1/responses/compact`, `POST
// /v1/responses/input_tokens` and the Conversations API (`/v1/conversations…`). Each is admitted and
// billed as any request (the intake, the one admission, RequestContext.complete): a compaction is
// billed its usage at its model's prices and reserves its worst case; a count and the conversation
// paths cost a request of rpm and no tokens, as upstream. A pooled model's request goes to the deployment
// where what it names lives (affinity.ts), and is billed at that deployment's prices. Every id a request names is checked
// against the key's project before the upstream is asked (owned-ids.ts), and a conversation's paths
// answer 404 for a conversation not the project's. A count or compaction without `model` takes the
// model of the response or conversation it names, else 400 on `model`.
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState, KeyRecord } from '../../state/key-table.js';
import { GatewayError } from '../../errors.js';
import { checkModelScope } from '../../gate/gate.js';
import type { ApiRequest } from '../../gate/api-request.js';
import type { Admission } from '../../request/admission.js';
import { logBug } from '../../log.js';
import type { RequestContext } from '../../request/request-context.js';
import { findDuplicateKey } from '../../request/validate-request.js';
import { estimateTokens } from '../../proxy/tokens.js';
import { requestWorstCase } from '../../limits/worst-case.js';
import { requestedTier, unpricedInRequest } from '../../../proto/lib/reported-prices.js';
import type { ForwardCall } from '../../proxy/providers/responses-provider.js';
import { parseConversationPath } from '../../routing/responses-paths.js';
import { failCall, PlainEndpoint, refuseAdmitted, type EndpointDeps } from '../intake.js';
import { conversationOf } from './owned-ids.js';
import { estimateResponseTokens, type ResponsesEndpoint } from './responses.js';
import type { Pin } from './affinity.js';
import { dearestPrices } from '../../proxy/providers/pooled-upstreams.js';

type Obj = Record<string, unknown>;
const JSON_CONTENT_TYPE = /^application\/json\s*(;|$)/i;

function invalid(message: string, param: string | null): GatewayError {
  return new GatewayError('INVALID_REQUEST', message, { param });
}

/** A JSON object body (an absent body is `{}`), or the 400 to answer. */
function parseBody(r: ApiRequest, text: string): Obj | GatewayError {
  if (text.length === 0) return {};
  if (!JSON_CONTENT_TYPE.test(r.contentType)) return invalid('Content-Type must be application/json.', null);
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return invalid('We could not parse the JSON body of your request. The body must be valid JSON.', null);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return invalid('The request body must be a JSON object.', null);
  const dup = findDuplicateKey(text);
  if (dup !== null) return invalid(`Duplicate key '${dup}' in the JSON body: each key may appear once.`, dup);
  return v as Obj;
}

export class ResponsesForward extends PlainEndpoint {
  constructor(
    private readonly deps: EndpointDeps,
    private readonly admission: Admission,
    private readonly responses: ResponsesEndpoint,
  ) {
    super();
  }

  serve(r: ApiRequest, raw: unknown): void {
    const text = Buffer.isBuffer(raw) && raw.length > 0 ? raw.toString('utf8') : '';
    const body = r.method === 'POST' ? parseBody(r, text) : null;
    const compact = r.route!.kind === 'compact';
    // A compaction reserves its input (a chain's context included) and the output it allows, as a create.
    const estimate = compact && body !== null && !(body instanceof GatewayError) ? estimateResponseTokens(body) + this.responses.chainTokens(body, r.key!) : 0;
    const ctx = r.ctx!;
    this.admission.reserveOrWait(ctx, r.reply, r.key!, estimate, (ok) => {
      if (!ok) return;
      try {
        this.reserved(r, ctx, body, text);
      } catch (e) {
        logBug(e);
        r.reply.sendError(e);
      }
    });
  }

  private reserved(r: ApiRequest, ctx: RequestContext, body: Obj | GatewayError | null, text: string): void {
    const reply = r.reply;
    if (body instanceof GatewayError) return refuseAdmitted(ctx, reply, body);
    const key = r.key!;
    const state = this.deps.holder.current;
    const kind = r.route!.kind;
    const conv = kind === 'conversation' ? parseConversationPath(r.path) : null;
    if (kind === 'conversation' && !conv) return refuseAdmitted(ctx, reply, new GatewayError('NOT_FOUND', `No route for ${r.path}.`));
    // Every id the body names is the project's own (a conversation's items stand in `items`), and so
    // is the path's conversation; a miss before this node holds the project's records waits for them.
    const check = () => {
      const foreign = body ? this.responses.checkIds(key, body, state, conv ? 'items' : 'input') : null;
      if (foreign || !conv || conv.id === '' || this.responses.ownerOf(key, conv.id, state)) return foreign;
      return new GatewayError('NOT_FOUND', `No conversation found with id '${conv.id}'.`, { param: null });
    };
    this.responses.checked(key, reply, check, (foreign) => {
      try {
        if (foreign) return refuseAdmitted(ctx, reply, foreign);
        this.owned(r, ctx, body, text, conv);
      } catch (e) {
        logBug(e);
        reply.sendError(e);
      }
    });
  }

  /** Its ids all the project's own. */
  private owned(r: ApiRequest, ctx: RequestContext, body: Obj | null, text: string, conv: ForwardCall['conversation']): void {
    const reply = r.reply;
    const key = r.key!;
    const state = this.deps.holder.current;
    const kind = r.route!.kind;
    const model = conv ? this.conversationModel(key, conv.id, state) : this.namedModel(key, body ?? {}, state);
    if (model instanceof GatewayError) return refuseAdmitted(ctx, reply, model);
    // The item a path names is checked as the conversation is: another project's id never goes upstream.
    if (conv && conv.itemId !== '' && !this.responses.ownerOf(key, conv.itemId, state)) {
      return refuseAdmitted(ctx, reply, new GatewayError('NOT_FOUND', `No item found with id '${conv.itemId}'.`, { param: null }));
    }
    const scope = checkModelScope(state, key, model);
    if (scope) return refuseAdmitted(ctx, reply, scope);
    const provider = this.responses.providerOf(model);
    if (!provider) return refuseAdmitted(ctx, reply, new GatewayError('UPSTREAM_UNREACHABLE', `No provider "${model.provider}" on this node.`));
    // A pooled model: to the deployment where the conversation or what the body names lives (affinity.ts).
    const pin = this.responses.pinOf(model, body, state, conv ? 'items' : 'input', conv?.id ?? '');
    if (pin instanceof GatewayError) return refuseAdmitted(ctx, reply, pin);
    const op: ForwardCall['op'] = kind === 'compact' ? 'compact' : kind === 'input-tokens' ? 'input_tokens' : 'conversation';
    const input = op === 'compact' ? estimateTokens(body) + this.responses.chainTokens(body, key) : 0;
    const go = () => this.forward(r, ctx, model, op, conv, body, text, input, pin);
    if (op !== 'compact') return go();
    // A compaction runs a model on a tier as a create does: a tier it has no price for is refused (validate-request.ts).
    const unpriced = unpricedInRequest(model, body ?? {});
    if (unpriced) return refuseAdmitted(ctx, reply, invalid(unpriced.message, unpriced.param));
    // Near a money limit a compaction runs only if its worst case fits (docs/money-limits.md#the-last-request);
    // a pooled model's at the dearest of its deployments, any of which may serve it.
    const worst = requestWorstCase(dearestPrices(model), 'responses', body ?? {}, input);
    if (this.admission.reserveWorstCaseNow(key, ctx.spend, worst)) return go();
    this.admission.reserveWorstCaseOrWait(key, ctx.spend, worst, () => reply.done, (refusal) => {
      if (refusal === 'gone') return;
      if (refusal) return refuseAdmitted(ctx, reply, refusal);
      go();
    });
  }

  /** A conversation's model: the config's for a new one, its owner record's for one the project owns (else 404). */
  private conversationModel(key: KeyRecord, id: string, state: GatewayState): ModelConfig | GatewayError {
    if (id === '') {
      const name = state.view.config.responses?.conversationsModel || state.view.config.models.find((m) => m.kind === 'chat')?.id || '';
      const m = state.view.models.get(name);
      return m ?? new GatewayError('UPSTREAM_UNREACHABLE', 'No model is configured to keep conversations.');
    }
    const owner = this.responses.ownerOf(key, id, state);
    const m = owner && state.view.models.get(owner.model);
    return m ?? new GatewayError('NOT_FOUND', `No conversation found with id '${id}'.`, { param: null });
  }

  /** The model a count or compaction names, else that of the response or conversation it names, else 400. */
  private namedModel(key: KeyRecord, body: Obj, state: GatewayState): ModelConfig | GatewayError {
    const named = body.model;
    if (named !== undefined && named !== null && named !== '') {
      if (typeof named !== 'string') return invalid("Invalid type for 'model': expected a string.", 'model');
      const m = state.view.models.get(named);
      if (!m) return new GatewayError('UNKNOWN_MODEL', `The model \`${named}\` does not exist.`, { param: 'model' });
      if (m.kind !== 'chat') return invalid(`The model \`${named}\` is not a chat model and cannot be used on this endpoint.`, 'model');
      return m;
    }
    const conv = conversationOf(body);
    const from = typeof body.previous_response_id === 'string' ? body.previous_response_id : typeof conv === 'string' ? conv : '';
    const owner = from ? this.responses.ownerOf(key, from, state) : undefined;
    const m = owner && state.view.models.get(owner.model);
    return m ?? invalid("Missing required parameter: 'model' (or a `previous_response_id` or `conversation` to take it from).", 'model');
  }

  private forward(r: ApiRequest, ctx: RequestContext, model: ModelConfig, op: ForwardCall['op'], conv: ForwardCall['conversation'], body: Obj | null, text: string, input: number, pin: Pin): void {
    const reply = r.reply;
    const key = ctx.key;
    const responses = this.responses;
    ctx.model = model;
    ctx.providerStarted = true;
    ctx.estimatedPromptTokens = input;
    if (op === 'compact') ctx.requestedTier = requestedTier(body ?? {});
    reply.upstreamAt = performance.now();
    responses.providerOf(model)!.forward({
      requestId: ctx.requestId,
      reply,
      model,
      deployment: pin,
      op,
      conversation: conv,
      method: r.method,
      query: r.query,
      body,
      bodyText: text,
      inputTokens: input,
      complete(res) {
        ctx.complete(res);
      },
      onAbort(fn) {
        ctx.abortFns.push(fn);
      },
      fail(err) {
        failCall(ctx, reply, err);
      },
      recordOwned(ids, deployment) {
        for (const id of ids) responses.recordOwnerOf(key, model, id, deployment);
      },
      forget(id) {
        responses.forget(id);
      },
      // A pooled model: billed at the prices of the deployment that served, which the log names.
      served(billAs, deployment, attempts) {
        ctx.model = billAs;
        ctx.upstream = { deployment, attempts };
      },
    });
  }
}
