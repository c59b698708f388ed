// The reference for the node's hot path: a bare uWebSockets.js pass-through built on undici's
// dispatch API (no auth, no limits, no accounting), in its own process. Usage: bare-proxy.ts UPSTREAM_URL.
// Prints `bare proxy listening on PORT`.
import uWS from 'uWebSockets.js';
import { Pool } from 'undici';

const pool = new Pool(process.argv[2], { connections: 128, pipelining: 1 });

uWS
  .App()
  .any('/*', (res, req) => {
    const method = req.getMethod().toUpperCase();
    const path = req.getUrl();
    const headers: Record<string, string> = {};
    req.forEach((k, v) => {
      if (k !== 'host' && k !== 'connection') headers[k] = v;
    });
    let aborted = false;
    res.onAborted(() => (aborted = true));
    const chunks: Buffer[] = [];
    res.onData((ab, isLast) => {
      chunks.push(Buffer.from(ab.slice(0)));
      if (!isLast) return;
      let status = 200;
      const out: Buffer[] = [];
      let contentType = 'application/json';
      pool.dispatch(
        { method: method as 'POST', path, headers, body: Buffer.concat(chunks) },
        {
          onConnect() {},
          onError() {
            if (!aborted) res.cork(() => res.writeStatus('502 Bad Gateway').end());
          },
          onHeaders(statusCode: number, rawHeaders: Buffer[]) {
            status = statusCode;
            for (let i = 0; i < rawHeaders.length; i += 2) {
              if (rawHeaders[i].toString().toLowerCase() === 'content-type') contentType = rawHeaders[i + 1].toString();
            }
            return true;
          },
          onData(chunk: Buffer) {
            out.push(chunk);
            return true;
          },
          onComplete() {
            if (aborted) return;
            res.cork(() => res.writeStatus(String(status)).writeHeader('content-type', contentType).end(Buffer.concat(out)));
          },
        } as any,
      );
    });
  })
  .listen('127.0.0.1', 0, (token) => {
    if (!token) process.exit(1);
    console.log(`bare proxy listening on ${uWS.us_socket_local_port(token)}`);
  });
