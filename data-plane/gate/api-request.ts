// One request through a node, an HTTP request or a WebSocket upgrade: created once when it arrives
// (gate.ts), and from then on the one thing every check and endpoint is handed. It carries the head
// copied out of uWS's HttpRequest (which dies when the handler returns: rule 1 of
// docs/design.md#the-uws-contract), the path family computed once, the error shape of answers before
// routing, the client IP, and, as the gate and admission fill them in, the key, the route, the
// admitted context (its key-budget ticket and money reservation) and the log entry. A class with
// fields set in one order (one hidden class), so the hot path makes one object per request and no
// closures.
import type { HttpResponse, us_socket_context_t } from 'uWebSockets.js';
import type { KeyRecord } from '../state/key-table.js';
import type { Reply } from '../request/reply.js';
import type { RequestContext } from '../request/request-context.js';
import type { LogDraft, LogHead } from '../request/request-log.js';
import type { Ticket } from '../limits/key-budgets.js';
import type { PathFamily } from '../routing/path-families.js';
import type { Route } from '../routing/routes.js';
import type { Entrance } from './entrances.js';

export class ApiRequest implements LogHead {
  // ---- The head (copied from HttpRequest before any check) ----
  method = '';
  path = '';
  query = '';
  authorization = '';
  contentType = '';
  /** The declared Content-Length; -1 when absent or not a number. */
  contentLength = -1;
  userAgent = '';
  /** Whether any credential header was presented (edge budgets count credential-less attempts apart). */
  hasCredential = false;
  /** performance.now() on arrival, for the request log's latency. */
  startedAt = 0;
  /** The client's IP (client-ip.ts: X-Forwarded-For only behind a trusted peer). */
  ip = '';
  /** Every header, for tool pass-through: copied only on the gateway-shaped paths (tools, unknown paths). */
  headers: Array<[string, string]> | null = null;
  // WebSocket upgrades only.
  wsKey = '';
  protocol = '';
  extensions = '';
  socketContext: us_socket_context_t | null = null;

  // ---- Decided once ----
  /** The path's family (routing/path-families.ts): its edge budget, body cap, shape and router. */
  family: PathFamily;

  // ---- Filled in on the way through ----
  /** The key, once the credential matched one. */
  key: KeyRecord | null = null;
  route: Route | null = null;
  /** The admitted request's context (admission.ts): its ticket, money reservation and usage. */
  ctx: RequestContext | null = null;
  /** The request's log entry, once the key is known (request-log.ts). */
  log: LogDraft | null = null;

  constructor(
    readonly entrance: Entrance,
    readonly res: HttpResponse,
    readonly reply: Reply,
    family: PathFamily,
  ) {
    this.family = family;
    // Every answer's error shape is its family's (a 401 on a mistyped chat path looks like one on chat).
    reply.shape = family.shape;
  }

  /** The key-budget ticket of an admitted request. */
  get ticket(): Ticket | null {
    return this.ctx === null ? null : this.ctx.ticket;
  }

  /** The path with its query, as a backend is sent it. */
  get pathAndQuery(): string {
    return this.query ? `${this.path}?${this.query}` : this.path;
  }
}
