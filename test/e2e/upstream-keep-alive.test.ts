// Kept-alive upstream connections (issue 21, finding 15). Before the fix a node kept an idle upstream
// connection for 30 s while servers such as Node's and uvicorn close theirs after 5 s without saying
// so, and a request sent on a connection the server was closing at that moment failed with 502.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { bearer } from '../helpers/http.js';
import { stopAll, type DataPlane } from '../helpers/processes.js';
import { startToolGateway } from '../helpers/tool-gateway.js';

/** How the fake backend treats a request that arrives on a connection that already served one. */
let onReused: 'answer' | 'close' = 'answer';
const SERVER_IDLE_MS = 5_000;
let server: Server;
let node: DataPlane;
let key: string;
const served = new WeakMap<Socket, number>();
/** Per connection: who ended it first. */
const ends: Array<{ by: 'client' | 'server'; idleMs: number }> = [];
let lastAnswerAt = 0;

before(async () => {
  server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const n = (served.get(req.socket) ?? 0) + 1;
    served.set(req.socket, n);
    if (n > 1 && onReused === 'close') {
      // What the node sees when the server's idle timer fires as its request goes out: the connection
      // closes with no answer.
      req.socket.destroy();
      return;
    }
    req.resume();
    req.on('end', () => {
      // As uvicorn does: keep-alive without a Keep-Alive header saying for how long (Node would add
      // `Keep-Alive: timeout=5`, which undici honours, unless Connection is set by hand).
      res.writeHead(200, { 'content-type': 'application/json', connection: 'keep-alive' });
      res.end(JSON.stringify({ n }));
      lastAnswerAt = performance.now();
    });
  });
  server.keepAliveTimeout = SERVER_IDLE_MS;
  server.on('connection', (socket: Socket) => {
    let ended = false;
    // The client's FIN arrives as 'end'; the server's own idle timeout destroys the socket first otherwise.
    socket.on('end', () => {
      if (!ended) ends.push({ by: 'client', idleMs: performance.now() - lastAnswerAt });
      ended = true;
    });
    socket.on('close', () => {
      if (!ended) ends.push({ by: 'server', idleMs: performance.now() - lastAnswerAt });
      ended = true;
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  ({ node, key } = await startToolGateway([{ prefix: '/v1/files', base_url: `http://127.0.0.1:${port}`, timeout_ms: 10_000 }]));
});
after(async () => {
  await stopAll();
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

test('an idle upstream connection is closed by the node before the server closes it', async () => {
  onReused = 'answer';
  const before = ends.length;
  const res = await fetch(`${node.url}/v1/files/a`, { headers: bearer(key) });
  assert.equal(res.status, 200);
  await res.arrayBuffer();
  // Wait for that connection to end (by either side), then ask who ended it.
  await new Promise<void>((resolve) => {
    const check = setInterval(() => {
      if (ends.length > before) {
        clearInterval(check);
        resolve();
      }
    }, 50);
  });
  const end = ends[before];
  assert.equal(end.by, 'client', `the node let the connection idle until the server closed it (${Math.round(end.idleMs)} ms)`);
  assert.ok(end.idleMs < SERVER_IDLE_MS, `idle ${Math.round(end.idleMs)} ms`);
});

test('a GET whose reused connection closes before any answer is sent again on a new one; a POST is not', async () => {
  onReused = 'close';
  // Two requests in a row: the second goes out on the connection the first used, which the backend closes.
  const first = await fetch(`${node.url}/v1/files/b`, { headers: bearer(key) });
  assert.equal(first.status, 200);
  await first.arrayBuffer();
  const second = await fetch(`${node.url}/v1/files/b`, { headers: bearer(key) });
  assert.equal(second.status, 200, 'sent again on a new connection');
  assert.deepEqual(await second.json(), { n: 1 });
  // A POST may have been acted on: it is not sent twice, and the client gets the 502.
  const post = await fetch(`${node.url}/v1/files/c`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body: '{}' });
  assert.equal(post.status, 200);
  await post.arrayBuffer();
  const again = await fetch(`${node.url}/v1/files/c`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body: '{}' });
  assert.equal(again.status, 502);
  assert.equal(((await again.json()) as any).error.code, 'upstream_unreachable');
  onReused = 'answer';
});
