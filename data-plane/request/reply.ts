// The uWebSockets.js contract, kept by every handler of this node (why: docs/design.md#the-uws-contract):
// 1. `HttpRequest` dies when the handler returns: copy method, URL, query, headers first.
// 2. Unless the response ends synchronously, call `res.onAborted` and attach `onData` before any await.
// 3. Wrap `res` in one `Reply` with a `done` flag set by abort, end, close, a finished `tryEnd`, or
//    upgrade; every method checks it. Touching `res` after abort terminates the process.
// 4. Cork every write made outside the synchronous handler; status, headers and first chunk in one cork.
// 5. `onData` buffers are detached when the callback returns: copy them unless consumed synchronously.
// 6. Refuse an oversize `content-length` before reading; count bytes as they arrive.
// 7. No exception escapes a uWS callback.
// 8. `onAborted` is the single cleanup path: abort the upstream request, release slots, record usage.
//
// Here (8) is kept by `finish()`: the onAborted handler and every way a response ends (end, close,
// a finished tryEnd) call it, and it runs the registered cleanups exactly once.
import type { HttpResponse, RecognizedString } from 'uWebSockets.js';
import { isDraining } from '../drain.js';
import { refusalOf, type Refusal } from '../errors.js';
import { logBug } from '../log.js';
import { recordReply, streamEnded, streamStarted, type ReplyMeter } from '../metrics.js';
import type { PathFamily } from '../routing/path-families.js';
import { writeRateHeaders, type RateHeaders } from '../limits/rate-headers.js';
import { errorShape, renderError, statusLine, type ErrorShape } from '../error-shapes.js';
import { refusalReason, type LogDraft } from './request-log.js';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { HeaderList, ResponseSink } from '../proxy/response-sink.js';
import { SlotSet, type Slotted } from '../slot-set.js';

export type { HeaderList };

/**
 * The most of a request body left unread that an early answer (503, 413, 429, 401 before the body was
 * read) still reads and drops, so the client, which is still writing, can read the answer: a lingering
 * close, as nginx calls it. Closing at once would reset the connection under the client's writes, and
 * it would see a broken pipe instead of the answer. Past this the connection is closed.
 */
export const LINGER_MAX_BYTES = 64 * 1024 * 1024;

export class Reply implements ReplyMeter, ResponseSink, Slotted {
  // Metrics (metrics.ts): `family` is set by the API server; replies without one are not counted.
  family: PathFamily | null = null;
  /** The error shape of the path (the gate sets it: the family's, or the gateway's for a path with no route). */
  shape: ErrorShape = 'gateway';
  status = 0;
  readonly startedAt = performance.now();
  /** When the upstream call began (0: none); set by the server right before it calls a provider. */
  upstreamAt = 0;
  /** When status and headers were handed to uWS (0: never). */
  headAt = 0;
  /** The upstream failed (set by stream-proxy before it answers or closes). */
  upstreamError = false;
  private streaming = false;

  /** True once `res` may no longer be touched (aborted, ended, closed, fully sent). */
  done = false;
  /** True when the client went away (or we closed the connection) before the response ended. */
  aborted = false;
  /** Headers added to every response. */
  extraHeaders: HeaderList | null = null;
  /**
   * The request's id (the one `tollgate logs` shows), sent as `x-request-id` on every answer; an
   * upstream's own `x-request-id` is not passed on.
   */
  requestId = '';
  /** For the request log: body bytes written. */
  bytesOut = 0;
  /** Why the gateway refused the request (the error it answered with), for metrics and the request log; null otherwise. */
  refusal: Refusal | null = null;
  /**
   * The request-log entry of a request of a known key (its admitted context adds the usage); told how
   * the response ended before the other cleanups run.
   */
  logDraft: LogDraft | null = null;
  /** The key's rate-limit headers once it is known, rendered only when the head is written. */
  rateHeaders: RateHeaders | null = null;
  /** The request's entry in the node's registry of what keys have open (open-request.ts), once its key is known. */
  open: { context: { readonly model: ModelConfig | null } | null } | null = null;
  /** A HEAD request: answers carry their head (and the length a GET would have) but never a body. */
  headRequest = false;
  /** The client sent `Connection: close`: uWS closes the connection as soon as the answer ends. */
  clientCloses = false;
  /** Close without lingering when answering before the body was read (a client too slow to wait for). */
  noLinger = false;
  /** Request body bytes declared and not yet received (-1: a chunked body not yet ended). */
  private bodyLeft = 0;
  private paused = false;
  /** An answer waiting for the rest of the body to be read (clientCloses). */
  private deferred: (() => void) | null = null;

