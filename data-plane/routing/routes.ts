// The route table: which paths exist, which methods they take, how their body is read, and
// (for tool paths) which configured backend serves them. Built once per config version at sync time,
// never per request. Pure: no I/O.
import type { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../errors.js';
import { familyOf, type PathFamily } from './path-families.js';
import { CONVERSATION_METHODS, parseConversationPath, parseStoredResponsePath, STORED_METHODS, type ConversationAction, type StoredAction } from './responses-paths.js';
import type { ErrorShape } from '../errors.js';

export type RouteKind = 'models' | 'model' | 'chat' | 'embeddings' | 'transcriptions' | 'speech' | 'voices' | 'usage' | 'tool' | 'realtime' | 'responses' | 'stored-response' | 'conversation' | 'compact' | 'input-tokens';

/**
 * How the request body is read before the endpoint is called (endpoints/intake.ts): not at all,
 * collected whole within the path's cap and the node's body budget (JSON bodies, PDF HTML), or
 * streamed to the endpoint. A GET or HEAD reads none, whatever its route says.
 */
export type BodyMode = 'none' | 'whole' | 'stream';

export interface Route {
  kind: RouteKind;
  /** Upper-case methods accepted; null accepts every method (tool pass-through). */
  methods: ReadonlySet<string> | null;
  /** Value of the `Allow` header for a 405. */
  allow: string;
  bodyMode: BodyMode;
  /** Tool routes: the configured backend, or null when none is configured (502). */
  backend: ToolBackend | null;
}

// Path sanity is its own pure module; re-exported here, where the pipeline looks paths up.

/**
 * The error shape of a path's family, decided before routing: a 401 on `/v1/chat/completionz` looks
 * like a 401 on `/v1/chat/completions`, so an unauthenticated caller learns nothing about which paths exist.
 */
export function shapeOf(path: string): ErrorShape {
  return familyOf(path).shape;
}

function modelRoute(kind: RouteKind, method: string, bodyMode: BodyMode): Route {
  return { kind, methods: new Set([method]), allow: method, bodyMode, backend: null };
}

/** The one path that accepts realtime sessions (OpenAI's: `wss://…/v1/realtime?model=…`). */
export const REALTIME_PATH = '/v1/realtime';
/** The Responses API's WebSocket mode (endpoints/responses/responses-socket.ts). */
export const RESPONSES_SOCKET_PATH = '/v1/responses';

/** The routes of WebSocket upgrades (gate.ts): uWS hands the gate only upgrades under these paths. */
export const SOCKET_ROUTES: ReadonlyMap<string, Route> = new Map<string, Route>([
  [REALTIME_PATH, { kind: 'realtime', methods: new Set(['GET']), allow: 'GET', bodyMode: 'none', backend: null }],
  [RESPONSES_SOCKET_PATH, { kind: 'responses', methods: new Set(['GET']), allow: 'GET', bodyMode: 'none', backend: null }],
]);

/** The stored-response paths' routes (responses-paths.ts), built once. */
function storedRoute(action: StoredAction): Route {
  const allow = STORED_METHODS[action];
  return { kind: 'stored-response', methods: new Set(allow), allow: allow.join(', '), bodyMode: 'none', backend: null };
}
const STORED_ROUTES: Readonly<Record<StoredAction, Route>> = { response: storedRoute('response'), input_items: storedRoute('input_items'), cancel: storedRoute('cancel') };
/** The Conversations API's routes (JSON bodies read whole on POST), built once. */
function conversationRoute(action: ConversationAction): Route {
  const allow = CONVERSATION_METHODS[action];
  return { kind: 'conversation', methods: new Set(allow), allow: allow.join(', '), bodyMode: 'whole', backend: null };
}
const CONVERSATION_ROUTES: Readonly<Record<ConversationAction, Route>> = {
  create: conversationRoute('create'),
  conversation: conversationRoute('conversation'),
  items: conversationRoute('items'),
  item: conversationRoute('item'),
};

export class RouteTable {
  private readonly exact = new Map<string, Route>();
  /** Configured backends, longest prefix first. */
  private readonly backends: ToolBackend[];
  private readonly toolRoutes = new Map<string, Route>();
  /** The same for `/v1/pdf*`, whose bodies are read whole (PDF remote references: pdf-guard.ts). */
  private readonly pdfRoutes = new Map<string, Route>();
  /** `GET /v1/models/{id}` (the OpenAI SDK's models.retrieve). */
  private readonly model: Route = modelRoute('model', 'GET', 'none');
  private readonly realtime: Route = { kind: 'realtime', methods: null, allow: 'GET', bodyMode: 'none', backend: null };

  constructor(toolBackends: readonly ToolBackend[]) {
    this.exact.set('/v1/models', modelRoute('models', 'GET', 'none'));
    this.exact.set('/v1/chat/completions', modelRoute('chat', 'POST', 'whole'));
    this.exact.set('/v1/embeddings', modelRoute('embeddings', 'POST', 'whole'));
    this.exact.set('/v1/audio/transcriptions', modelRoute('transcriptions', 'POST', 'stream'));
    this.exact.set('/v1/audio/speech', modelRoute('speech', 'POST', 'whole'));
    this.exact.set('/v1/audio/voices', modelRoute('voices', 'GET', 'none'));
    this.exact.set('/v1/usage', modelRoute('usage', 'GET', 'none'));
    this.exact.set('/v1/responses', modelRoute('responses', 'POST', 'whole'));
    this.exact.set('/v1/responses/compact', modelRoute('compact', 'POST', 'whole'));
    this.exact.set('/v1/responses/input_tokens', modelRoute('input-tokens', 'POST', 'whole'));
    this.backends = [...toolBackends].sort((a, b) => b.prefix.length - a.prefix.length);
    // One Route object per backend (and one for "no backend"), so matching allocates nothing.
    for (const b of [null, ...this.backends]) {
      this.toolRoutes.set(b?.prefix ?? '', { kind: 'tool', methods: null, allow: '', bodyMode: 'stream', backend: b });
      this.pdfRoutes.set(b?.prefix ?? '', { kind: 'tool', methods: null, allow: '', bodyMode: 'whole', backend: b });
    }
  }

  /** The route for a sane path, or the 404/405 error to answer (only after authentication); `family`: the path's, if known. */
  match(path: string, method: string, family: PathFamily = familyOf(path)): Route | GatewayError {
    const r = this.exact.get(path);
    if (r) {
      if (r.methods && !r.methods.has(method)) {
        return new GatewayError('METHOD_NOT_ALLOWED', `Method ${method} is not allowed on ${path}; use ${r.allow}.`, { allow: r.allow });
      }
      return r;
    }
    // One model by id: a single segment under /v1/models.
    if (path.startsWith('/v1/models/') && path.length > 11 && path.indexOf('/', 11) === -1) {
      if (method !== 'GET') return new GatewayError('METHOD_NOT_ALLOWED', `Method ${method} is not allowed on ${path}; use GET.`, { allow: 'GET' });
      return this.model;
    }
    // A stored response (`/v1/responses/{id}`, `…/input_items`, `…/cancel`): responses-paths.ts.
    const stored = parseStoredResponsePath(path);
    if (stored) {
      const route = STORED_ROUTES[stored.action];
      if (route.methods!.has(method)) return route;
      return new GatewayError('METHOD_NOT_ALLOWED', `Method ${method} is not allowed on ${path}; use ${route.allow}.`, { allow: route.allow });
    }
    const conv = family.name === 'conversations' ? parseConversationPath(path) : null;
    if (conv) {
      const route = CONVERSATION_ROUTES[conv.action];
      if (route.methods!.has(method)) return route;
      return new GatewayError('METHOD_NOT_ALLOWED', `Method ${method} is not allowed on ${path}; use ${route.allow}.`, { allow: route.allow });
    }
    // Which part of the router serves a path is its family's, as for edge budgets and body caps.
    const router = family.router;
    if (router === 'realtime') return this.realtime;
    if (router === 'tool') {
      const routes = family.name === 'pdf' ? this.pdfRoutes : this.toolRoutes;
      for (const b of this.backends) {
        if (path.startsWith(b.prefix)) return routes.get(b.prefix)!;
      }
      return routes.get('')!;
    }
    return new GatewayError('NOT_FOUND', `No route for ${path}.`);
  }
}
