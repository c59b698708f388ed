// The Responses API's WebSocket mode (`/v1/responses` upgraded, `?model=MODEL`): the client sends
// `response.create` events, each with the same top-level fields as the body of `POST /v1/responses`
// (the upstream reads them there), and gets each response's events back. The session around it is
// realtime's (realtime/gateway.ts checks everything before the upgrade, realtime/session.ts relays
// with backpressure and holds one parallel slot while open); each create is a turn admitted and
// billed as a request (socket-turns.ts). What is the Responses API's own is here:
// - ResponsesTurnRules: a create is checked on exactly the fields the upstream reads: a `response`
//   member (fields named in a second place the upstream does not read) is refused, the model must be
//   the socket's and is spliced in as the upstream names it, and every upstream id it names must be the
//   project's own (owned-ids.ts); the turn reserves its input and its `max_output_tokens`;
// - ResponsesSocketLink: each `response.created` from the upstream records the response's owner (and each `response.completed` its output items')
//   before the client sees it.
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { TokenCounts } from '../../../proto/lib/money.js';
import type { GatewayState, KeyRecord } from '../../state/key-table.js';
import { GatewayError } from '../../errors.js';
import { findDuplicateKey } from '../../request/validate-request.js';
import type { DemoResponsesProvider } from '../../proxy/providers/demo-responses.js';
import { estimateTokens } from '../../proxy/tokens.js';
import { itemIdsOf } from '../../proxy/usage/responses-usage.js';
import { rewriteChatBody, setTopLevelStrings } from '../../proxy/json-splice.js';
import type { SafetyFields } from '../../proxy/safety-fields.js';
import { unpricedInRequest } from '../../../proto/lib/reported-prices.js';
import { LocalUpstreamLink } from '../../proxy/local-link.js';
import type { UpstreamEvents, UpstreamLink } from '../../proxy/upstream-link.js';
import { estimateResponseTokens } from './responses.js';
import type { TurnRules } from '../socket-turns.js';

type Obj = Record<string, unknown>;

/** What the link needs of the Responses endpoint (responses.ts). */
export interface ResponsesSocketHooks {
  /** The ids a turn names, checked without waiting (a miss before the project's records are here: a 503 to retry). */
  checkIdsNow(key: KeyRecord, body: Record<string, unknown>, state: GatewayState): GatewayError | null;
  /** Asks for the project's owner records if this node does not hold them yet. */
  askOwners(key: KeyRecord): void;
  /** Calls `go` once this node holds the project's owner records, or its wait for them ended. */
  whenOwnersHeld(key: KeyRecord, go: () => void): void;
  pinOf(model: ModelConfig, body: Record<string, unknown>, state: GatewayState): string | undefined | GatewayError;
  recordOwnerOf(key: KeyRecord, model: ModelConfig, id: string): void;
  chainTokens(body: unknown, key: KeyRecord): number;
  noteContext(id: string, promptTokens: number, completionTokens: number): void;
}

/**
 * A client message on a Responses socket that is not passed on, as an error event (null: it may go
 * on): one that is not a JSON object with a string `type`, or any event but a create (a create is
 * checked as a turn, after admission). Nothing else goes upstream unread: another event (the beta
 * `response.steer`, say) would carry input and ids past the checks and the admission of a turn.
 */
export function responsesEventRefusal(data: Buffer, isBinary: boolean): Buffer | null {
  const ev = isBinary ? null : parseObj(data);
  if (!ev || typeof ev.type !== 'string') return errorEvent('invalid_event', 'Each message must be a JSON object with a string `type`.', null);
  if (ev.type === 'response.create') return null;
  return errorEvent('unknown_event', `This gateway takes only \`response.create\` events on a Responses socket, not '${ev.type.slice(0, 64)}'.`, 'type');
}

