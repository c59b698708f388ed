// What a key may list and read without calling a model: `GET /v1/models`, `GET /v1/models/{id}`,
// `GET /v1/audio/voices`, and stored responses of the Responses API (`/v1/responses/{id}…`). Each is
// a request like any other: one rpm, no tokens (docs/design.md#what-counts-as-a-request).
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState, KeyRecord } from '../state/key-table.js';
import { GatewayError } from '../errors.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { EndpointDeps } from './intake.js';
import { failCall, PlainEndpoint } from './intake.js';
import type { ResponsesEndpoint } from './responses/responses.js';

const JSON_HEADERS = [['content-type', 'application/json']] as const;
/** 2025-01-01, a fixed `created` for configured models. */
const MODELS_CREATED = 1735689600;

/** `GET /v1/models`, `GET /v1/models/{id}`, `GET /v1/audio/voices`. */
export class Listings extends PlainEndpoint {
  constructor(private readonly deps: EndpointDeps) {
    super();
  }

  serve(r: ApiRequest): void {
    const ctx = r.ctx!;
    const key = r.key!;
    const state = this.deps.holder.current;
    const kind = r.route!.kind;
    if (kind === 'model') {
      const id = decodeURIComponent(r.path.slice('/v1/models/'.length));
      const model = state.modelsFor(key).find((m) => m.id === id);
      // A model the key may not use is as unknown to it as one that does not exist (and costs nothing).
      if (!model) {
        ctx.refuse();
        return r.reply.sendError(new GatewayError('NOT_FOUND', `The model \`${id}\` does not exist or you do not have access to it.`, { param: 'model' }));
      }
      ctx.providerStarted = true;
      ctx.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
      return r.reply.send(200, JSON_HEADERS, JSON.stringify(modelObject(model)));
    }
    ctx.providerStarted = true;
    ctx.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
    r.reply.send(200, JSON_HEADERS, kind === 'models' ? modelList(state, key) : voiceList(state, key));
  }
}

/** A stored response (`/v1/responses/{id}`, `…/input_items`, `…/cancel`): the key's own project's only. */
export class StoredResponses extends PlainEndpoint {
  constructor(
    private readonly deps: EndpointDeps,
    private readonly responses: ResponsesEndpoint,
  ) {
    super();
  }

  serve(r: ApiRequest): void {
    const ctx = r.ctx!;
    const reply = r.reply;
    this.responses.stored(ctx, reply, r.path, r.method, r.query, this.deps.holder.current, (err) => failCall(ctx, reply, err));
  }
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
