// The Responses API (`POST /v1/responses`, JSON or `stream: true`, and the stored-response paths)
// on the node's HTTP pipeline (the gate and endpoints/model-calls.ts run the checks up to the model scope, then hand the
// request here). Upstream objects belong to the project that created them: every stored-response
// request, and every id a create names (owned-ids.ts), is checked against the owner records
// (response-owners.ts) before the upstream is asked, and anything not the key's own answers 404 Shape A. A background
// create is followed to its end and billed then (background-responses.ts).
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState, KeyRecord } from '../../state/key-table.js';
import { GatewayError } from '../../errors.js';
import type { Clock } from '../../limits/clock.js';
import { estimateTokens } from '../../proxy/tokens.js';
import type { Reply } from '../../request/reply.js';
import type { RequestContext } from '../../request/request-context.js';
import type { CallResult, ModelCall } from '../../proxy/providers/provider.js';
import type { ResponsesCall, ResponsesProvider } from '../../proxy/providers/responses-provider.js';
import { parseStoredResponsePath } from '../../routing/responses-paths.js';
import type { BackgroundFollowers } from './background-responses.js';
import type { ResponseOwner, ResponseOwners } from '../../state/response-owners.js';
import { namedIdRefusal, ownedBy } from './owned-ids.js';

export interface ResponsesDeps {
  clock: Clock;
  owners: ResponseOwners;
  providers: Readonly<Record<string, ResponsesProvider>>;
  /** Follows background responses to their end (background-responses.ts). */
  followers: BackgroundFollowers;
  /** A response created on this node, for the control plane to fan out to the other nodes. */
  reportOwner?(id: string, projectId: string, model: string, createdAtMs: number): void;
}

/** The 404 of a response the key may not see: the same text whether it exists or not. */
function notFound(id: string, param: string | null): GatewayError {
  return new GatewayError('NOT_FOUND', `No response found with id '${id}'.`, { param });
}

/**
 * The tokens reserved for a Responses request before it runs: its input and instructions (as chat's
 * estimate counts them), its tools' definitions, and the most output it allows (`max_output_tokens`).
 * The ticket is settled on the upstream's real figure.
 */
export function estimateResponseTokens(body: unknown): number {
  // The one estimator (tokens.ts) counts `input`, `instructions`, `tools` and the text format; the
  // answer's ceiling is reserved on top, and settled on the real figure.
  const n = estimateTokens(body);
  const max = body !== null && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>).max_output_tokens : undefined;
  return typeof max === 'number' && Number.isSafeInteger(max) && max > 0 ? n + max : n;
}

export class ResponsesEndpoint {
  constructor(private readonly deps: ResponsesDeps) {}

  /** The refusal for the first upstream id the body names that is not the key's project's (owned-ids.ts); null: all are. */
  checkIds(key: KeyRecord, body: Record<string, unknown>, state: GatewayState, itemsField: 'input' | 'items' = 'input'): GatewayError | null {
    return namedIdRefusal(body, key, state, this.deps.owners, this.deps.clock.now(), itemsField);
  }

  /** The owner record of `id` if it is the key's project's (and of a model the key may use). */
  ownerOf(key: KeyRecord, id: string, state: GatewayState): ResponseOwner | undefined {
    return ownedBy(this.deps.owners, key, id, state, this.deps.clock.now());
  }

  /** The record of `id` goes (the upstream deleted it). */
  forget(id: string): void {
    this.deps.owners.remove(id);
  }

  /** Records (and reports) that the key's project owns the upstream object `id` (a response, a conversation, an item). */
  recordOwnerOf(key: KeyRecord, model: ModelConfig, id: string): void {
    const createdAtMs = this.deps.clock.now();
    this.deps.owners.add(id, { projectId: key.projectId, model: model.id, createdAtMs });
    this.deps.reportOwner?.(id, key.projectId, model.id, createdAtMs);
  }

