// The two socket endpoints after the gate, served by the intake as any endpoint is (intake.ts: the
// upgrade is admitted as one request, and holds the key's parallel slot while the socket is open):
// `/v1/realtime?model=MODEL` and the Responses API's WebSocket mode on `/v1/responses?model=MODEL`.
// Here, after admission: `?model=` (missing, unknown, or not of the endpoint's kind: 400), the model
// scope (401), the upstream (the demo model, or a WebSocket to the configured upstream: refused or
// unreachable, 502), and, once the upstream is open, whether the key may still open it (revoked,
// blocked, stale or out of scope meanwhile). Refusals after admission follow the one rule
// (`refuseAdmitted`). The uWS upgrade itself, and the session, are realtime/'s (`SocketOpener`); each
// turn on the open socket is a request (socket-turns.ts).
import type { ModelConfig, RealtimeUpstream } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyRecord, StateHolder } from '../state/key-table.js';
import { GatewayError, orgBlockedMessage } from '../errors.js';
import { checkModelScope } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { Admission } from '../request/admission.js';
import { logBug } from '../log.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import { DemoRealtimeLink } from '../proxy/providers/demo-realtime.js';
import type { DemoResponsesProvider } from '../proxy/providers/demo-responses.js';
import type { UpstreamLink } from '../proxy/upstream-link.js';
import { CLOSE } from './close-codes.js';
import { REALTIME_PATH, RESPONSES_SOCKET_PATH } from '../routing/routes.js';
import { PlainEndpoint, refuseAdmitted } from './intake.js';
import { RealtimeTurnRules } from './realtime-turns.js';
import type { SafetyFields } from '../proxy/safety-fields.js';
import { DemoResponsesSocketLink, ResponsesSocketLink, ResponsesTurnRules, responsesEventRefusal, type ResponsesSocketHooks } from './responses/responses-socket.js';
import { SocketTurns, type TurnRules, type TurnSocket } from './socket-turns.js';

/** What a socket endpoint hands the session it opens. */
export interface SocketPlan {
  model: ModelConfig;
  link: UpstreamLink;
  /** The session's turns, admitted and billed as requests. */
  turns(socket: TurnSocket): SocketTurns;
  /** A client message the endpoint does not pass on, as an error event (the Responses API's). */
  eventRefusal?: (data: Buffer, isBinary: boolean) => Buffer | null;
  /** The Responses API's WebSocket mode: each response is billed on its final event. */
  responsesApi: boolean;
}

/** The uWS side (realtime/gateway.ts): the upstream socket, and the client's upgrade into a session. */
export interface SocketOpener {
  /** Opens a WebSocket to an upstream: the link once open, or why not. */
  connect(up: RealtimeUpstream, upstreamModel: string, opened: (link: UpstreamLink) => void, failed: (err: Error) => void): { cancel(): void };
  /** Upgrades the client (the 101 with the rate headers) and starts its session. */
  upgrade(r: ApiRequest, plan: SocketPlan): void;
}

export interface SocketEndpointDeps {
  holder: StateHolder;
  keyBudgets: KeyBudgets;
  isStale(): boolean;
}

export class SocketEndpoint extends PlainEndpoint {
  constructor(
    private readonly deps: SocketEndpointDeps,
    private readonly admission: Admission,
    private readonly opener: SocketOpener,
    private readonly responses: { hooks: ResponsesSocketHooks; demo: DemoResponsesProvider; safety?: SafetyFields },
  ) {
    super();
  }

