// Tool endpoints, kept minimal for now: a request under a tool prefix with a configured backend is
// passed through unchanged (method, path, query, body streamed; the gateway's own credential headers
// and every client-sent forwarding header removed, one X-Forwarded-For with the client's address
// added), and the backend's answer is passed back unchanged (Shape C). No backend configured, or one
// that cannot be reached: 502 Shape B `upstream_unreachable`.
import type { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import type { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';
import type { Reply } from '../http/reply.js';
import type { PoolRegistry } from './providers/openai.js';
import { proxyRequest } from './stream-proxy.js';

const DROP_REQUEST_HEADERS = new Set([
  'authorization',
  'x-api-key',
  'api-key',
  'host',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'content-length',
  'te',
  'trailer',
  'upgrade',
  'proxy-authorization',
  'expect',
  // What a client says about its own address; the backend gets one X-Forwarded-For from us instead.
  'x-forwarded-for',
  'forwarded',
  'x-real-ip',
  'x-client-ip',
  'true-client-ip',
]);

export interface ToolRequest {
  backend: ToolBackend;
  method: string;
  /** Path and query as the client sent them. */
  pathAndQuery: string;
  /** Request headers as [name, value] pairs, copied in the handler. */
  headers: Array<[string, string]>;
  body: Readable | null;
  reply: Reply;
  /** The client's address as the node determined it (http/client-ip.ts): the one X-Forwarded-For sent. */
  clientIp: string;
  onAbort(fn: () => void): void;
  onDone(status: number): void;
}

export function forwardTool(pools: PoolRegistry, req: ToolRequest): void {
  const url = new URL(req.backend.baseUrl);
  const headers: string[] = [];
  for (const [k, v] of req.headers) if (!DROP_REQUEST_HEADERS.has(k)) headers.push(k, v);
  headers.push('x-forwarded-for', req.clientIp);
  const basePath = url.pathname.replace(/\/+$/, '');
  proxyRequest({
    pool: pools.get(url.origin),
    method: req.method as Dispatcher.HttpMethod,
    path: basePath + req.pathAndQuery,
    headers,
    body: req.body,
    timeoutMs: req.backend.timeoutMs > 0 ? req.backend.timeoutMs : 30_000,
    reply: req.reply,
    shape: 'B',
    passAllHeaders: true,
    onAbort: req.onAbort,
    onDone: (status) => req.onDone(status),
  });
}
