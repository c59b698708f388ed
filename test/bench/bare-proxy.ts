// The reference for the node's hot path: a bare uWebSockets.js pass-through built on undici's
// dispatch API (no auth, no limits, no accounting, no body parsing), in its own process, keeping the
// uWS rules of docs/design.md#the-uws-contract. Usage: bare-proxy.ts UPSTREAM_URL. Prints
// `bare proxy listening on PORT`.
//
// Method, path and headers are copied before the handler returns; the request body goes to the
// upstream as it arrives (a body that arrives in one onData call is passed as one Buffer, a longer one
// through a Readable paused with res.pause() when undici pushes back); the response comes back chunk
// by chunk (status, headers and the first chunk in one cork; tryEnd with a known length, write +
// onWritable otherwise); the client going away aborts the upstream exchange.
import { STATUS_CODES } from 'node:http';
import { Readable } from 'node:stream';
import uWS, { type HttpResponse } from 'uWebSockets.js';
import { Pool, type Dispatcher } from 'undici';

const pool = new Pool(process.argv[2], { connections: 128, pipelining: 1 });

const HOP_BY_HOP = new Set(['host', 'connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'expect']);
const RESPONSE_SKIP = new Set([...HOP_BY_HOP, 'content-length', 'date', 'proxy-authenticate', 'uwebsockets']);

/** One exchange's state; `done` set once `res` may no longer be touched (aborted or ended). */
interface Exchange {
  res: HttpResponse;
  done: boolean;
  controller: Dispatcher.DispatchController | null;
  body: Readable | null;
}

function watch(res: HttpResponse): Exchange {
  const x: Exchange = { res, done: false, controller: null, body: null };
  res.onAborted(() => {
    x.done = true;
    if (x.controller && !x.controller.aborted) x.controller.abort(new Error('client closed the connection'));
    x.body?.destroy();
  });
  return x;
}

function proxy(x: Exchange, method: Dispatcher.HttpMethod, path: string, headers: string[], body: Buffer | Readable | null): void {
  const { res } = x;
  let head: Array<[string, string]> = [];
  let statusLine = '200';
  let headWritten = false;
  let total = -1;
  // The unsent tail of the last chunk while the client's socket is full (known-length case).
  let pending: Buffer | null = null;
  let pendingOffset = 0;

  const writeHead = () => {
    res.writeStatus(statusLine);
    for (const [k, v] of head) res.writeHeader(k, v);
    headWritten = true;
  };

  const handler: Dispatcher.DispatchHandler = {
    onRequestStart(c) {
      x.controller = c;
      if (x.done) c.abort(new Error('client closed the connection'));
    },
    onResponseStart(c, statusCode, h, statusMessage) {
      if (x.done) return c.abort(new Error('client closed the connection'));
      statusLine = `${statusCode} ${statusMessage || STATUS_CODES[statusCode] || ''}`;
      head = [];
      for (const name of Object.keys(h)) {
        if (RESPONSE_SKIP.has(name)) continue;
        const v = h[name];
        if (Array.isArray(v)) for (const item of v) head.push([name, item]);
        else if (v !== undefined) head.push([name, v]);
      }
      const len = h['content-length'];
      total = typeof len === 'string' && /^\d+$/.test(len) ? Number(len) : -1;
    },
    onResponseData(c, chunk) {
      if (x.done) return;
      let ok = true;
      res.cork(() => {
        if (!headWritten) writeHead();
        if (total >= 0) {
          const offset = res.getWriteOffset();
          const [sent, finished] = res.tryEnd(chunk, total);
          if (finished) x.done = true;
          else if (!sent) {
            ok = false;
            pending = chunk;
            pendingOffset = offset;
          }
        } else {
          ok = res.write(chunk);
        }
      });
      if (ok) return;
      c.pause();
      res.onWritable((offset) => {
        if (x.done) return true;
        if (pending) {
          const [sent, finished] = res.tryEnd(pending.subarray(offset - pendingOffset), total);
          if (finished) x.done = true;
          if (!sent && !finished) return false;
          pending = null;
        }
        c.resume();
        return true;
      });
    },
    onResponseEnd() {
      if (x.done) return;
      x.done = true;
      res.cork(() => {
        if (!headWritten) writeHead();
        res.end();
      });
    },
    onResponseError(_c, err) {
      if (process.env.BARE_PROXY_DEBUG) console.error(err);
      if (x.done) return;
      x.done = true;
      res.cork(() => {
        if (headWritten) res.close();
        else res.writeStatus('502 Bad Gateway').end();
      });
    },
  };
  try {
    pool.dispatch({ method, path, headers, body }, handler);
  } catch (err) {
    handler.onResponseError!(null as unknown as Dispatcher.DispatchController, err as Error);
  }
}

uWS
  .App()
  .any('/*', (res, req) => {
    try {
      const method = req.getMethod().toUpperCase() as Dispatcher.HttpMethod;
      const query = req.getQuery();
      const path = query ? `${req.getUrl()}?${query}` : req.getUrl();
      const headers: string[] = [];
      let hasBody = false;
      req.forEach((k, v) => {
        if (HOP_BY_HOP.has(k)) return;
        if (k === 'content-length') hasBody = v !== '0';
        headers.push(k, v);
      });
      const x = watch(res);
      if (!hasBody && method !== 'POST' && method !== 'PUT' && method !== 'PATCH') return proxy(x, method, path, headers, null);
      let stream: Readable | null = null;
      res.onData((ab, isLast) => {
        try {
          if (!stream) {
            // The whole body in one call: one Buffer, copied (the ArrayBuffer is detached after return).
            if (isLast) return proxy(x, method, path, headers, Buffer.from(ab.slice(0)));
            stream = x.body = new Readable({ read: () => void (x.done || res.resume()) });
            proxy(x, method, path, headers, stream);
          }
          if (!stream.push(Buffer.from(ab.slice(0))) && !x.done) res.pause();
          if (isLast) stream.push(null);
        } catch (err) {
          console.error(err);
        }
      });
    } catch (err) {
      console.error(err);
    }
  })
  .listen('127.0.0.1', 0, (token) => {
    if (!token) process.exit(1);
    console.log(`bare proxy listening on ${uWS.us_socket_local_port(token)}`);
  });
