// One upstream exchange over an undici Pool's dispatch API, streamed both ways: the request body (a
// Buffer or a Readable with backpressure), the response passed to the Reply chunk by chunk, the upstream
// paused while the client's socket is full and resumed on drain. The client going away aborts the
// upstream; the upstream failing before its headers becomes a 502; after the headers the status is
// fixed, so a model SSE stream gets one terminal error event and any other stream is closed.
//
// How an exchange ends decides what is billed (docs/billing-endings.md). A client that goes away
// leaves an exchange with `usageGraceMs` reading its upstream on, without a client, for that long: the
// upstream's own usage then bills it when it arrives in time, else the provider's estimate. An end
// the gateway imposes (a revoked key, a blocked organisation, a drain) cancels the upstream at once.
import type { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { GatewayError, isGatewayError } from '../errors.js';
import { errorShape, renderError } from '../error-shapes.js';
import { log, logBug } from '../log.js';
import type { HeaderList, ResponseSink } from './response-sink.js';
import { contentTypeHeader, endToEndHeaders, headerValue } from './upstream-headers.js';
import { MAX_UPSTREAM_ERROR_BYTES, upstreamErrorAnswer } from './upstream-errors.js';
import { isDraining } from '../drain.js';

/**
 * How long an upstream is read on after its client went away, for the usage it reports at its end
 * (a model answer: the upstream bills the work whether or not anyone reads it).
 */
export const USAGE_GRACE_MS = 3000;

/**
 * The most of an answer held when its inspector rewrites it (usage.cost written into a JSON answer):
 * an answer no larger goes out whole at its end, in one write with its length, instead of chunked. A
 * larger one (its length said so, or its bytes passed this) streams chunked from there.
 */
export const WHOLE_ANSWER_MAX_BYTES = 64 * 1024;

/** Replies whose end the gateway imposed (revocation, a blocked organisation): their upstream is cancelled at once, no grace. */
const cancelledReplies = new WeakSet<object>();

/** Marks a reply about to be ended by the gateway: its upstream exchange is cancelled at once, never read on. */
export function cancelUpstreamAtOnce(reply: object): void {
  cancelledReplies.add(reply);
}

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
  reply: ResponseSink;
  /** Pass every end-to-end response header (tools) or only content-type (model endpoints). */
  passAllHeaders: boolean;
  /**
   * Model upstreams: an answer with status 400 or above is read (bounded) and answered by
   * upstream-errors.ts (401/403 become 502, account identifiers masked, retry-after kept), its own
   * body logged for the operator. Tool backends' answers pass through unchanged (Shape C).
   */
  upstreamErrors?: boolean;
  /** Chosen once the status and content-type are known; null passes the body through untouched. */
  inspect?: (status: number, contentType: string) => BodyInspector | null;
  /**
   * Called exactly once: the upstream status (or the error status we answered; 499 when the client
   * went away), how it ended, and the status of the upstream's response head (0: none arrived).
   * 'aborted' with a whole upstream answer read during the grace: the inspector has all of it.
   */
  onDone(status: number, outcome: 'ok' | 'error' | 'aborted', upstreamStatus: number): void;
  /**
   * After the client went away, read the upstream on for this long (its body through `inspect`,
   * nothing written) so its reported usage can bill the request. 0 or absent: cancel at once. Only
   * for a request body already whole (a Buffer or string): a streamed upload ends with its client.
   */
  usageGraceMs?: number;
  /** Registers the abort of this exchange on the client going away. */
  onAbort(fn: () => void): void;
  /**
   * The upstream failed before its response head, and the client is still there: return true to take
   * the failure over (e.g. try another backend). Then nothing is answered and onDone is not called.
   */
  retry?(err: Error): boolean;
  /**
   * The upstream answered a 429 or 5xx head, and nothing went to the client yet: return true to take
   * it over (another deployment of a pooled model). The exchange is then cancelled and reports nothing.
   */
  retryStatus?(status: number, retryAfter: string | undefined): boolean;
  /** The upstream's response head arrived. */
  onResponseHead?(status: number): void;
}

