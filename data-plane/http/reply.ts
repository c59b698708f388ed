// The uWebSockets.js contract, kept by every handler of this node:
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
import { writeRateHeaders, type RateHeaders } from '../limits/key-budgets.js';
import { renderError, statusLine, type ErrorShape } from './error-shapes.js';

export type HeaderList = ReadonlyArray<readonly [string, string]>;

export class Reply {
  /** True once `res` may no longer be touched (aborted, ended, closed, fully sent). */
  done = false;
  /** True when the client went away (or we closed the connection) before the response ended. */
  aborted = false;
  /** Headers added to every response. */
  extraHeaders: HeaderList | null = null;
  /** The key's rate-limit headers once it is known, rendered only when the head is written. */
  rateHeaders: RateHeaders | null = null;

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

  constructor(res: HttpResponse) {
    this.res = res;
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
    if (this.done) return;
    this.res.cork(() => {
      this.res.writeStatus(statusLine(status));
      if (headers) for (const [k, v] of headers) this.res.writeHeader(k, v);
      if (this.extraHeaders) for (const [k, v] of this.extraHeaders) this.res.writeHeader(k, v);
      if (this.rateHeaders) writeRateHeaders(this.rateHeaders, this.res);
      this.res.end(body, closeConnection);
    });
    this.finish();
  }

  /** Renders an error through error-shapes.ts and sends it. */
  sendError(err: unknown, shape: ErrorShape, closeConnection = false): void {
    if (this.done) return;
    const r = renderError(err, shape);
    this.send(r.status, r.headers, r.body, closeConnection);
  }

  /** Starts a streamed response; status and headers go out with the first chunk (one cork). */
  startStream(status: number, headers: HeaderList, totalSize = -1): void {
    this.head = { statusLine: statusLine(status), headers };
    this.totalSize = totalSize;
  }

  private writeHead(): void {
    if (this.headWritten || !this.head) return;
    this.headWritten = true;
    this.res.writeStatus(this.head.statusLine);
    for (const [k, v] of this.head.headers) this.res.writeHeader(k, v);
    if (this.extraHeaders) for (const [k, v] of this.extraHeaders) this.res.writeHeader(k, v);
    if (this.rateHeaders) writeRateHeaders(this.rateHeaders, this.res);
  }

  /**
   * Writes one chunk. Returns false under backpressure: the caller stops producing until `onDrain`.
   * In chunked mode uWS keeps the chunk; with a known total size the unsent rest is kept here.
   */
  write(chunk: Uint8Array | string): boolean {
    if (this.done) return false;
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
    this.res.cork(() => {
      if (!this.headWritten && !this.head) this.head = { statusLine: statusLine(200), headers: [] };
      this.writeHead();
      this.res.end(chunk ?? '');
    });
    this.finish();
  }

  /** Force-closes the connection (a stream that failed after its headers were sent). */
  close(): void {
    if (this.done) return;
    this.aborted = true;
    // uWS runs onAborted from inside close(), which calls finish().
    this.res.close();
    this.finish();
  }

  pause(): void {
    if (!this.done) this.res.pause();
  }

  resume(): void {
    if (!this.done) this.res.resume();
  }

  /** The single cleanup path: runs the cleanups exactly once. */
  private finish(): void {
    if (this.done) return;
    this.done = true;
    const fns = this.cleanups;
    this.cleanups = [];
    for (const fn of fns) runSafely(fn, this.aborted);
  }
}

function runSafely(fn: (aborted: boolean) => void, aborted: boolean): void {
  try {
    fn(aborted);
  } catch (err) {
    logBug(err);
  }
}

let bugsLogged = 0;
/** A bug (an exception that is not a catalog error): logged, never thrown into uWS. */
export function logBug(err: unknown): void {
  if (bugsLogged++ < 100) console.error(`data plane bug: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
}
