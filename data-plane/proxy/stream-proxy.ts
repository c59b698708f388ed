// One upstream exchange over an undici Pool's dispatch API, streamed both ways: the request body (a
// Buffer or a Readable with backpressure), the response passed to the Reply chunk by chunk, the upstream
// paused while the client's socket is full and resumed on drain. The client going away aborts the
// upstream; the upstream failing before its headers becomes a 502; after the headers the status is
// fixed, so a model SSE stream gets one terminal error event and any other stream is closed.
import type { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { GatewayError, isGatewayError } from '../errors.js';
import { renderError, type ErrorShape } from '../http/error-shapes.js';
import { logBug, type Reply } from '../http/reply.js';

/** Observes (and may rewrite) a response body, e.g. to read usage out of an SSE stream. */
export interface BodyInspector {
  /** Returns the bytes to send on (possibly empty), given an upstream chunk. */
  transform(chunk: Buffer): Buffer | string;
  /** Bytes still held back when the upstream ended. */
  flush(): Buffer | string;
  /**
   * True when `transform` returns every chunk unchanged and `flush` nothing (it only watches): the
   * answer then keeps its length and goes out with tryEnd instead of chunked.
   */
  readonly passesThrough?: boolean;
}

export interface ProxyRequest {
  pool: Dispatcher;
  method: Dispatcher.HttpMethod;
  path: string;
  /** Flat [name, value, name, value, …] list, built once per model or backend where possible. */
  headers: string[];
  /** An async iterable is pulled a chunk at a time, once the socket took the last (undici). */
  body: Buffer | string | Readable | AsyncGenerator<Buffer> | null;
  /** Time allowed until the response head (and, unless idleTimeoutMs is set, between body chunks). */
  timeoutMs: number;
  /** Longest silence allowed between two chunks of the response body. */
  idleTimeoutMs?: number;
  reply: Reply;
  shape: ErrorShape;
  /** Pass every end-to-end response header (tools) or only content-type (model endpoints). */
  passAllHeaders: boolean;
  /** Chosen once the status and content-type are known; null passes the body through untouched. */
  inspect?: (status: number, contentType: string) => BodyInspector | null;
  /** Called exactly once: the upstream status (or the error status we answered), and how it ended. */
  onDone(status: number, outcome: 'ok' | 'error' | 'aborted'): void;
  /** Registers the abort of this exchange on the client going away. */
  onAbort(fn: () => void): void;
  /**
   * The upstream failed before its response head, and the client is still there: return true to take
   * the failure over (e.g. try another backend). Then nothing is answered and onDone is not called.
   */
  retry?(err: Error): boolean;
  /** The upstream's response head arrived. */
  onResponseHead?(status: number): void;
}

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'content-length',
  'date',
  'uwebsockets',
]);