  serve(r: ApiRequest): void {
    const ctx = r.ctx!;
    const key = r.key!;
    const refuse = (err: GatewayError) => refuseAdmitted(ctx, r.reply, err, false, this.deps.keyBudgets);
    const state = this.deps.holder.current;
    const modelId = new URLSearchParams(r.query).get('model') ?? '';
    if (!modelId) return refuse(new GatewayError('INVALID_REQUEST', `Missing required query parameter: model (connect to ${r.path}?model=MODEL).`, { param: 'model' }));
    const model = state.view.models.get(modelId);
    if (!model) return refuse(new GatewayError('UNKNOWN_MODEL', `The model \`${modelId}\` does not exist.`, { param: 'model' }));
    const responsesApi = r.path === RESPONSES_SOCKET_PATH;
    const kind = responsesApi ? 'chat' : 'realtime';
    if (model.kind !== kind) return refuse(new GatewayError('INVALID_REQUEST', `The model \`${model.id}\` is not a ${kind} model; ${responsesApi ? RESPONSES_SOCKET_PATH : REALTIME_PATH} needs one.`, { param: 'model' }));
    const scope = checkModelScope(state, key, model);
    if (scope) return refuse(scope);
    const rules: TurnRules = responsesApi ? new ResponsesTurnRules(this.responses.hooks, key, model, () => this.deps.holder.current, this.responses.safety ?? null) : new RealtimeTurnRules();
    const plan = (link: UpstreamLink): SocketPlan => ({
      model,
      link: responsesApi ? new ResponsesSocketLink(link, this.responses.hooks, key, model) : link,
      turns: (socket) => new SocketTurns({ admission: this.admission, keyBudgets: this.deps.keyBudgets }, socket, rules, key, model, r.path, ctx.requestId),
      eventRefusal: responsesApi ? responsesEventRefusal : undefined,
      responsesApi,
    });
    if (model.provider === 'demo') return this.open(r, plan(responsesApi ? new DemoResponsesSocketLink(this.responses.demo, model.id) : new DemoRealtimeLink(model)));
    const upstream = responsesApi ? responsesUpstream(model) : state.view.config.realtimeUpstreams.find((u) => u.model === model.id);
    if (model.provider !== 'openai' || !upstream) return refuse(new GatewayError('UPSTREAM_UNREACHABLE', `No ${responsesApi ? 'Responses' : 'realtime'} upstream is configured for \`${model.id}\`.`));
    const pending = this.opener.connect(
      upstream,
      model.upstreamModel || model.id,
      (link) => this.open(r, plan(link)),
      (err) => {
        try {
          // The upstream was tried: the attempt counts (as an HTTP call an upstream failed does).
          ctx.providerStarted = true;
          ctx.complete({ status: 502, promptTokens: 0, completionTokens: 0 });
          r.reply.sendError(new GatewayError('UPSTREAM_UNREACHABLE', err.message));
        } catch (e) {
          logBug(e);
        }
      },
    );
    ctx.abortFns.push(() => pending.cancel());
  }

  /** The upstream is open: the client is upgraded, unless it left or its key changed meanwhile. */
  private open(r: ApiRequest, plan: SocketPlan): void {
    const ctx = r.ctx!;
    const reply = r.reply;
    const key = r.key!;
    if (reply.done) {
      // The client left while the upstream was being opened: the context was settled by the abort.
      plan.link.close(CLOSE.GOING_AWAY, 'client went away');
      return;
    }
    // The key, its organisation or its scope may have changed while the upstream was being opened (a
    // revocation acknowledged meanwhile must not be followed by a new session).
    const changed = this.changedSinceAdmission(key, plan.model);
    if (changed) {
      plan.link.close(CLOSE.GOING_AWAY, 'the client was refused');
      ctx.refuse();
      // A revoked key is unknown again: no rate headers, as for any unknown key.
      reply.rateHeaders = changed.code === 'KEY_INVALID' ? null : this.deps.keyBudgets.headers(key.limits);
      reply.sendError(changed);
      return;
    }
    try {
      ctx.providerStarted = true;
      this.opener.upgrade(r, plan);
    } catch (e) {
      // Called from a ws event too: nothing may escape. The session never opened: release its slot.
      logBug(e);
      plan.link.close(CLOSE.INTERNAL, 'gateway error');
      ctx.complete({ status: 500, promptTokens: 0, completionTokens: 0 });
      if (!reply.done) reply.sendError(e);
    }
  }

  /** Why a key admitted before the upstream handshake may no longer open its session, or null. */
  private changedSinceAdmission(key: KeyRecord, model: ModelConfig): GatewayError | null {
    const state = this.deps.holder.current;
    const now = state.keysByHash.get(key.keyHash);
    if (!now) return new GatewayError('KEY_INVALID', 'This API key was revoked while the session was being opened.');
    if (this.deps.isStale()) return new GatewayError('KEY_STALE');
    if (now.org.blocked) return new GatewayError('ORG_BLOCKED', orgBlockedMessage(now.org.blockedReason));
    if (!state.mayUseModel(now, model.id)) return new GatewayError('MODEL_NOT_ALLOWED', `This API key may no longer use the model \`${model.id}\`.`, { param: 'model' });
    return null;
  }
}

/** A chat model's Responses API over a WebSocket: `ws(s)://` + `{base_url}/responses`. */
function responsesUpstream(model: ModelConfig): RealtimeUpstream | undefined {
  if (!model.baseUrl) return undefined;
  const url = new URL(model.baseUrl);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.pathname = `${url.pathname.replace(/\/+$/, '')}/responses`;
  return { model: model.id, url: url.toString(), upstreamApiKey: model.upstreamApiKey, upstreamModel: model.upstreamModel || model.id, connectTimeoutMs: 0 };
}
