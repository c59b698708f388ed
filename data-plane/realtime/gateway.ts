// The uWS wiring of the two WebSocket endpoints, `/v1/realtime` and the Responses API's WebSocket
// mode on `/v1/responses`. Every check runs in uWS's `upgrade` handler before the socket is accepted:
// the same gate as HTTP requests (gate/gate.ts; the differences are declared in gate/entrances.ts:
// readiness, drain, session memory, edge IP budgets of 60 attempts per minute per IP plus the general
// /v1 budget, path sanity, a key offered as a subprotocol, the credential, stale, blocked, money, the
// route), then the same intake as every endpoint (endpoints/intake.ts: the attempt is one request of
// rpm, and holds a parallel slot while the socket is open), then the socket endpoint
// (endpoints/sockets.ts: `?model=`, the scope, the upstream's handshake). Refusals are plain HTTP
// answers with the key's rate headers. Only then is the client upgraded here, and its session started.
import { RealtimeMemory } from './realtime-memory.js';
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp, type us_socket_context_t, type WebSocketBehavior } from 'uWebSockets.js';
import type { RealtimeUpstream } from '../../proto/gen/tollgate/v1/sync.js';
import type { StateHolder } from '../state/key-table.js';
import { GatewayError } from '../errors.js';
import type { Endpoint, Intake } from '../endpoints/intake.js';
import type { SocketPlan, SocketOpener } from '../endpoints/sockets.js';
import type { Gate } from '../gate/gate.js';
import type { ApiRequest } from '../gate/api-request.js';
import { logBug } from '../log.js';
import { type KeyBudgets } from '../limits/key-budgets.js';
import { writeRateHeaders } from '../limits/rate-headers.js';
import type { LeaseClient } from '../leases/lease-client.js';
import type { Clock } from '../limits/clock.js';
import { REALTIME_PATH, RESPONSES_SOCKET_PATH as RESPONSES_PATH } from '../routing/routes.js';
import type { OpenStreams } from '../state/open-streams.js';
import { RealtimeSession, type UserData } from './session.js';
import { CLOSE } from '../endpoints/close-codes.js';
import { RealtimeStats } from './realtime-stats.js';
import type { SessionLogSink } from './session-log.js';
import type { UpstreamLink } from '../proxy/upstream-link.js';
import { connectWsUpstream } from './ws-upstream.js';
import { CorkAnchor } from './cork-anchor.js';

export const DEFAULT_MAX_BUFFERED_BYTES = 1024 * 1024;
export const DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024;
/** Seconds without any frame from the client (uWS pings it automatically before that). */
export const IDLE_TIMEOUT_SEC = 120;
const REMEASURE_MS = 1000;
const DEFAULT_MAX_NODE_BUFFERED_BYTES = 256 * 1024 * 1024;

export interface RealtimeDeps {
  holder: StateHolder;
  clock: Clock;
  keyBudgets: KeyBudgets;
  leases?: LeaseClient;
  isStale(): boolean;
  /** What keys have open (state/open-streams.ts): every session registers there until it closes. */
  openStreams?: OpenStreams;
}

/** `/v1/realtime` asked without an upgrade: not a request the HTTP endpoints serve (answered before admission). */
export const REALTIME_OVER_HTTP: Endpoint = {
  discardsRefusedStream: false,
  before(r: ApiRequest): boolean {
    r.reply.sendError(new GatewayError('INVALID_REQUEST', `${REALTIME_PATH} accepts WebSocket connections only: GET with "Upgrade: websocket" and ?model=MODEL.`, { param: null }));
    return false;
  },
  bodyCap: (r) => r.family.bodyCapBytes,
  serve() {},
};

export interface RealtimeOptions {
  /** Bytes held for one client before its upstream is paused (default 1 MiB). */
  maxBufferedBytes?: number;
  /** Largest message either way (default 8 MiB). */
  maxMessageBytes?: number;
  /** Bytes all sessions together may hold before new ones are refused and upstreams paused (default 256 MiB). */
  maxNodeBufferedBytes?: number;
  /** THE seam for each session's request-log entry (session-log.ts). */
  logSession?: SessionLogSink;
}

export class RealtimeGateway implements SocketOpener {
  /** Open sessions (the drain ends them; revocation, blocking and staleness reach them through deps.openStreams). */
  readonly sessions = new Set<RealtimeSession>();
  readonly stats = new RealtimeStats();
  /** What every session holds together, bounded node-wide (realtime-memory.ts). */
  readonly memory: RealtimeMemory;
  private readonly maxBufferedBytes: number;
  private readonly maxMessageBytes: number;
  private readonly logSession: SessionLogSink;
  private remeasureTimer: NodeJS.Timeout | null = null;
  /** The socket endpoints after admission (endpoints/sockets.ts); set by the HTTP server. */
  endpoint: Endpoint | null = null;
  /** Held from `register` on: what an upgrade after the upstream opened runs under (cork-anchor.ts). */
  anchor: CorkAnchor | null = null;

  constructor(
    private readonly deps: RealtimeDeps,
    private readonly gate: Gate,
    private readonly intake: Intake,
    opts: RealtimeOptions = {},
  ) {
    this.maxBufferedBytes = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.memory = new RealtimeMemory(opts.maxNodeBufferedBytes ?? DEFAULT_MAX_NODE_BUFFERED_BYTES);
    this.stats.memory = this.memory;
    this.logSession = opts.logSession ?? (() => {});
    gate.sessionMemory = this.memory;
  }