export function proxyRequest(req: ProxyRequest): void {
  const { reply } = req;
  let controller: Dispatcher.DispatchController | null = null;
  let clientGone = false;
  let finished = false;
  let status = 0;
  let sse = false;
  let inspector: BodyInspector | null = null;
  // A known-length answer: its length, and how much of it has come from the upstream.
  let total = -1;
  let received = 0;

  const done = (s: number, outcome: 'ok' | 'error' | 'aborted') => {
    if (finished) return;
    finished = true;
    try {
      req.onDone(s, outcome);
    } catch (err) {
      logBug(err);
    }
  };

  req.onAbort(() => {
    clientGone = true;
    // Reported first: aborting the upstream may call onResponseError synchronously.
    done(499, 'aborted');
    if (controller && !controller.aborted) controller.abort(new Error('client closed the connection'));
    const body = req.body;
    if (body && typeof body === 'object' && 'destroy' in body) body.destroy();
    // A generator waiting at a yield runs its `finally` (closing what it reads from).
    else if (body && typeof body === 'object' && 'return' in body) body.return(undefined).catch(() => {});
  });

  const fail = (err: Error) => {
    // Before the answer below: the metrics read it when the reply ends.
    if (!clientGone) reply.upstreamError = true;
    if (reply.done) {
      if (clientGone) done(499, 'aborted');
      else done(status || 502, 'error');
      return;
    }
    if (!reply.headersSent && status === 0 && req.retry?.(err)) {
      // Handed over: this attempt reports nothing more, even if the client goes away later.
      finished = true;
      return;
    }
    if (!reply.headersSent) {
      const e = isGatewayError(err) ? err : new GatewayError('UPSTREAM_UNREACHABLE', upstreamMessage(err));
      const r = renderError(e, req.shape);
      reply.send(r.status, r.headers, r.body, e.code === 'BODY_TOO_LARGE');
      done(r.status, 'error');
      return;
    }
    // A model stream gets one terminal error event; a tool backend's stream is its own protocol
    // (MCP, …), so it is only closed.
    if (sse && req.shape === 'A') {
      const e = renderError(new GatewayError('UPSTREAM_ERROR', 'The upstream failed in the middle of the stream.'), 'A');
      reply.end(`data: ${e.body}\n\n`);
    } else {
      reply.close();
    }
    done(status, 'error');
  };

  const handler: Dispatcher.DispatchHandler = {
    onRequestStart(c) {
      controller = c;
      if (clientGone) c.abort(new Error('client closed the connection'));
    },
    onResponseStart(c, statusCode, headers) {
      try {
        if (reply.done) {
          c.abort(new Error('client closed the connection'));
          return;
        }
        status = statusCode;
        req.onResponseHead?.(statusCode);
        const contentType = headerValue(headers['content-type']) ?? '';
        sse = contentType.startsWith('text/event-stream');
        inspector = req.inspect ? req.inspect(statusCode, contentType) : null;
        const out: Array<[string, string]> = [];
        if (req.passAllHeaders) {
          const named = headers.connection === undefined ? null : connectionNames(headers.connection);
          for (const name of Object.keys(headers)) {
            if (HOP_BY_HOP.has(name) || named?.has(name)) continue;
            const v = headers[name];
            if (Array.isArray(v)) for (const x of v) out.push([name, x]);
            else if (v !== undefined) out.push([name, v]);
          }
        } else if (contentType) {
          out.push(['content-type', contentType]);
        }
        // A known length without rewriting goes out with tryEnd; anything else chunked.
        const len = headerValue(headers['content-length']);
        total = (!inspector || inspector.passesThrough) && len !== undefined && /^\d+$/.test(len) ? Number(len) : -1;
        reply.startStream(statusCode, out, total);
        if (total === 0) reply.end();
      } catch (err) {
        logBug(err);
        c.abort(err as Error);
      }
    },
    onResponseData(c, chunk) {
      try {
        if (reply.done) {
          if (!c.aborted) c.abort(new Error('client closed the connection'));
          return;
        }
        const out = inspector ? inspector.transform(chunk) : chunk;
        if (out.length === 0) return;
        // The last bytes of a known-length answer: the provider reports before they go out, as the
        // response ends with them (so the request is settled when its cleanup runs).
        received += chunk.length;
        if (received === total) done(status, 'ok');
        if (!reply.write(out)) {
          c.pause();
          reply.onDrain(() => c.resume());
        }
      } catch (err) {
        logBug(err);
        c.abort(err as Error);
      }
    },
    onResponseEnd() {
      try {
        const tail = !reply.done && inspector ? inspector.flush() : '';
        // Reported before the response ends, so the request is settled when its cleanup runs.
        done(status, 'ok');
        if (!reply.done) reply.end(tail.length > 0 ? tail : undefined);
      } catch (err) {
        logBug(err);
        done(status, 'error');
      }
    },
    onResponseError(_c, err) {
      try {
        fail(err);
      } catch (e) {
        logBug(e);
      }
    },
  };

  try {
    req.pool.dispatch(
      {
        path: req.path,
        method: req.method,
        headers: req.headers,
        // undici takes async iterables as bodies; its types list only Readable.
        body: req.body as Buffer | string | Readable | null,
        headersTimeout: req.timeoutMs,
        bodyTimeout: req.idleTimeoutMs ?? req.timeoutMs,
      },
      handler,
    );
  } catch (err) {
    fail(err as Error);
  }
}

/**
 * The header names a `Connection` header lists (RFC 9110 7.6.1): hop-by-hop for that connection only,
 * never passed on. `close` and `keep-alive` are options, not names. Null when it lists none.
 */
export function connectionNames(values: string | readonly string[]): Set<string> | null {
  let out: Set<string> | null = null;
  for (const v of typeof values === 'string' ? [values] : values) {
    for (const t of v.split(',')) {
      const name = t.trim().toLowerCase();
      if (name && name !== 'close' && name !== 'keep-alive') (out ??= new Set()).add(name);
    }
  }
  return out;
}

function headerValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

function upstreamMessage(err: Error): string {
  const code = (err as { code?: string }).code;
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT' || code === 'UND_ERR_CONNECT_TIMEOUT') {
    return 'The upstream did not answer in time.';
  }
  if (code === 'ECONNREFUSED') return 'The upstream refused the connection.';
  if (code === 'UND_ERR_SOCKET' || code === 'ECONNRESET') return 'The upstream closed the connection before answering.';
  return 'The upstream could not be reached.';
}