function errorEvent(code: string, message: string, param: string | null): Buffer {
  return Buffer.from(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', code, message, param } }));
}

/** A create on a Responses socket: checked where the upstream reads it, the model spliced in. */
export class ResponsesTurnRules implements TurnRules {
  /** One response at a time per connection: an error while a create waits is that create's. */
  readonly errorsNameTheirEvent = false;
  private readonly upstreamModel: string;

  constructor(
    private readonly hooks: ResponsesSocketHooks,
    private readonly key: KeyRecord,
    private readonly model: ModelConfig,
    private readonly state: () => GatewayState,
    private readonly safety: SafetyFields | null = null,
  ) {
    this.upstreamModel = model.provider === 'demo' ? model.id : model.upstreamModel || model.id;
    // Its turns may name the project's stored objects: their records are asked for now.
    hooks.askOwners(key);
  }

  check(ev: Obj, text: string, _data: Buffer): GatewayError | Buffer {
    const dup = findDuplicateKey(text);
    if (dup !== null) return new GatewayError('INVALID_REQUEST', `Duplicate key '${dup.slice(0, 64)}' in the event: each key may appear once.`, { param: dup.slice(0, 64) });
    if ('response' in ev) {
      return new GatewayError('INVALID_REQUEST', "Unknown parameter: 'response'. In WebSocket mode the fields of response.create stand at the top level, as in the body of POST /v1/responses.", { param: 'response' });
    }
    // A background response outlives its turn: it is followed and billed from HTTP creates only.
    if (ev.background !== undefined && ev.background !== false) {
      return new GatewayError('INVALID_REQUEST', 'Background responses are created with POST /v1/responses, not over the WebSocket.', { param: 'background' });
    }
    if (ev.model !== undefined && ev.model !== this.model.id) {
      return new GatewayError('MODEL_NOT_ALLOWED', `This socket is for the model \`${this.model.id}\` (?model= when it was opened); open another for another model.`, { param: 'model' });
    }
    // Every upstream id it names is the project's own, as over HTTP (owned-ids.ts).
    const state = this.state();
    const foreign = this.hooks.checkIdsNow(this.key, ev, state);
    if (foreign) return foreign;
    // A pooled model's socket is open to its first deployment: what lives on another is reached over HTTP (affinity.ts).
    const pin = this.hooks.pinOf(this.model, ev, state);
    if (pin instanceof GatewayError) return pin;
    if (pin !== undefined && pin !== this.model.deployments[0].id) {
      return new GatewayError('INVALID_REQUEST', `What this create names lives on another upstream deployment of model ${this.model.id} than this socket's; continue it with POST /v1/responses.`, { param: null });
    }
    // A tier or built-in tool the model has no price for, as over HTTP (validate-request.ts).
    const unpriced = unpricedInRequest(this.model, ev);
    if (unpriced) return new GatewayError('INVALID_REQUEST', unpriced.message, { param: unpriced.param });
    // The model where the upstream reads it, the rest byte for byte (json-splice.ts); whose request
    // it is for the upstream's safety systems, as over HTTP (safety-fields.ts).
    const model = JSON.stringify(this.upstreamModel);
    const safety = this.model.provider === 'demo' ? null : (this.safety?.fieldsFor(this.model, this.key, ev) ?? null);
    let out = ev.model === undefined ? text.replace('{', `{"model":${model},`) : rewriteChatBody(text, this.upstreamModel, false);
    if (out !== null && safety) out = setTopLevelStrings(out, safety, (k) => k in ev);
    return Buffer.from(out ?? JSON.stringify({ ...ev, model: this.upstreamModel, ...safety }));
  }

  // A miss before this node holds the project's records waits for them (bounded), then checks again.
  whenChecked(ev: Obj, text: string, data: Buffer, then: (checked: GatewayError | Buffer) => void): void {
    const first = this.check(ev, text, data);
    if (!(first instanceof GatewayError) || first.code !== 'OWNER_RECORDS_LOADING') return then(first);
    this.hooks.whenOwnersHeld(this.key, () => then(this.check(ev, text, data)));
  }

  // The chain's context as far as this node knows it is re-read upstream: reserved and, cut short, billed.
  estimate(ev: Obj, _pendingInput: number): number {
    return estimateResponseTokens(ev) + this.hooks.chainTokens(ev, this.key);
  }

  inputEstimate(ev: Obj, _pendingInput: number): number {
    return estimateTokens(ev) + this.hooks.chainTokens(ev, this.key);
  }

  outputFields(ev: Obj): unknown {
    return ev;
  }

  ended(responseId: string, usage: TokenCounts): void {
    this.hooks.noteContext(responseId, usage.promptTokens, usage.completionTokens);
  }
}

export class ResponsesSocketLink implements UpstreamLink {
  private outer: UpstreamEvents | null = null;

  constructor(
    private readonly inner: UpstreamLink,
    private readonly hooks: ResponsesSocketHooks,
    private readonly key: KeyRecord,
    private readonly model: ModelConfig,
  ) {}

  get events(): UpstreamEvents | null {
    return this.outer;
  }

  set events(e: UpstreamEvents | null) {
    this.outer = e;
    this.inner.events = e && {
      message: (data, isBinary) => {
        if (!isBinary && data.includes('"response.created"')) {
          const ev = parseObj(data);
          const response = ev && ev.type === 'response.created' && isObj(ev.response) ? ev.response : null;
          if (response && typeof response.id === 'string' && response.id.length > 0 && response.id.length <= 128) {
            this.hooks.recordOwnerOf(this.key, this.model, response.id);
          }
        } else if (!isBinary && data.includes('"response.completed"')) {
          // Its output items may be named by an item_reference later.
          const ev = parseObj(data);
          const response = ev && ev.type === 'response.completed' && isObj(ev.response) ? ev.response : null;
          if (response && response.store !== false) for (const id of itemIdsOf(response.output)) this.hooks.recordOwnerOf(this.key, this.model, id);
        }
        e.message(data, isBinary);
      },
      closed: (code, reason) => e.closed(code, reason),
    };
  }

  get bufferedAmount(): number {
    return this.inner.bufferedAmount;
  }

  send(data: Buffer, isBinary: boolean): void {
    this.inner.send(data, isBinary);
  }

  pause(): void {
    this.inner.pause();
  }

  resume(): void {
    this.inner.resume();
  }

  close(code: number, reason: string): void {
    this.inner.close(code, reason);
  }
}

/** The demo provider over a socket: each `response.create` answered with the demo's events. */
export class DemoResponsesSocketLink extends LocalUpstreamLink {
  constructor(
    private readonly demo: DemoResponsesProvider,
    private readonly modelId: string,
  ) {
    super(true);
  }

  send(data: Buffer): void {
    if (this.closed) return;
    const ev = parseObj(data);
    if (!ev || ev.type !== 'response.create') {
      return this.emit({ type: 'error', error: { type: 'invalid_request_error', code: 'unknown_event', message: 'The demo model handles `response.create` events only.', param: null } });
    }
    const body = ev;
    if (body.input === undefined || (typeof body.input !== 'string' && !Array.isArray(body.input))) {
      return this.emit({ type: 'error', error: { type: 'invalid_request_error', code: 'missing_required_parameter', message: "Missing required parameter: 'input'.", param: 'input' } });
    }
    for (const e of this.demo.respond(body, this.modelId).events) this.emit(e);
  }
}

function isObj(v: unknown): v is Obj {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function parseObj(data: Buffer): Obj | null {
  try {
    const v = JSON.parse(data.toString('utf8')) as unknown;
    return isObj(v) ? v : null;
  } catch {
    return null;
  }
}