  private readonly res: HttpResponse;
  private cleanups: Array<(aborted: boolean) => void> = [];
  private head: { statusLine: string; headers: HeaderList } | null = null;
  private headWritten = false;
  private drainCb: (() => void) | null = null;
  private writableHooked = false;
  // tryEnd bookkeeping (known-length streaming, as in the uWS VideoStreamer example).
  private totalSize = -1;
  private pending: Uint8Array | null = null;
  private pendingOffset = 0;
  /** Its slot among the open replies (slot-set.ts). */
  slot = -1;

  constructor(res: HttpResponse) {
    this.res = res;
    liveReplies.add(this);
    res.onAborted(() => {
      this.aborted = true;
      this.finish();
    });
  }

  /** Registers a cleanup that runs once when the response ends in any way (argument: aborted). */
  onFinish(fn: (aborted: boolean) => void): void {
    if (this.done) {
      runSafely(fn, this.aborted);
      return;
    }
    this.cleanups.push(fn);
  }

  /** Whether status and headers have been sent (after that the status is fixed). */
  get headersSent(): boolean {
    return this.headWritten || this.done;
  }

  /** Sends a whole response in one cork. */
  send(status: number, headers: HeaderList | null, body: RecognizedString, closeConnection = false): void {
    if (this.done || this.deferred) return;
    this.status = status;
    if (this.clientCloses && !this.noLinger && this.bodyLeft !== 0 && this.bodyLeft <= LINGER_MAX_BYTES) {
      // The client said `Connection: close`, so uWS closes as soon as the answer ends, and a close
      // with its body unread resets the connection: the answer waits until the rest has been read.
      this.deferred = () => this.sendNow(status, headers, body, closeConnection);
      this.readRestThenAnswer();
      return;
    }
    this.sendNow(status, headers, body, closeConnection);
  }

  private sendNow(status: number, headers: HeaderList | null, body: RecognizedString, closeConnection: boolean): void {
    if (this.done) return;
    this.bytesOut += byteLength(body);
    this.headAt = performance.now();
    this.res.cork(() => {
      this.res.writeStatus(statusLine(status));
      if (headers) for (const [k, v] of headers) this.res.writeHeader(k, v);
      if (this.extraHeaders) for (const [k, v] of this.extraHeaders) this.res.writeHeader(k, v);
      if (this.rateHeaders) writeRateHeaders(this.rateHeaders, this.res);
      if (this.requestId) this.res.writeHeader('x-request-id', this.requestId);
      const close = this.closesAfter(closeConnection);
      if (this.headRequest && !close) this.endHead(typeof body === 'string' ? Buffer.byteLength(body) : byteLength(body));
      else this.res.end(body, close);
    });
    this.finish();
  }

  /**
   * Drops what is left of the body as it arrives, then sends the deferred answer; a chunked body
   * gets LINGER_MAX_BYTES at most, then the answer goes out anyway.
   */
  private readRestThenAnswer(): void {
    let dropped = 0;
    this.res.onData((chunk, isLast) => {
      try {
        dropped += chunk.byteLength;
        if ((!isLast && dropped <= LINGER_MAX_BYTES) || this.done) return;
        const answer = this.deferred;
        this.deferred = null;
        answer?.();
      } catch (err) {
        logBug(err);
      }
    });
    if (this.paused) {
      this.paused = false;
      this.res.resume();
    }
  }

  /** The request declares a body (`contentLength` ≥ 0, or chunked): what an early answer lingers for. */
  expectBody(contentLength: number, chunked: boolean): void {
    this.bodyLeft = contentLength > 0 ? contentLength : chunked ? -1 : 0;
  }

