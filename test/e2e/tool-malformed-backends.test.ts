// Tool backends that answer badly: the client gets a 502 upstream_unreachable (Shape B, no backend
// address) for a head that is garbage, too large, too slow or self-contradicting; an answer with a
// status uWS has no text for passes through; headers the backend names in Connection stay between the
// backend and the node.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { rawRequest } from '../helpers/http.js';
import { startToolGateway } from '../helpers/tool-gateway.js';
import { stopAll, type DataPlane } from '../helpers/processes.js';

const HEADER_TIMEOUT_MS = 1500;
let node: DataPlane;
let key: string;
let backend: net.Server;
let backendAddress = '';

/** How the raw backend answers each path (it reads one request head, answers, and closes). */
const ANSWERS: Record<string, (s: net.Socket) => void> = {
  '/v1/files/garbage': (s) => s.end('HELLO THERE\r\n\r\n'),
  '/v1/files/huge-head': (s) => {
    s.write('HTTP/1.1 200 OK\r\n');
    for (let i = 0; i < 2000; i++) s.write(`x-h${i}: ${'a'.repeat(100)}\r\n`);
    s.end('\r\n');
  },
  '/v1/files/slow-head': (s) => {
    s.write('HTTP/1.1 200 OK\r\n');
    const t = setInterval(() => (s.writable ? s.write('x') : clearInterval(t)), 100);
    s.on('close', () => clearInterval(t));
  },
  '/v1/files/two-lengths': (s) => s.end('HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!'),
  '/v1/files/status-999': (s) => s.end('HTTP/1.1 999 Weird\r\ncontent-length: 2\r\n\r\nok'),
  '/v1/files/connection-header': (s) => s.end('HTTP/1.1 200 OK\r\nconnection: x-internal, close\r\nx-internal: backend secret\r\nx-public: yes\r\ncontent-length: 2\r\n\r\nok'),
};

before(async () => {
  backend = net.createServer((s) => {
    let head = '';
    s.on('error', () => {});
    s.on('data', (d) => {
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      const path = /^\w+ (\S+)/.exec(head)?.[1] ?? '';
      head = '';
      const answer = ANSWERS[path];
      if (answer) answer(s);
      else s.end('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n');
    });
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  backendAddress = `127.0.0.1:${(backend.address() as net.AddressInfo).port}`;
  ({ node, key } = await startToolGateway([{ prefix: '/v1/files', base_url: `http://${backendAddress}`, timeout_ms: HEADER_TIMEOUT_MS }]));
});
after(async () => {
  await stopAll();
  backend?.close();
});

async function get(path: string): Promise<{ status: number; head: string; body: string; ms: number }> {
  const started = Date.now();
  const r = await rawRequest(node.address, `GET ${path} HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n\r\n`, undefined, {});
  const split = r.text.indexOf('\r\n\r\n');
  return { status: r.status, head: r.text.slice(0, split), body: r.text.slice(split + 4), ms: Date.now() - started };
}

test('a garbage, oversized, endless or self-contradicting head from the backend is a 502 upstream_unreachable naming no address', async () => {
  for (const path of ['/v1/files/garbage', '/v1/files/huge-head', '/v1/files/slow-head', '/v1/files/two-lengths']) {
    const r = await get(path);
    assert.equal(r.status, 502, `${path}: ${r.head}`);
    const body = JSON.parse(r.body);
    assert.equal(body.error.code, 'upstream_unreachable', path);
    assert.ok(!r.body.includes(backendAddress) && !r.body.includes('127.0.0.1'), `${path}: ${r.body}`);
    // The slow head is cut at the header timeout, with room for a loaded machine.
    assert.ok(r.ms < HEADER_TIMEOUT_MS + 10_000, `${path}: ${r.ms} ms`);
  }
});

test('a status with no standard text passes through', async () => {
  const r = await get('/v1/files/status-999');
  assert.equal(r.status, 999);
  assert.equal(r.body, 'ok');
});

test('headers the backend names in its Connection header do not reach the client', async () => {
  // Before: `x-internal`, which the backend declared hop-by-hop, was passed on to the client.
  const r = await get('/v1/files/connection-header');
  assert.equal(r.status, 200, r.head);
  assert.doesNotMatch(r.head, /x-internal/i);
  assert.match(r.head, /\r\nx-public: yes\r\n/);
  assert.equal(r.body, 'ok');
});