  /** Registers the WebSocket routes (before the app's catch-all HTTP route). */
  register(app: TemplatedApp): void {
    const behavior: WebSocketBehavior<UserData> = {
      maxPayloadLength: this.maxMessageBytes,
      // Above the pause threshold by a message and a socket read, so uWS itself never drops one.
      maxBackpressure: this.maxBufferedBytes + 2 * this.maxMessageBytes + 256 * 1024,
      closeOnBackpressureLimit: 0,
      idleTimeout: IDLE_TIMEOUT_SEC,
      sendPingsAutomatically: true,
      // No compression: client-send.ts sets uWS's compress flag on every message only to avoid a
      // broken write path, and relies on this to keep the bytes uncompressed.
      compression: uWS.DISABLED,
      upgrade: (res, req, context) => this.onUpgrade(res, req, context),
      // Inside the upgrade's cork: the socket is kept, the session starts after it (see `upgrade`).
      open: (ws) => guard(() => ws.getUserData().session.attach(ws)),
      // The message buffer dies when the handler returns: copied (Buffer.from of a view copies).
      message: (ws, msg, isBinary) => guard(() => ws.getUserData().session.fromClient(Buffer.from(new Uint8Array(msg)), isBinary)),
      drain: (ws) => guard(() => ws.getUserData().session.drained()),
      close: (ws, code, msg) => guard(() => ws.getUserData().session.clientClosed(code, Buffer.from(msg).toString('utf8'))),
    };
    // A plain GET (no Sec-WebSocket-Key) falls through to the HTTP pipeline (uWS yields it).
    app.ws(REALTIME_PATH, behavior);
    app.ws(`${REALTIME_PATH}/*`, behavior);
    app.ws(RESPONSES_PATH, behavior);
    this.anchor = new CorkAnchor();
    this.remeasureTimer = setInterval(() => {
      this.memory.remeasureAll();
    }, REMEASURE_MS);
    this.remeasureTimer.unref();
  }

  /** Open sessions (the drain waits for them). */
  get open(): number {
    return this.sessions.size;
  }

  /** Lets go of the cork anchor (its socket would keep a process alive that does not exit itself). */
  stop(): void {
    this.anchor?.stop();
    if (this.remeasureTimer) clearInterval(this.remeasureTimer);
  }

  /** A stopping node ends every session with 1001; answers how many it closed. */
  closeAll(reason: string): number {
    const open = [...this.sessions];
    for (const s of open) s.close(CLOSE.GOING_AWAY, reason);
    return open.length;
  }

  private onUpgrade(res: HttpResponse, req: HttpRequest, context: us_socket_context_t): void {
    let r: ApiRequest | null = null;
    try {
      r = this.gate.upgrade(res, req, context);
      if (!this.gate.pass(r) || !this.gate.route(r)) return;
      // The socket endpoints are served by the intake, as every endpoint is (endpoints/sockets.ts).
      this.intake.run(r, this.endpoint!);
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

  /** SocketOpener: a WebSocket to the upstream, within this node's message limit. */
  connect(up: RealtimeUpstream, upstreamModel: string, opened: (link: UpstreamLink) => void, failed: (err: Error) => void): { cancel(): void } {
    return connectWsUpstream(up, upstreamModel, { maxMessageBytes: this.maxMessageBytes }, opened, (err) => guard(() => failed(err)));
  }

  /**
   * SocketOpener: upgrades the client (with the rate headers on the 101), then starts the session.
   * Inside the upgrade handler (a demo model) the response is corked by uWS already. After the
   * upstream opened, the response's own `cork` would read, after its callback, the state the upgrade
   * shrank (uNetworking/uWebSockets pull request 1929): the upgrade runs while the cork anchor is
   * corked instead, so the client's `cork` only runs its callback (cork-anchor.ts). Nothing of the
   * session runs inside either (uWS's `open` only keeps the socket): the session starts after.
   * test/unit/data-plane-realtime-upgrade.test.ts.
   */
  upgrade(r: ApiRequest, plan: SocketPlan): void {
    const reply = r.reply;
    const res = r.res;
    const session = new RealtimeSession(
      {
        clock: this.deps.clock,
        keyBudgets: this.deps.keyBudgets,
        leases: this.deps.leases,
        turns: plan.turns,
        eventRefusal: plan.eventRefusal,
        openStreams: this.deps.openStreams,
        sessions: this.sessions,
        logSession: this.logSession,
        maxBufferedBytes: this.maxBufferedBytes,
        maxMessageBytes: this.maxMessageBytes,
        stats: this.stats,
        memory: this.memory,
        responsesApi: plan.responsesApi,
      },
      r.ctx!,
      r.key!,
      plan.model,
      plan.link,
      r.path,
      { clientIp: r.ip, userAgent: r.userAgent },
    );
    const headers = reply.extraHeaders;
    const rate = reply.rateHeaders;
    const requestId = reply.requestId;
    reply.markUpgraded();
    // The status and our headers in one cork of the response, still HTTP (one write); then the upgrade,
    // whose few headers go out as uWS writes them when no cork of the response is open.
    res.cork(() => {
      res.writeStatus('101 Switching Protocols');
      if (headers) for (const [k, v] of headers) res.writeHeader(k, v);
      if (rate) writeRateHeaders(rate, res);
      if (requestId) res.writeHeader('x-request-id', requestId);
    });
    const upgrade = (): void => {
      res.cork(() => res.upgrade<UserData>({ session }, r.wsKey, firstProtocol(r.protocol), r.extensions, r.socketContext!));
    };
    if (this.anchor) this.anchor.run(upgrade);
    else upgrade();
    guard(() => session.start());
  }
}

function guard(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    logBug(e);
  }
}

/** The subprotocol answered: the client's first offer, if it made any (ws clients insist on one then). */
function firstProtocol(protocolHeader: string): string {
  return protocolHeader.split(',')[0]?.trim() ?? '';
}