  /** Body bytes arrived (the readers of request-body.ts tell). */
  bodyArrived(bytes: number, isLast: boolean): void {
    if (isLast) this.bodyLeft = 0;
    else if (this.bodyLeft > 0) this.bodyLeft = Math.max(0, this.bodyLeft - bytes);
  }

  /**
   * Whether the connection closes after an answer that asked to close it. With a known rest of the
   * body within LINGER_MAX_BYTES it stays open instead: uWS reads the rest and drops it (nobody reads
   * it any more), then serves the connection's next request; the socket must not stay paused for that.
   */
  private closesAfter(requested: boolean): boolean {
    if (isDraining()) return true;
    if (!requested || this.noLinger) return requested;
    const left = this.bodyLeft;
    if (left <= 0 || left > LINGER_MAX_BYTES) return true;
    if (this.paused) {
      this.paused = false;
      this.res.resume();
    }
    return false;
  }

  /** Renders an error through error-shapes.ts and sends it. */
  sendError(err: unknown, closeConnection = false): void {
    if (this.done) return;
    this.refusal = refusalOf(err);
    const r = renderError(err, errorShape(err, this.shape));
    this.send(r.status, r.headers, r.body, closeConnection);
  }

  /** Starts a streamed response; status and headers go out with the first chunk (one cork). */
  startStream(status: number, headers: HeaderList, totalSize = -1): void {
    this.head = { statusLine: statusLine(status), headers };
    this.totalSize = totalSize;
    if (this.done || this.headAt !== 0) return;
    this.status = status;
    this.headAt = performance.now();
    if (totalSize < 0 && this.family) {
      this.streaming = true;
      streamStarted();
    }
  }

  private writeHead(): void {
    if (this.headWritten || !this.head) return;
    this.headWritten = true;
    this.res.writeStatus(this.head.statusLine);
    const id = this.requestId;
    for (const [k, v] of this.head.headers) if (!id || k !== 'x-request-id') this.res.writeHeader(k, v);
    if (this.extraHeaders) for (const [k, v] of this.extraHeaders) this.res.writeHeader(k, v);
    if (this.rateHeaders) writeRateHeaders(this.rateHeaders, this.res);
    if (id) this.res.writeHeader('x-request-id', id);
  }

  /**
   * Writes one chunk. Returns false under backpressure: the caller stops producing until `onDrain`.
   * In chunked mode uWS keeps the chunk; with a known total size the unsent rest is kept here.
   */
  write(chunk: Uint8Array | string): boolean {
    if (this.done) return false;
    this.bytesOut += byteLength(chunk);
    let ok = true;
    if (this.totalSize >= 0) {
      const data = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      const offset = this.res.getWriteOffset();
      let finished = false;
      this.res.cork(() => {
        this.writeHead();
        [ok, finished] = this.res.tryEnd(data, this.totalSize);
      });
      if (finished) {
        this.finish();
        return true;
      }
      if (!ok) {
        this.pending = data;
        this.pendingOffset = offset;
        this.hookWritable();
      }
      return ok;
    }
    this.res.cork(() => {
      this.writeHead();
      ok = this.res.write(chunk);
    });
    if (!ok) this.hookWritable();
    return ok;
  }

  /** Calls `cb` once the connection drained after a write returned false. */
  onDrain(cb: () => void): void {
    if (this.done) return;
    this.drainCb = cb;
    this.hookWritable();
  }

  private hookWritable(): void {
    if (this.writableHooked) return;
    this.writableHooked = true;
    this.res.onWritable((offset) => {
      try {
        if (this.done) return true;
        if (this.pending) {
          const [ok, finished] = this.res.tryEnd(this.pending.subarray(offset - this.pendingOffset), this.totalSize);
          if (finished) {
            this.pending = null;
            this.finish();
            // The producer paused for this drain: resume it so it can end (its end reports usage).
            this.runDrain();
            return true;
          }
          if (!ok) return false;
          this.pending = null;
        }
        this.runDrain();
        return true;
      } catch (err) {
        logBug(err);
        return true;
      }
    });
  }

  private runDrain(): void {
    const cb = this.drainCb;
    this.drainCb = null;
    if (cb) cb();
  }