export function proxyRequest(req: ProxyRequest): void {
  const x = new Exchange(req);
  req.onAbort(() => x.clientClosed());
  try {
    // A handler with undici's own (onConnect/onHeaders/…) methods is called as it is: no wrapper
    // object per request, and the response head is read from its raw lines (only what is needed).
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
      x as unknown as Dispatcher.DispatchHandler,
    );
  } catch (err) {
    x.fail(err as Error);
  }
}

/** One exchange: the state and the undici handler of one proxied request (a class: no closures per request). */
class Exchange {
  private readonly reply: ResponseSink;
  private abortUpstream: ((err: Error) => void) | null = null;
  private upstreamAborted = false;
  private resumeUpstream: (() => void) | null = null;
  private paused = false;
  private clientGone = false;
  private finished = false;
  private status = 0;
  private sse = false;
  private inspector: BodyInspector | null = null;
  // A known-length answer: its length, and how much of it has come from the upstream.
  private total = -1;
  private received = 0;
  // A small rewritten answer held to its end (WHOLE_ANSWER_MAX_BYTES), with the head it goes out with.
  private held: Buffer[] | null = null;
  private heldSize = 0;
  private heldHead: HeaderList | null = null;
  // An upstream error answer being read (ProxyRequest.upstreamErrors).
  private errorParts: Buffer[] | null = null;
  private errorSize = 0;
  private errorType = '';
  private retryAfter: string | undefined;
  /** Given to another attempt (retry, retryStatus): nothing more of this one counts. */
  private handedOver = false;
  /** Reading the upstream on after the client left (see usageGraceMs). */
  private graceTimer: NodeJS.Timeout | null = null;

  constructor(private readonly req: ProxyRequest) {
    this.reply = req.reply;
  }

  private done(s: number, outcome: 'ok' | 'error' | 'aborted'): void {
    if (this.finished) return;
    this.finished = true;
    if (this.graceTimer) {
      clearTimeout(this.graceTimer);
      this.graceTimer = null;
    }
    try {
      this.req.onDone(s, outcome, this.status);
    } catch (err) {
      logBug(err);
    }
  }

  private abort(err: Error): void {
    if (this.upstreamAborted || !this.abortUpstream) return;
    this.upstreamAborted = true;
    this.abortUpstream(err);
  }

  /** The client went away (the Reply's abort path), or the gateway ended the reply (revocation, drain). */
  clientClosed(): void {
    this.clientGone = true;
    if (this.finished) return;
    const body = this.req.body;
    const graceMs = this.req.usageGraceMs ?? 0;
    const wholeBody = body === null || typeof body === 'string' || Buffer.isBuffer(body);
    if (graceMs > 0 && wholeBody && !cancelledReplies.has(this.reply) && !isDraining() && !this.upstreamAborted) {
      // Read on for the upstream's usage; the response goes nowhere. A paused upstream is resumed.
      this.graceTimer = setTimeout(() => this.endGrace(), graceMs);
      this.graceTimer.unref();
      this.resume();
      return;
    }
    this.endGrace();
  }

  /** The client is gone and no more is waited for: the exchange ends as aborted, its upstream cancelled. */
  private endGrace(): void {
    if (this.graceTimer) clearTimeout(this.graceTimer);
    this.graceTimer = null;
    // Reported first: aborting the upstream may call onError synchronously.
    this.done(499, 'aborted');
    this.abort(new Error('client closed the connection'));
    const body = this.req.body;
    if (body && typeof body === 'object' && 'destroy' in body) body.destroy();
    // A generator waiting at a yield runs its `finally` (closing what it reads from).
    else if (body && typeof body === 'object' && 'return' in body) body.return(undefined).catch(() => {});
  }

