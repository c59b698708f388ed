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
import { parseStoredResponsePath, type StoredAction } from '../../routing/responses-paths.js';
import type { BackgroundFollowers } from './background-responses.js';
import { OWNERS_WAIT_MS, type ResponseOwner, type ResponseOwners } from '../../state/response-owners.js';
import { namedIdRefusal, ownedBy } from './owned-ids.js';
import { pinOf, type Pin } from './affinity.js';

export interface ResponsesDeps {
  clock: Clock;
  owners: ResponseOwners;
  providers: Readonly<Record<string, ResponsesProvider>>;
  /** Follows background responses to their end (background-responses.ts). */
  followers: BackgroundFollowers;
  /** A response created on this node (held by `deployment` of a pooled model), for the control plane to fan out to the other nodes. */
  reportOwner?(id: string, projectId: string, model: string, createdAtMs: number, deployment: string): void;
}

/** A refusal for an id with no owner record here (a response, conversation or item), not a config list's. */
function isOwnerMiss(err: GatewayError): boolean {
  if (err.code !== 'NOT_FOUND') return false;
  const p = err.param;
  return p === null || p === undefined || p === 'previous_response_id' || p === 'conversation' || /^(input|items)\[\d+\]\.id$/.test(p);
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

  /**
   * The deployment of a pooled `model` a request must go to, where the objects it names live
   * (affinity.ts; `pathId`: the one its path names), or the refusal when no one deployment holds them all.
   */
  pinOf(model: ModelConfig, body: Record<string, unknown> | null, state: GatewayState, itemsField: 'input' | 'items' = 'input', pathId = ''): Pin | GatewayError {
    return pinOf(model, body, state, this.deps.owners, this.deps.clock.now(), itemsField, pathId);
  }

  /**
   * Runs `check` (the ids a request names) and hands its refusal, or null, to `then`: at once, unless
   * an id missed while this node does not hold all of the project's records yet (a node holds the
   * projects it serves, docs/design.md#owner-records). Then it asks for them, waits for them (bounded)
   * and checks again; still not here, the answer is a 503 to retry, never a 404 that may be wrong.
   */
  checked(key: KeyRecord, reply: { readonly done: boolean }, check: () => GatewayError | null, then: (err: GatewayError | null) => void): void {
    const err = check();
    const owners = this.deps.owners;
    if (!err || !isOwnerMiss(err) || owners.holdsAllOf(key.projectId)) return then(err);
    owners.whenHeld(key, OWNERS_WAIT_MS, (held) => {
      if (reply.done) return;
      const again = check();
      then(again && !held && isOwnerMiss(again) ? new GatewayError('OWNER_RECORDS_LOADING', undefined, { retryAfterSec: 1 }) : again);
    });
  }

  /** `checkIds` without waiting: a miss before the project's records are here is a 503 (a socket turn then waits for them, socket-turns.ts). */
  checkIdsNow(key: KeyRecord, body: Record<string, unknown>, state: GatewayState): GatewayError | null {
    const err = this.checkIds(key, body, state);
    if (!err || !isOwnerMiss(err) || this.deps.owners.holdsAllOf(key.projectId)) return err;
    this.askOwners(key);
    return new GatewayError('OWNER_RECORDS_LOADING', undefined, { retryAfterSec: 1 });
  }

  /** Calls `go` once this node holds the project's owner records, or its wait for them ended. */
  whenOwnersHeld(key: KeyRecord, go: () => void): void {
    this.deps.owners.whenHeld(key, OWNERS_WAIT_MS, () => go());
  }

  /** Asks for the project's owner records if this node does not hold them (a socket opened). */
  askOwners(key: KeyRecord): void {
    if (!this.deps.owners.holdsAllOf(key.projectId)) this.deps.owners.whenHeld(key, OWNERS_WAIT_MS, () => {});
  }

  /** The owner record of `id` if it is the key's project's (and of a model the key may use). */
  ownerOf(key: KeyRecord, id: string, state: GatewayState): ResponseOwner | undefined {
    return ownedBy(this.deps.owners, key, id, state, this.deps.clock.now());
  }

  /** The record of `id` goes (the upstream deleted it). */
  forget(id: string): void {
    this.deps.owners.forget(id);
  }

  /**
   * Records (and reports) that the key's project owns the upstream object `id` (a response, a
   * conversation, an item), held by `deployment` of a pooled model ('' its first, or a model's one upstream).
   */
  recordOwnerOf(key: KeyRecord, model: ModelConfig, id: string, deployment = ''): void {
    const createdAtMs = this.deps.clock.now();
    this.deps.owners.add(id, { projectId: key.projectId, orgId: key.orgId, model: model.id, createdAtMs, deployment });
    this.deps.reportOwner?.(id, key.projectId, model.id, createdAtMs, deployment);
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

  /**
   * Hands a checked create to its provider, recording the owner of the id it names (with the
   * deployment that holds it); `pin`: the deployment of a pooled model it must go to (pinOf).
   */
  create(ctx: RequestContext, provider: ResponsesProvider, call: ModelCall, pin: Pin = undefined): void {
    const key = ctx.key;
    const model = call.model;
    const c = call as ResponsesCall;
    c.deployment = pin;
    // `store: false`: the upstream keeps nothing, so there is no owner to record (only the log's id).
    const stored = call.body.store !== false;
    c.recordOwner = (id: string, deployment: string) => {
      ctx.responseId = id;
      if (stored) this.recordOwnerOf(key, model, id, deployment);
    };
    // Its output items may be named by an `item_reference` later (stored upstream only when it is).
    c.recordItems = (ids: string[], deployment: string) => {
      if (stored) for (const id of ids) this.recordOwnerOf(key, model, id, deployment);
    };
    // A chain from this response re-reads its input and output (chainTokens).
    const complete = c.complete;
    c.complete = (r: CallResult) => {
      if (stored && ctx.responseId) this.noteContext(ctx.responseId, r.promptTokens, r.completionTokens);
      complete(r);
    };
    const followers = this.deps.followers;
    c.follow = (id: string, status: number, deployment: string) => followers.follow(ctx, provider, model, id, call.body, status, deployment, stored ? c.recordItems : null);
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
    // Another project's response, a model the key may not use, or an id nobody recorded: all alike.
    const mine = () => ownedBy(deps.owners, key, at.id, state, deps.clock.now());
    this.checked(key, reply, () => (mine() ? null : notFound(at.id, null)), (err) => {
      try {
        if (err) return refuse(err);
        this.storedOwned(ctx, reply, at, mine()!, method, query, state, fail);
      } catch (e) {
        fail(e);
      }
    });
  }

  /** A stored-response request, the response the key's own. */
  private storedOwned(ctx: RequestContext, reply: Reply, at: { id: string; action: StoredAction }, owner: ResponseOwner, method: string, query: string, state: GatewayState, fail: (err: unknown) => void): void {
    const deps = this.deps;
    const key = ctx.key;
    const refuse = (err: GatewayError) => {
      ctx.refuse();
      reply.sendError(err);
    };
    const model = state.view.models.get(owner.model);
    const provider = model && deps.providers[model.provider];
    if (!model || !provider) return refuse(notFound(at.id, null));
    ctx.providerStarted = true;
    ctx.responseId = at.id;
    reply.upstreamAt = performance.now();
    const owners = deps.owners;
    // It lives with the deployment that created it (affinity.ts): its first, if recorded before pools kept it.
    const deployment = model.deployments.length > 0 ? owner.deployment || model.deployments[0].id : undefined;
    provider.stored({
      requestId: ctx.requestId,
      reply,
      model,
      deployment,
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
        owners.forget(at.id);
      },
      // A response's input items, listed: an item_reference may name them.
      recordOwned: (ids: string[]) => {
        for (const id of ids) this.recordOwnerOf(key, model, id, deployment ?? '');
      },
    });
  }
}
