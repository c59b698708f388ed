// A tool backend for tests (plain node:http): records every request exactly as it arrived (method, the
// raw request target, headers, raw header lines, body) and answers 200 with a small JSON body.
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { Socket } from 'node:net';
import { listenLocal } from './http.js';

export interface RecordedRequest {
  method: string;
  /** The request target as sent on the request line: path and query, not decoded or normalised. */
  path: string;
  headers: IncomingMessage['headers'];
  /** [name, value, name, value, …] as received, repeated header lines kept apart. */
  rawHeaders: string[];
  body: string;
}

export interface RecordingBackend {
  /** base_url for a `tool_backends` entry. */
  baseUrl: string;
  requests: RecordedRequest[];
  /** Every value of a header across its lines, in order (names compared case-insensitively). */
  headerLines(r: RecordedRequest, name: string): string[];
  clear(): void;
  close(): Promise<void>;
}

export async function startRecordingBackend(): Promise<RecordingBackend> {
  const requests: RecordedRequest[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const path = req.url ?? '';
      requests.push({ method: req.method ?? '', path, headers: req.headers, rawHeaders: req.rawHeaders, body: Buffer.concat(parts).toString('utf8') });
      const text = JSON.stringify({ backend: 'recording', path });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  const port = await listenLocal(server);
  return {
    baseUrl: `http://127.0.0.1:${port}`,
    requests,
    headerLines(r, name) {
      const out: string[] = [];
      for (let i = 0; i < r.rawHeaders.length; i += 2) if (r.rawHeaders[i].toLowerCase() === name) out.push(r.rawHeaders[i + 1]);
      return out;
    },
    clear() {
      requests.length = 0;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