  /**
   * The tokens a create continuing `previous_response_id` re-reads upstream (the earlier response's
   * input and output), as far as this node knows them: 0 when it names none or the node did not see
   * it end. Added to the create's estimate (docs/design.md#token-estimates). Only the key's project's
   * own: another's would show in the refusal's rate headers (or a 429 for it) what its response holds.
   */
  chainTokens(body: unknown, key: KeyRecord): number {
    const prev = body !== null && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>).previous_response_id : undefined;
    if (typeof prev !== 'string' || prev === '') return 0;
    const o = this.deps.owners.get(prev, this.deps.clock.now());
    return o && o.projectId === key.projectId ? (o.contextTokens ?? 0) : 0;
  }

  /** A response of this node ended: a chain from it re-reads its input and output. */
  noteContext(id: string, promptTokens: number, completionTokens: number): void {
    this.deps.owners.noteContext(id, promptTokens + completionTokens);
  }

  /** The provider of a model's Responses API, if it has one. */
  providerOf(model: ModelConfig): ResponsesProvider | undefined {
    return this.deps.providers[model.provider];
  }

  /** Hands a checked create to its provider, recording the owner of the id it names. */
  create(ctx: RequestContext, provider: ResponsesProvider, call: ModelCall): void {
    const key = ctx.key;
    const model = call.model;
    const c = call as ResponsesCall;
    // `store: false`: the upstream keeps nothing, so there is no owner to record (only the log's id).
    const stored = call.body.store !== false;
    c.recordOwner = (id: string) => {
      ctx.responseId = id;
      if (stored) this.recordOwnerOf(key, model, id);
    };
    // Its output items may be named by an `item_reference` later (stored upstream only when it is).
    c.recordItems = (ids: string[]) => {
      if (stored) for (const id of ids) this.recordOwnerOf(key, model, id);
    };
    // A chain from this response re-reads its input and output (chainTokens).
    const complete = c.complete;
    c.complete = (r: CallResult) => {
      if (stored && ctx.responseId) this.noteContext(ctx.responseId, r.promptTokens, r.completionTokens);
      complete(r);
    };
    const followers = this.deps.followers;
    c.follow = (id: string, status: number) => followers.follow(ctx, provider, model, id, call.body, status);
    provider.create(c);
  }

  /** `GET|DELETE /v1/responses/{id}`, `GET …/input_items`, `POST …/cancel`: the key's own, or 404. */
  stored(ctx: RequestContext, reply: Reply, path: string, method: string, query: string, state: GatewayState, fail: (err: unknown) => void): void {
    const deps = this.deps;
    const key = ctx.key;
    const at = parseStoredResponsePath(path);
    const refuse = (err: GatewayError) => {
      ctx.refuse();
      reply.sendError(err);
    };
    if (!at) return refuse(new GatewayError('NOT_FOUND', `No route for ${path}.`));
    const owner = deps.owners.get(at.id, deps.clock.now());
    // Another project's response, a model the key may not use, or an id nobody recorded: all alike.
    if (!owner || owner.projectId !== key.projectId || !state.mayUseModel(key, owner.model)) return refuse(notFound(at.id, null));
    const model = state.view.models.get(owner.model);
    const provider = model && deps.providers[model.provider];
    if (!model || !provider) return refuse(notFound(at.id, null));
    ctx.providerStarted = true;
    ctx.responseId = at.id;
    reply.upstreamAt = performance.now();
    const owners = deps.owners;
    provider.stored({
      requestId: ctx.requestId,
      reply,
      model,
      id: at.id,
      action: at.action,
      method,
      query,
      complete(r: CallResult) {
        ctx.complete(r);
      },
      onAbort(fn: () => void) {
        ctx.abortFns.push(fn);
      },
      fail,
      forget() {
        owners.remove(at.id);
      },
      // A response's input items, listed: an item_reference may name them.
      recordOwned: (ids: string[]) => {
        for (const id of ids) this.recordOwnerOf(key, model, id);
      },
    });
  }
}
