// The node's HTTP server: the uWS wiring. Every request is made an ApiRequest once (gate/api-request.ts),
// taken through the order of checks by the gate (gate/gate.ts, docs/design.md#the-gate), routed, and
// handed to its endpoint family (endpoints/*.ts), which the intake admits while it reads the body as
// the route says (endpoints/intake.ts). WebSocket upgrades go through the same gate in the realtime
// gateway (realtime/gateway.ts). Nothing before the upstream call awaits, except reading a body.
// Errors are rendered only by error-shapes.ts, through Reply.
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp } from 'uWebSockets.js';
import type { StateHolder } from '../state/key-table.js';
import type { OpenStreams } from '../state/open-streams.js';
import { BackgroundFollowers } from '../endpoints/responses/background-responses.js';
import { ResponseOwners } from '../state/response-owners.js';
import { ResponsesEndpoint } from '../endpoints/responses/responses.js';
import { Intake, type Endpoint } from '../endpoints/intake.js';
import { SocketEndpoint } from '../endpoints/sockets.js';
import { Listings, StoredResponses } from '../endpoints/listings.js';
import { ModelCalls } from '../endpoints/model-calls.js';
import { Tools } from '../endpoints/tools.js';
import { Transcription } from '../endpoints/transcription.js';
import { Usage } from '../endpoints/usage.js';
import { Gate } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { BodyBudget } from '../limits/body-budget.js';
import type { Clock } from '../limits/clock.js';
import type { EdgeBudgets } from '../limits/edge-budgets.js';
import type { KeyBudgets } from '../limits/key-budgets.js';
import type { LeaseClient } from '../leases/lease-client.js';
import { DemoResponsesProvider } from '../proxy/providers/demo-responses.js';
import type { PoolRegistry } from '../proxy/providers/openai.js';
import { OpenAIResponsesProvider } from '../proxy/providers/openai-responses.js';
import type { Provider } from '../proxy/providers/provider.js';
import { ToolBackends } from '../proxy/tool-backends.js';
import { RealtimeGateway, REALTIME_OVER_HTTP, type RealtimeOptions } from '../realtime/gateway.js';
import type { RouteKind } from '../routing/routes.js';
import type { Reporter } from '../sync/reporter.js';
import type { UsageSource } from '../sync/usage-client.js';
import { Admission, type WaitStats } from '../request/admission.js';
import { logBug } from '../log.js';
import { RequestContext } from '../request/request-context.js';
import type { BodyWatch } from './request-body.js';

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
  /** Who owns each stored response (state/response-owners.ts); shared with the sync client. */
  responseOwners?: ResponseOwners;
}

export class ApiServer {
  readonly app: TemplatedApp;
  /** The order of checks, for HTTP requests and WebSocket upgrades alike. */
  readonly gate: Gate;
  /** Key budgets and money, waiting (bounded) for a lease when this node's is short. */
  private readonly admission: Admission;
  private readonly intake: Intake;
  /** Each route kind's endpoint family. */
  private readonly endpoints: Readonly<Record<RouteKind, Endpoint>>;
  /** What waiting for leases cost the requests that waited (GET /stats/lease-waits on the admin listener). */
  get leaseWaits(): WaitStats {
    return this.admission.waits;
  }

  /** The `/v1/realtime` WebSocket gateway (data-plane/realtime/). */
  readonly realtime: RealtimeGateway;
  /** The Responses API (data-plane/endpoints/responses/responses.ts). */
  readonly responses: ResponsesEndpoint;
  /** Background responses followed to their end (a Drainable: main.ts registers it). */
  readonly backgroundResponses: BackgroundFollowers;

  constructor(deps: ServerDeps) {
    this.gate = new Gate(deps);
    this.admission = new Admission(deps, (key, path, ticket, minute, requestId) => new RequestContext(deps, requestId || this.gate.nextRequestId(), key, path, ticket, minute));
    this.intake = new Intake(deps, this.admission);
    const demoResponses = new DemoResponsesProvider(() => deps.clock.now());
    const owners = deps.responseOwners ?? new ResponseOwners();
    this.backgroundResponses = new BackgroundFollowers({ holder: deps.holder, clock: deps.clock, openStreams: deps.openStreams, isStale: () => deps.isStale(), owners });
    this.responses = new ResponsesEndpoint({
      followers: this.backgroundResponses,
      clock: deps.clock,
      owners,
      providers: { demo: demoResponses, openai: new OpenAIResponsesProvider(deps.pools) },
      reportOwner: (id, projectId, model, createdAtMs) => deps.reporter.recordStoredResponse(id, projectId, model, createdAtMs),
    });
    const modelCalls = new ModelCalls(deps, this.admission, this.responses);
    const listings = new Listings(deps);
    this.endpoints = {
      chat: modelCalls,
      embeddings: modelCalls,
      speech: modelCalls,
      responses: modelCalls,
      'stored-response': new StoredResponses(deps, this.responses),
      transcriptions: new Transcription(deps),
      models: listings,
      model: listings,
      voices: listings,
      usage: new Usage(deps),
      tool: new Tools(deps.toolBackends ?? new ToolBackends()),
      realtime: REALTIME_OVER_HTTP,
    };
    this.app = uWS.App();
    this.realtime = new RealtimeGateway(deps, this.gate, this.intake, deps.realtime);
    // The socket endpoints, realtime and the Responses API's WebSocket mode: the gateway is their uWS side.
    this.realtime.endpoint = new SocketEndpoint(deps, this.admission, this.realtime, { hooks: this.responses, demo: demoResponses });
    this.realtime.register(this.app);
    this.app.any('/*', (res, req) => this.onRequest(res, req));
  }

  private onRequest(res: HttpResponse, req: HttpRequest): void {
    let r: ApiRequest | null = null;
    try {
      r = this.gate.http(res, req);
      if (!this.gate.pass(r)) return;
      const route = this.gate.route(r);
      if (route) this.intake.run(r, this.endpoints[route.kind]);
    } catch (err) {
      logBug(err);
      try {
        if (r) r.reply.sendError(err, 'gateway');
        else res.cork(() => res.writeStatus('500 Internal Server Error').end());
      } catch (e) {
        logBug(e);
      }
    }
  }
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
