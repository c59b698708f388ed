// A tool backend for tests that answers as a FastAPI service does: `{"detail": "Not Found"}` for an
// unknown path, 422 with a list of field errors, 500 with a detail. It records what it received, can
// hang before its headers, stream a download of any size at the pace its reader allows (counting
// what it wrote), count an upload as it streams in (never holding it), and hold a download open
// until released.
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

export interface FastApiRequest {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  rawHeaders: string[];
  /** The body as text, for small bodies (uploads to /v1/files/upload are counted, not kept). */
  body: string;
}

export interface FastApiBackend {
  baseUrl: string;
  port: number;
  name: string;
  requests: FastApiRequest[];
  /** Bytes of the current or last download written to the socket so far. */
  downloadWritten: number;
  /** Every request answers nothing (never sends headers) until released. */
  hang: boolean;
  clear(): void;
  /** Ends every held download (`/v1/files/held`). */
  release(): void;
  /** Resolves once `n` requests have arrived in total. */
  waitForRequests(n: number): Promise<void>;
  /** Stops listening and drops every connection (a stopped backend: connections are refused). */
  close(): Promise<void>;
}

export const VALIDATION_ERROR = { detail: [{ type: 'missing', loc: ['body', 'purpose'], msg: 'Field required', input: {} }] };
export const SERVER_ERROR = { detail: 'The backend failed on this input: corrupt upload.' };

const CHUNK = Buffer.alloc(1024 * 1024, 0x61);

export async function startFastApiBackend(name = 'fastapi'): Promise<FastApiBackend> {
  const sockets = new Set<Socket>();
  let releaseHeld: Array<() => void> = [];
  let waiters: Array<() => void> = [];
  const b: FastApiBackend = {
    baseUrl: '',
    port: 0,
    name,
    requests: [],
    downloadWritten: 0,
    hang: false,
    clear() {
      b.requests.length = 0;
    },
    release() {
      const r = releaseHeld;
      releaseHeld = [];
      for (const f of r) f();
    },
    waitForRequests(n) {
      return new Promise((resolve) => {
        const check = () => {
          if (b.requests.length >= n) {
            waiters = waiters.filter((w) => w !== check);
            resolve();
          }
        };
        waiters.push(check);
        check();
      });
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };

  const json = (res: import('node:http').ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'x-backend': name });
    res.end(text);
  };

  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    const record = (body: string) => {
      b.requests.push({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, body });
      for (const w of [...waiters]) w();
    };
    if (b.hang) {
      record('');
      return;
    }
    // A streamed upload: counted and hashed as it arrives.
    if (url.pathname === '/v1/files/upload' && req.method === 'POST') {
      const hash = createHash('sha256');
      let bytes = 0;
      req.on('data', (c: Buffer) => {
        bytes += c.length;
        hash.update(c);
      });
      req.on('end', () => {
        record('');
        json(res, 200, { id: 'file-upload', object: 'file', bytes, sha256: hash.digest('hex'), backend: name });
      });
      return;
    }
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      record(Buffer.concat(parts).toString('utf8'));
      // A download of `?bytes=N` bytes of "a", written only as fast as the reader takes it.
      const dl = /^\/v1\/files\/[^/]+\/content$/.exec(url.pathname);
      if (dl && req.method === 'GET') {
        const total = Number(url.searchParams.get('bytes') ?? '1024');
        b.downloadWritten = 0;
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total, 'x-backend': name });
        const pump = () => {
          while (b.downloadWritten < total) {
            const n = Math.min(CHUNK.length, total - b.downloadWritten);
            b.downloadWritten += n;
            if (!res.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) return void res.once('drain', pump);
          }
          res.end();
        };
        res.on('error', () => {});
        pump();
        return;
      }
      switch (url.pathname) {
        case '/v1/files':
          if (req.method === 'GET') return json(res, 200, { object: 'list', data: [], backend: name });
          return json(res, 405, { detail: 'Method Not Allowed' });
        case '/v1/files/validate':
          return json(res, 422, VALIDATION_ERROR);
        case '/v1/files/boom':
          return json(res, 500, SERVER_ERROR);
        case '/v1/files/held': {
          // A download that sends its head and a first chunk, then waits for release().
          res.writeHead(200, { 'content-type': 'application/octet-stream', 'x-backend': name });
          res.write('first chunk\n');
          releaseHeld.push(() => res.end('last chunk\n'));
          res.on('close', () => {});
          return;
        }
        case '/v1/files/events': {
          res.writeHead(200, { 'content-type': 'text/event-stream', 'x-backend': name });
          res.write('data: {"n":1}\n\n');
          releaseHeld.push(() => res.end('data: {"n":2}\n\n'));
          return;
        }
        case '/v1/pdf':
        case '/v1/pdf/render':
          return json(res, 200, { object: 'pdf', received_bytes: Buffer.concat(parts).length, backend: name });
        case '/v1/mcp':
        case '/v1/skills':
          return json(res, 200, { path: req.url, backend: name });
        default:
          return json(res, 404, { detail: 'Not Found' });
      }
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  b.port = (server.address() as AddressInfo).port;
  b.baseUrl = `http://127.0.0.1:${b.port}`;
  return b;
}