  fail(err: Error): void {
    const { reply, req } = this;
    if (!reply.done && !reply.headersSent && this.status === 0 && req.retry?.(err)) {
      // Handed over: this attempt reports nothing more, even if the client goes away later.
      this.finished = true;
      this.handedOver = true;
      return;
    }
    // Before the answer below: the metrics read it when the reply ends.
    if (!this.clientGone) reply.upstreamError = true;
    if (reply.done) {
      // The client left (and any grace ends here): what the inspector holds is what arrived.
      if (this.clientGone) this.done(499, 'aborted');
      else this.done(this.status || 502, 'error');
      return;
    }
    if (!reply.headersSent) {
      const e = isGatewayError(err) ? err : new GatewayError('UPSTREAM_UNREACHABLE', upstreamMessage(err));
      const r = renderError(e, errorShape(e, req.reply.shape));
      reply.send(r.status, r.headers, r.body, e.code === 'BODY_TOO_LARGE');
      this.done(r.status, 'error');
      return;
    }
    // A model stream gets one terminal error event; a tool backend's stream is its own protocol
    // (MCP, …), so it is only closed.
    if (this.sse && req.reply.shape === 'openai') {
      const e = renderError(new GatewayError('UPSTREAM_ERROR', 'The upstream failed in the middle of the stream.'), req.reply.shape);
      reply.end(`data: ${e.body}\n\n`);
    } else {
      reply.close();
    }
    this.done(this.status, 'error');
  }

  // undici's handler methods.