  /** Ends a streamed response (chunked mode), optionally with a last chunk. */
  end(chunk?: Uint8Array | string): void {
    if (this.done) return;
    if (chunk !== undefined) this.bytesOut += byteLength(chunk);
    this.res.cork(() => {
      if (!this.headWritten && !this.head) {
        this.head = { statusLine: statusLine(200), headers: [] };
        this.status = 200;
        this.headAt = performance.now();
      }
      // uWS writes `Connection: close` as a header line: only possible before the head went out.
      const closeConnection = isDraining() && !this.headWritten;
      const headOnly = this.headRequest && !this.headWritten && !closeConnection && (chunk === undefined || byteLength(chunk) === 0);
      this.writeHead();
      if (headOnly) this.endHead(this.totalSize);
      else this.res.end(chunk ?? '', closeConnection);
    });
    this.finish();
  }

  /**
   * Ends the answer to a HEAD request without a body, saying the length a GET would have had (-1:
   * unknown). (uWS 20.30's `endWithoutBody(length)` drops the connection, and `end('')` would say
   * `Content-Length: 0`; so the length goes out as a header of ours.) Inside a cork, head written.
   */
  private endHead(length: number): void {
    if (length >= 0) this.res.writeHeader('content-length', String(length));
    this.res.endWithoutBody();
  }

  /** Whether the response streaming out is an event stream (SSE): it can end with an error event. */
  get isEventStream(): boolean {
    if (!this.head || this.totalSize >= 0) return false;
    for (const [k, v] of this.head.headers) if (k.toLowerCase() === 'content-type') return v.startsWith('text/event-stream');
    return false;
  }

  /**
   * Ends a chunked stream early with a last chunk (a terminal SSE error event). Cleanups see it as
   * aborted, so the upstream is stopped and usage recorded as for a client that went away.
   */
  endEarly(chunk: string): void {
    if (this.done) return;
    this.aborted = true;
    this.end(chunk);
  }

  /** Force-closes the connection (a stream that failed after its headers were sent). */
  close(): void {
    if (this.done) return;
    this.aborted = true;
    // uWS runs onAborted from inside close(), which calls finish().
    this.res.close();
    this.finish();
  }

  /**
   * The connection became a WebSocket (call right before uWS `upgrade`): `res` may no longer be
   * touched, and the cleanups are dropped, as the socket's close handler owns the request from here.
   * It is no longer an open response either: the drain counts the socket as a realtime session.
   */
  markUpgraded(): void {
    this.done = true;
    this.cleanups = [];
    liveReplies.delete(this);
  }

  pause(): void {
    if (this.done) return;
    this.paused = true;
    this.res.pause();
  }

  resume(): void {
    if (this.done) return;
    this.paused = false;
    this.res.resume();
  }

  /** The single cleanup path: runs the cleanups exactly once. */
  private finish(): void {
    if (this.done) return;
    this.done = true;
    liveReplies.delete(this);
    if (this.streaming) streamEnded();
    if (this.family) {
      try {
        recordReply(this);
      } catch (err) {
        logBug(err);
      }
    }
    if (this.logDraft) {
      try {
        this.logDraft.endReply(this.status, this.bytesOut, refusalReason(this.refusal), this.aborted);
      } catch (err) {
        logBug(err);
      }
    }
    const fns = this.cleanups;
    this.cleanups = [];
    for (const fn of fns) runSafely(fn, this.aborted);
  }
}

function byteLength(body: RecognizedString): number {
  if (typeof body === 'string') return body.length;
  return (body as ArrayBufferView | ArrayBuffer).byteLength ?? 0;
}

/** Every response not yet ended, so a drain that runs out of time can close them through their abort path. */
const liveReplies = new SlotSet<Reply>();

/** How many responses are still open. */
export function openReplies(): number {
  return liveReplies.size;
}

/**
 * Closes every open response (the drain deadline passed). Each ends through its abort path, which
 * aborts its upstream and records its usage (rule 8).
 */
export function closeOpenReplies(): number {
  const open = liveReplies.values();
  for (const r of open) r.close();
  return open.length;
}

function runSafely(fn: (aborted: boolean) => void, aborted: boolean): void {
  try {
    fn(aborted);
  } catch (err) {
    logBug(err);
  }
}

