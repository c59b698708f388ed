// One caller's long-lived tool streams never make another caller's tool request wait: each request to
// a backend gets a connection of its own, as many as the keys' parallel limits allow in flight.
import assert from 'node:assert/strict';
import { request as httpRequest, type ClientRequest, type IncomingMessage } from 'node:http';
import { after, test } from 'node:test';
import { configYaml } from '../helpers/config.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { type DataPlane } from '../helpers/processes.js';
import { startFastApiBackend, type FastApiBackend } from '../helpers/fastapi-backend.js';

let backend: FastApiBackend;
let node: DataPlane;
let heavy: string;
let other: string;

gatewayFixture(
  async () => {
    backend = await startFastApiBackend('files');
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          cfg.tool_backends = [{ prefix: '/v1/files', base_url: backend.baseUrl, timeout_ms: 30_000 }];
          cfg.tiers.streams = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 1000, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };
          // Each request comes "from" its own client behind this proxy, so edge budgets stay out of the way.
          cfg.trusted_proxies = ['127.0.0.0/31'];
        }),
      },
    };
  },
  async (g) => {
    node = g.node;
    [heavy, other] = (await Promise.all([g.fundedKey({ tier: 'streams' }), g.fundedKey({ tier: 'streams' })])).map((k) => k.key);
  },
);
after(async () => {
  backend?.release();
  await backend?.close();
});

let clients = 0;
function get(path: string, key: string): { req: ClientRequest; head: Promise<IncomingMessage> } {
  clients++;
  const req = httpRequest(`${node.url}${path}`, { agent: false, headers: { authorization: `Bearer ${key}`, 'x-forwarded-for': `100.64.${clients >> 8}.${clients & 255}` } });
  const head = new Promise<IncomingMessage>((resolve, reject) => {
    req.on('response', resolve);
    req.on('error', reject);
  });
  req.end();
  return { req, head };
}

test("300 open downloads of one key do not hold up another key's request to the same backend", { timeout: 60_000 }, async () => {
  // Before: a backend URL had at most 256 connections, and a request waiting for one had no timeout:
  // one organisation's 256 long downloads (or MCP event streams) made every other caller's request to
  // that backend wait until one of them ended.
  const held: ClientRequest[] = [];
  const heads: Array<Promise<IncomingMessage>> = [];
  for (let i = 0; i < 300; i++) {
    const g = get('/v1/files/held', heavy);
    held.push(g.req);
    heads.push(g.head);
  }
  // Every held download has its head (the backend took them all at once).
  let timer: NodeJS.Timeout | undefined;
  const answered = await Promise.race([Promise.all(heads).then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), 20_000)))]);
  // Cleared: a timer left running would hold this file's process open for its 20 s after the last test.
  clearTimeout(timer);
  assert.ok(answered, `only ${backend.requests.length} of 300 downloads reached the backend`);
  const started = Date.now();
  const mine = await get('/v1/files/nope', other).head;
  mine.resume();
  assert.equal(mine.statusCode, 404, "the backend's own answer");
  assert.ok(Date.now() - started < 10_000, `answered after ${Date.now() - started} ms`);
  backend.release();
  for (const r of held) r.destroy();
});