  onConnect(abort: (err: Error) => void): void {
    this.abortUpstream = abort;
    if (this.clientGone) this.abort(new Error('client closed the connection'));
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], resume: () => void): boolean {
    const { reply, req } = this;
    try {
      if (this.graceTimer) {
        // Read on without a client: only the inspector sees the body.
        this.status = statusCode;
        this.resumeUpstream = resume;
        const ct = headerValue(rawHeaders, 'content-type') ?? '';
        this.inspector = req.inspect ? req.inspect(statusCode, ct) : null;
        if (!this.inspector) this.endGrace();
        return true;
      }
      if (reply.done) {
        this.abort(new Error('client closed the connection'));
        return true;
      }
      // An informational answer (103 Early Hints, …) is not the answer: the final head follows.
      if (statusCode < 200) return true;
      if ((statusCode === 429 || statusCode >= 500) && req.retryStatus && !reply.headersSent && req.retryStatus(statusCode, headerValue(rawHeaders, 'retry-after'))) {
        this.finished = true;
        this.handedOver = true;
        this.abort(new Error('failed over to another deployment'));
        return true;
      }
      this.resumeUpstream = resume;
      this.status = statusCode;
      req.onResponseHead?.(statusCode);
      let contentType: string | undefined;
      let len: string | undefined;
      let retryAfter: string | undefined;
      for (let i = 0; i < rawHeaders.length; i += 2) {
        const n = rawHeaders[i].length;
        // Only names of the right length are decoded (the first line of each wins, as undici's parser).
        if (n === 12 && contentType === undefined && rawHeaders[i].toString('latin1').toLowerCase() === 'content-type') contentType = rawHeaders[i + 1].toString('latin1');
        else if (n === 14 && len === undefined && rawHeaders[i].toString('latin1').toLowerCase() === 'content-length') len = rawHeaders[i + 1].toString('latin1');
        else if (n === 11 && retryAfter === undefined && rawHeaders[i].toString('latin1').toLowerCase() === 'retry-after') retryAfter = rawHeaders[i + 1].toString('latin1');
      }
      contentType ??= '';
      if (req.upstreamErrors && statusCode >= 400) {
        // Read (bounded) and answered when it ends: nothing of it goes out as it came.
        this.errorParts = [];
        this.errorType = contentType;
        this.retryAfter = retryAfter;
        return true;
      }
      this.sse = contentType.startsWith('text/event-stream');
      const inspector = (this.inspector = req.inspect ? req.inspect(statusCode, contentType) : null);
      const out = req.passAllHeaders ? endToEndHeaders(rawHeaders) : contentTypeHeader(contentType);
      const length = len !== undefined && /^\d+$/.test(len) ? Number(len) : -1;
      if (inspector && !inspector.passesThrough && !this.sse && length <= WHOLE_ANSWER_MAX_BYTES) {
        // A rewritten answer (not an event stream), small or of a length not said: held, and sent
        // whole at its end (onComplete).
        this.held = [];
        this.heldHead = out;
        return true;
      }
      // A known length without rewriting goes out with tryEnd; anything else chunked.
      this.total = !inspector || inspector.passesThrough ? length : -1;
      reply.startStream(statusCode, out, this.total);
      if (this.total === 0) reply.end();
    } catch (err) {
      logBug(err);
      this.abort(err as Error);
    }
    return true;
  }

  onData(chunk: Buffer): boolean {
    const reply = this.reply;
    if (this.handedOver) return true;
    try {
      if (this.graceTimer) {
        this.inspector?.transform(chunk);
        return true;
      }
      if (reply.done) {
        this.abort(new Error('client closed the connection'));
        return true;
      }
      if (this.errorParts) {
        if (this.errorSize < MAX_UPSTREAM_ERROR_BYTES) {
          const part = chunk.subarray(0, MAX_UPSTREAM_ERROR_BYTES - this.errorSize);
          this.errorParts.push(Buffer.from(part));
          this.errorSize += part.length;
        }
        return true;
      }
      const out = this.inspector ? this.inspector.transform(chunk) : chunk;
      if (out.length === 0) return true;
      let next: Buffer | string = out;
      if (this.held) {
        this.held.push(Buffer.from(out));
        this.heldSize += out.length;
        if (this.heldSize <= WHOLE_ANSWER_MAX_BYTES) return true;
        // Too large to hold: it streams chunked from here, what was held first.
        next = Buffer.concat(this.held);
        this.held = null;
        reply.startStream(this.status, this.heldHead!, -1);
      }
      // The last bytes of a known-length answer: the provider reports before they go out, as the
      // response ends with them (so the request is settled when its cleanup runs).
      this.received += chunk.length;
      if (this.received === this.total) this.done(this.status, 'ok');
      if (!reply.write(next)) {
        this.paused = true;
        reply.onDrain(() => this.resume());
        return false;
      }
    } catch (err) {
      logBug(err);
      this.abort(err as Error);
    }
    return true;
  }

  private resume(): void {
    if (!this.paused) return;
    this.paused = false;
    this.resumeUpstream?.();
  }

  onComplete(): void {
    const reply = this.reply;
    if (this.handedOver) return;
    if (this.errorParts) return this.answerUpstreamError();
    try {
      if (this.graceTimer) {
        // The whole answer arrived after its client left: the inspector read it to its end.
        this.inspector?.flush();
        this.done(499, 'aborted');
        return;
      }
      const tail = !reply.done && this.inspector ? this.inspector.flush() : '';
      // Reported before the response ends, so the request is settled when its cleanup runs.
      this.done(this.status, 'ok');
      if (reply.done) return;
      if (this.held) {
        if (tail.length > 0) this.held.push(Buffer.from(tail));
        reply.send(this.status, this.heldHead, this.held.length === 1 ? this.held[0] : Buffer.concat(this.held));
        this.held = null;
        return;
      }
      reply.end(tail.length > 0 ? tail : undefined);
    } catch (err) {
      logBug(err);
      this.done(this.status, 'error');
    }
  }

  /** The upstream answered an error, read whole (bounded): answered as upstream-errors.ts says. */
  private answerUpstreamError(): void {
    const { reply, req } = this;
    try {
      const body = Buffer.concat(this.errorParts!);
      this.errorParts = null;
      // For the operator only: what the upstream said, tied to the request.
      log.warn({ requestId: reply.requestId, upstreamStatus: this.status, upstreamBody: body.toString('utf8', 0, Math.min(body.length, 4096)) }, `upstream answered ${this.status}`);
      const a = upstreamErrorAnswer(this.status, this.errorType, body, this.retryAfter, req.reply.shape);
      if (a.status >= 500) reply.upstreamError = true;
      this.done(a.status, 'ok');
      reply.send(a.status, a.headers, a.body);
    } catch (err) {
      logBug(err);
      this.done(this.status, 'error');
      reply.close();
    }
  }

  onError(err: Error): void {
    if (this.handedOver) return;
    try {
      this.fail(err);
    } catch (e) {
      logBug(e);
    }
  }
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
