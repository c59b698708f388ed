// The Responses API's WebSocket mode (`/v1/responses` upgraded, `?model=MODEL`): the client sends
// `response.create` events and gets each response's events back. The session around it is realtime's
// (realtime/gateway.ts checks everything before the upgrade, realtime/session.ts relays with
// backpressure, holds one parallel slot while open, bills every final event — `response.completed`,
// `response.incomplete`, `response.failed` — and closes on revocation, exhaustion and drain). What
// differs is here, as an UpstreamLink around the real one:
// - each client `response.create` is checked before it goes on: its model must be the session's (it is
//   replaced by the upstream's name), and its `previous_response_id` must be the project's own;
// - each `response.created` from the upstream records the response's owner before the client sees it.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState, KeyRecord } from '../auth/key-table.js';
import { findDuplicateKey } from '../http/validate-request.js';
import type { DemoResponsesProvider } from '../proxy/providers/demo-responses.js';
import { LocalUpstreamLink } from '../realtime/local-link.js';
import type { UpstreamEvents, UpstreamLink } from '../realtime/upstream-link.js';

export { RESPONSES_SOCKET_PATH as RESPONSES_PATH } from '../routing/routes.js';

type Obj = Record<string, unknown>;

/** What the link needs of the Responses endpoint (responses.ts). */
export interface ResponsesSocketHooks {
  checkPreviousId(key: KeyRecord, id: string, state: GatewayState): boolean;
  recordOwnerOf(key: KeyRecord, model: ModelConfig, id: string): void;
}

function errorEvent(code: string, message: string, param: string | null): Buffer {
  return Buffer.from(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', code, message, param } }));
}

export class ResponsesSocketLink implements UpstreamLink {
  private outer: UpstreamEvents | null = null;
  private readonly upstreamModel: string;

  constructor(
    private readonly inner: UpstreamLink,
    private readonly hooks: ResponsesSocketHooks,
    private readonly key: KeyRecord,
    private readonly model: ModelConfig,
    private readonly state: () => GatewayState,
  ) {
    this.upstreamModel = model.provider === 'demo' ? model.id : model.upstreamModel || model.id;
  }

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
    const ev = isBinary ? null : parseObj(data);
    if (!ev || typeof ev.type !== 'string') return this.answer(errorEvent('invalid_event', 'Each message must be a JSON object with a string `type`.', null));
    const dup = findDuplicateKey(data.toString('utf8'));
    if (dup !== null) return this.answer(errorEvent('invalid_event', `Duplicate key '${dup}' in the event: each key may appear once.`, dup));
    if (ev.type !== 'response.create') return this.inner.send(data, false);
    // The fields may stand at the top level or under `response`.
    const fields = isObj(ev.response) ? ev.response : ev;
    if (fields.model !== undefined && fields.model !== this.model.id) {
      return this.answer(errorEvent('model_not_allowed', `This socket is for the model \`${this.model.id}\` (?model= when it was opened); open another for another model.`, 'model'));
    }
    const prev = fields.previous_response_id;
    if (prev !== undefined && prev !== null && (typeof prev !== 'string' || !this.hooks.checkPreviousId(this.key, prev, this.state()))) {
      return this.answer(errorEvent('previous_response_not_found', `No response found with id '${String(prev).slice(0, 128)}'.`, 'previous_response_id'));
    }
    fields.model = this.upstreamModel;
    this.inner.send(Buffer.from(JSON.stringify(ev)), false);
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

  /** An answer of the gateway's own to the client, on a later tick (never from inside its send). */
  private answer(data: Buffer): void {
    setImmediate(() => this.outer?.message(data, false));
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
    const body = isObj(ev.response) ? ev.response : ev;
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
