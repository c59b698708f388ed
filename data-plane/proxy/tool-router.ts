// Tool endpoints: a request under a tool prefix goes to one of the prefix's backends, unchanged
// (method, path, query, body streamed as it arrives), minus hop-by-hop headers, the client's
// credentials and every client-sent forwarding header, plus one X-Forwarded-For with the client's
// address, a request id and the caller's key, project and organisation ids. The backend's answer, any
// status, is passed back unchanged and streamed with backpressure (Shape C). A backend that refuses
// the connection or cannot be connected in time is skipped for a while (tool-backends.ts); while no
// byte of the body has been sent, the request moves on to the prefix's next backend. Failing all:
// 502 Shape B `upstream_unreachable`, never naming a backend.
import type { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import type { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';
import type { ResponseSink } from './response-sink.js';
import { proxyRequest } from './stream-proxy.js';
import { connectionNames } from './upstream-headers.js';
import type { ToolBackends, Upstream } from './tool-backends.js';

const DROP_REQUEST_HEADERS = new Set([
  'authorization',
  'x-api-key',
  'api-key',
  'host',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authorization',
  'proxy-connection',
  'expect',
  // What a client says about its own address, or about the host, scheme and path a backend should
  // believe it was reached by; the backend gets one X-Forwarded-For from us instead. (Every
  // `x-forwarded-*` header is dropped by its prefix below.)
  'forwarded',
  'x-original-url',
  'x-rewrite-url',
  'x-original-host',
  'x-real-ip',
  'x-client-ip',
  'true-client-ip',
  // Ours: a client must not be able to claim another caller's identity or request id.
  'x-request-id',
]);
/** Headers the gateway adds; any client-sent header with this prefix is dropped. */
const GATEWAY_HEADER_PREFIX = 'x-tollgate-';
/** X-Forwarded-For, -Host, -Proto, -Port, -Prefix, -Server…: only the gateway says these. */
const FORWARDED_HEADER_PREFIX = 'x-forwarded-';

/** Failures where nothing reached the backend: safe to try the next one. */
const CONNECT_ERRORS = new Set(['ECONNREFUSED', 'UND_ERR_CONNECT_TIMEOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL']);
/** Failures that say the backend is unwell (skipped for a while), though the request may have reached it. */
const UNHEALTHY_ERRORS = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE']);
/**
 * The connection closed under the request before any answer: most often a kept-alive connection the
 * backend closed for idleness just as the request went out. A request of an idempotent method (RFC 9110
 * §9.2.2) whose body is still at hand is sent once more, on a new connection, before the backend is
 * held unwell; any other request cannot be (the backend may have acted on it).
 */
const CLOSED_ERRORS = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE']);
const IDEMPOTENT_METHODS = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE', 'TRACE']);

export interface ToolCaller {
  requestId: string;
  keyId: string;
  projectId: string;
  orgId: string;
}

export interface ToolRequest {
  backend: ToolBackend;
  method: string;
  /** Path and query as the client sent them. */
  pathAndQuery: string;
  /** Request headers as [name, value] pairs, copied in the handler. */
  headers: Array<[string, string]>;
  /** A stream (read as it arrives), a body already read whole (the PDF guard read it), or none. */
  body: Readable | Buffer | null;
  reply: ResponseSink;
  /** The client's address as the node determined it (request/client-ip.ts): the one X-Forwarded-For sent. */
  clientIp: string;
  caller: ToolCaller;
  onAbort(fn: () => void): void;
  onDone(status: number): void;
}

export function forwardTool(backends: ToolBackends, req: ToolRequest): void {
  // Headers the client named in Connection were for its connection to us only.
  const connection = req.headers.filter(([k]) => k === 'connection').map(([, v]) => v);
  const hopByHop = connection.length > 0 ? connectionNames(connection) : null;
  const headers: string[] = [];
  for (const [k, v] of req.headers) {
    if (DROP_REQUEST_HEADERS.has(k) || k.startsWith(GATEWAY_HEADER_PREFIX) || k.startsWith(FORWARDED_HEADER_PREFIX) || hopByHop?.has(k)) continue;
    // A body read whole goes with its real length; a streamed one keeps the client's.
    if (k === 'content-length' && (req.body === null || Buffer.isBuffer(req.body))) continue;
    headers.push(k, v);
  }
  headers.push(
    'x-forwarded-for',
    req.clientIp,
    'x-request-id',
    req.caller.requestId,
    'x-tollgate-key-id',
    req.caller.keyId,
    'x-tollgate-project-id',
    req.caller.projectId,
    'x-tollgate-org-id',
    req.caller.orgId,
  );
  if (Buffer.isBuffer(req.body)) headers.push('content-length', String(req.body.length));
  const candidates = backends.order(req.backend);
  attempt(backends, req, headers, candidates, 0, false);
}

function attempt(backends: ToolBackends, req: ToolRequest, headers: string[], candidates: Upstream[], index: number, resent: boolean): void {
  const upstream = candidates[index];
  const b = req.backend;
  // A stream is pulled through a generator, so an attempt that never connected leaves it unread for the next.
  const pull = req.body && !Buffer.isBuffer(req.body) ? pullOnce(req.body) : null;
  const slot = new InFlight(upstream);
  const headerTimeoutMs = b.headerTimeoutMs > 0 ? b.headerTimeoutMs : b.timeoutMs > 0 ? b.timeoutMs : 30_000;
  proxyRequest({
    pool: upstream.pool,
    method: req.method as Dispatcher.HttpMethod,
    path: upstream.basePath + req.pathAndQuery,
    headers,
    body: pull ? pull.body : (req.body as Buffer | null),
    timeoutMs: headerTimeoutMs,
    idleTimeoutMs: b.idleTimeoutMs > 0 ? b.idleTimeoutMs : headerTimeoutMs,
    reply: req.reply,
    passAllHeaders: true,
    onAbort: req.onAbort,
    // Methods, not arrow properties: under tsx (esbuild keepNames) a named arrow made per request
    // costs a defineProperty of its name.
    onResponseHead() {
      backends.markUp(upstream);
    },
    retry(err) {
      const code = (err as { code?: string }).code ?? '';
      if (!resent && CLOSED_ERRORS.has(code) && IDEMPOTENT_METHODS.has(req.method) && !pull) {
        slot.release();
        attempt(backends, req, headers, candidates, index, true);
        return true;
      }
      if (CONNECT_ERRORS.has(code) || UNHEALTHY_ERRORS.has(code)) backends.markDown(upstream);
      slot.release();
      if (!CONNECT_ERRORS.has(code) || index + 1 >= candidates.length || (pull && pull.started)) return false;
      attempt(backends, req, headers, candidates, index + 1, resent);
      return true;
    },
    onDone(status) {
      slot.release();
      req.onDone(status);
    },
  });
}

/** One attempt's count in its backend's requests in flight, given back once. */
class InFlight {
  private counted = true;
  constructor(private readonly upstream: Upstream) {
    upstream.inFlight++;
  }

  release(): void {
    if (this.counted) this.upstream.inFlight--;
    this.counted = false;
  }
}

/**
 * A generator over a Readable that reads it only when pulled and never destroys it when abandoned
 * (undici calls `return()` on a body it did not send): the stream stays whole for another attempt.
 * `started` says whether any of it was taken.
 */
function pullOnce(stream: Readable): { body: AsyncGenerator<Buffer>; started: boolean } {
  const state = { body: null as unknown as AsyncGenerator<Buffer>, started: false };
  state.body = (async function* () {
    state.started = true;
    for (;;) {
      const chunk = stream.read() as Buffer | null;
      if (chunk !== null) {
        yield chunk;
        continue;
      }
      if (stream.readableEnded) return;
      if (stream.destroyed) throw stream.errored ?? new Error('request body closed');
      await new Promise<void>((resolve, reject) => {
        const cleanup = () => {
          stream.off('readable', onReadable);
          stream.off('end', onReadable);
          stream.off('error', onError);
          stream.off('close', onReadable);
        };
        const onReadable = () => {
          cleanup();
          resolve();
        };
        const onError = (err: Error) => {
          cleanup();
          reject(err);
        };
        stream.on('readable', onReadable);
        stream.on('end', onReadable);
        stream.on('error', onError);
        stream.on('close', onReadable);
      });
    }
  })();
  return state;
}
