// The cluster script's load balancer (cli/load-balancer.ts) against plain HTTP backends on loopback:
// round robin, X-Forwarded-For appended, a refused connection skipped with the request body intact,
// streaming answers passed through; and which addresses count as loopback for the plaintext warnings.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { after, test } from 'node:test';
import { startLoadBalancer, type LoadBalancer } from '../../cli/load-balancer.js';
import { isLoopbackAddress } from '../../proto/lib/tls.js';

const closers: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of closers) await c();
});

async function backend(name: string): Promise<{ address: string; server: Server }> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-backend': name });
      res.end(JSON.stringify({ name, xff: req.headers['x-forwarded-for'], body: Buffer.concat(chunks).toString(), method: req.method, url: req.url }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(() => new Promise((resolve) => server.close(() => resolve())));
  return { address: `127.0.0.1:${(server.address() as { port: number }).port}`, server };
}

/** An address nothing listens on: a port the OS gave and took back. */
async function deadAddress(): Promise<string> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as { port: number }).port;
  await new Promise((resolve) => s.close(resolve));
  return `127.0.0.1:${port}`;
}

async function lbWith(backends: string[]): Promise<LoadBalancer> {
  const lines: string[] = [];
  const lb = await startLoadBalancer({ listen: '127.0.0.1:0', backends, log: (l) => lines.push(l) });
  closers.push(() => lb.close());
  return lb;
}

test('round robin over the nodes, with the client address appended to X-Forwarded-For', async () => {
  const [a, b, c] = await Promise.all([backend('a'), backend('b'), backend('c')]);
  const lb = await lbWith([a.address, b.address, c.address]);
  const seen: string[] = [];
  for (let i = 0; i < 6; i++) {
    const r = await fetch(`http://${lb.address}/v1/models?x=${i}`, { headers: { 'x-forwarded-for': '203.0.113.9' } });
    const body = (await r.json()) as { name: string; xff: string; url: string };
    seen.push(body.name);
    assert.equal(body.xff, '203.0.113.9, 127.0.0.1');
    assert.equal(body.url, `/v1/models?x=${i}`);
    assert.equal(r.headers.get('x-backend'), body.name);
  }
  assert.deepEqual(seen, ['a', 'b', 'c', 'a', 'b', 'c']);
});

test('a node that refuses the connection is skipped, and the request body reaches the next one whole', async () => {
  const dead = await deadAddress();
  const live = await backend('live');
  const lb = await lbWith([dead, live.address]);
  const payload = JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'x'.repeat(200_000) }] });
  for (let i = 0; i < 4; i++) {
    const r = await fetch(`http://${lb.address}/v1/chat/completions`, { method: 'POST', body: payload, headers: { 'content-type': 'application/json' } });
    assert.equal(r.status, 200);
    const body = (await r.json()) as { name: string; body: string; method: string };
    assert.equal(body.name, 'live');
    assert.equal(body.method, 'POST');
    assert.equal(body.body, payload);
  }
});

test('no node reachable: 502 in the gateway error shape', async () => {
  const lb = await lbWith([await deadAddress(), await deadAddress()]);
  const r = await fetch(`http://${lb.address}/v1/models`);
  assert.equal(r.status, 502);
  assert.deepEqual(await r.json(), { error: { code: 'upstream_unreachable', message: 'no gateway node is reachable' } });
});

test('loopback addresses (no plaintext warning) and the rest', () => {
  const table: [string, boolean][] = [
    ['127.0.0.1:50051', true],
    ['127.10.20.30:1', true],
    ['localhost:50051', true],
    ['[::1]:50051', true],
    ['10.0.0.5:50051', false],
    ['0.0.0.0:50051', false],
    ['cp.internal:50051', false],
    ['[fd00::1]:50051', false],
    ['127.0.0.1.evil.example:50051', false],
  ];
  for (const [address, loopback] of table) assert.equal(isLoopbackAddress(address), loopback, address);
});
