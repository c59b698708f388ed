// The node's HTTP server: the uWS wiring. Every request is made an ApiRequest once (gate/api-request.ts),
// taken through the order of checks by the gate (gate/gate.ts, docs/design.md#the-gate), routed, and
// handed to its endpoint family (endpoints/*.ts), which the intake admits while it reads the body as
// the route says (endpoints/intake.ts). WebSocket upgrades go through the same gate in the realtime
// gateway (realtime/gateway.ts). Nothing before the upstream call awaits, except reading a body.
// Errors are rendered only by error-shapes.ts, through Reply. main.ts builds the parts; this file
// only wires them to uWS.
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp } from 'uWebSockets.js';
import type { Endpoint, Intake } from '../endpoints/intake.js';
import type { Gate } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import type { RealtimeGateway } from '../realtime/gateway.js';
import type { RouteKind } from '../routing/routes.js';
import { logBug } from '../log.js';

/** What the server wires, built by main.ts. */
export interface ApiParts {
  /** The order of checks, for HTTP requests and WebSocket upgrades alike. */
  gate: Gate;
  /** Admits each request while its body is read, and hands it to its endpoint family. */
  intake: Intake;
  /** Each route kind's endpoint family. */
  endpoints: Readonly<Record<RouteKind, Endpoint>>;
  /** The WebSocket upgrades (`/v1/realtime`, the Responses API's WebSocket mode). */
  sockets: RealtimeGateway;
}

export class ApiServer {
  readonly app: TemplatedApp;
  private readonly gate: Gate;
  private readonly intake: Intake;
  private readonly endpoints: Readonly<Record<RouteKind, Endpoint>>;

  constructor(parts: ApiParts) {
    this.gate = parts.gate;
    this.intake = parts.intake;
    this.endpoints = parts.endpoints;
    this.app = uWS.App();
    parts.sockets.register(this.app);
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
        if (r) r.reply.sendError(err);
        else res.cork(() => res.writeStatus('500 Internal Server Error').end());
      } catch (e) {
        logBug(e);
      }
    }
  }
}

/** uSockets' LIBUS_LISTEN_EXCLUSIVE_PORT: without it a fixed port is bound with SO_REUSEPORT. */
const EXCLUSIVE_PORT = 1;

/** `listen(host, port, options, cb)`: in uWS.js at run time, missing from its type declarations. */
type ListenWithOptions = (host: string, port: number, options: number, cb: (socket: uWS.us_listen_socket | false) => void) => TemplatedApp;

/**
 * Listens and resolves with the bound port; rejects if the address cannot be bound. The port is the
 * node's alone: by default uWS binds a fixed port with SO_REUSEPORT, and a second node started on it
 * would listen too, the kernel splitting new connections between them.
 */
export function listen(app: TemplatedApp, host: string, port: number): Promise<{ socket: uWS.us_listen_socket; port: number }> {
  return new Promise((resolve, reject) => {
    (app.listen as unknown as ListenWithOptions).call(app, host, port, EXCLUSIVE_PORT, (socket) => {
      if (!socket) reject(new Error(`cannot listen on ${host}:${port}`));
      else resolve({ socket, port: uWS.us_socket_local_port(socket as unknown as uWS.us_socket) });
    });
  });
}
