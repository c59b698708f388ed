// An upstream account's own limits, exact across nodes (issue 36, deliverable 5): a deployment's
// requests per UTC minute are held with the leases that hold a key's (docs/leases.md), so the cluster
// as a whole never sends a deployment more than its rpm. Before, each node counted a deployment's
// minute on its own: two nodes sent a deployment limited to 60 requests a minute up to 120.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { assertRateLimitHeaders, assertShapeA, gatewayFixture } from '../helpers/gateway-fixture.js';
import { configYaml, type GatewayYaml } from '../helpers/config.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer, chatBody, minuteStart, request, setClock, type HttpResult } from '../helpers/http.js';
import { eventually } from '../helpers/data-plane.js';
import { cliJsonAsync } from '../helpers/processes.js';
import type { DemoKey } from '../helpers/console.js';

/** A weight that makes the limited deployment the first choice whenever it has room. */
const FIRST = 1_000_000_000;
const KEY_ENV = { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' };
/** 5 s into a minute on every node's injected clock: a 429 for the minute says retry after 55 s. */
const CLOCK = minuteStart() + 5_000;

const fakes: Record<string, FakeUpstream> = {};
after(() => Promise.all(Object.values(fakes).map((f) => f.close())));

function pooled(cfg: GatewayYaml, id: string, deployments: GatewayYaml[]): void {
  cfg.models.push({ id, provider: 'openai', kind: 'chat', input_usd_per_mtok: '0.50', output_usd_per_mtok: '1.50', timeout_ms: 10_000, deployments });
  cfg.tiers.paid.models.push(id);
}

const dep = (id: string, baseUrl: string, weight: number, extra: GatewayYaml = {}): GatewayYaml => ({ id, base_url: baseUrl, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', upstream_model: `up-${id}`, weight, ...extra });

const gw = gatewayFixture(async () => {
  for (const name of ['limited', 'spare', 'c1', 'c2', 'w']) fakes[name] = await startFakeUpstream();
  const yaml = configYaml((cfg) => {
    pooled(cfg, 'pool-lim', [dep('limited', fakes.limited.baseUrl, FIRST, { rpm: 60 }), dep('spare', fakes.spare.baseUrl, 1)]);
    pooled(cfg, 'pool-cap', [dep('c1', fakes.c1.baseUrl, 1, { rpm: 2 }), dep('c2', fakes.c2.baseUrl, 1, { rpm: 1 })]);
    // rpm 8 over two nodes: a standing share of 1 request per node (floor(8 / (4 × 2))).
    pooled(cfg, 'pool-wait', [dep('w', fakes.w.baseUrl, 1, { rpm: 8 })]);
  });
  const node = (i: number) => ({ nodeId: `node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' }, extraArgs: ['--report-every-ms', '0'] });
  return { controlPlane: { configYaml: yaml, env: KEY_ENV }, nodes: [node(0), node(1)] };
}, async (g) => {
  for (const n of g.nodes) await setClock(n.adminUrl!, { now_ms: CLOCK });
  await eventually(async () => (await g.console.listNodes()).nodes.filter((x) => x.connected).length === 2, 'both nodes connected');
});

const ask = (node: number, key: DemoKey, model: string): Promise<HttpResult> =>
  request(`${gw.nodes[node].url}/v1/chat/completions`, { method: 'POST', headers: bearer(key.key), json: chatBody('Hello', model) });

test('Upstream limits across two nodes: a deployment limited to 60 requests a minute receives at most 60 in a minute while clients send 200 over both nodes; the others are served by the other deployment', async () => {
  const key = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  // Each node sends its 100 one after the other (the limited deployment, idle on the node, is its
  // first choice each time), both nodes at once.
  const statuses: number[] = [];
  await Promise.all([0, 1].map(async (n) => {
    for (let i = 0; i < 100; i++) {
      const r = await ask(n, key, 'pool-lim');
      statuses.push(r.status);
      assert.equal(r.status, 200, `node ${n}, request ${i}: ${r.text}`);
    }
  }));
  assert.equal(statuses.length, 200);
  const limited = fakes.limited.requests.length;
  assert.ok(limited <= 60, `the limited deployment received ${limited} requests in one minute (its rpm is 60)`);
  // More than the two nodes' standing shares (7 each): the rest of its minute was leased as used.
  assert.ok(limited > 14, `the limited deployment received only ${limited}`);
  assert.equal(limited + fakes.spare.requests.length, 200, 'every other request went to the spare deployment');
});

test("All deployments at limit across two nodes: 429 Shape A naming the model's capacity, retry-after to the next minute, the key's rpm not charged, nothing billed", async () => {
  const key = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  // c1 (rpm 2) and c2 (rpm 1): 3 requests a minute for the whole cluster, whichever node sends them.
  const results: HttpResult[] = [];
  for (let i = 0; i < 8; i++) results.push(await ask(i % 2, key, 'pool-cap'));
  const served = results.filter((r) => r.status === 200).length;
  assert.equal(served, 3, `statuses: ${results.map((r) => r.status).join(' ')}`);
  assert.deepEqual([fakes.c1.requests.length, fakes.c2.requests.length], [2, 1]);
  for (const r of results.filter((x) => x.status !== 200)) {
    assertShapeA(r, 429, { message: /^Every upstream deployment of model pool-cap is at its capacity; retry after 55 s\.$/ });
    assert.equal(r.headers.get('retry-after'), '55', "to the top of the next minute on the node's clock");
  }
  // The key's own minute: a 429 for the model's capacity takes no request of it.
  const before = assertRateLimitHeaders((await ask(0, key, 'demo-chat')).headers).remainingRequests;
  assertShapeA(await ask(0, key, 'pool-cap'), 429, { message: /at its capacity/ });
  const afterIt = await ask(0, key, 'demo-chat');
  assert.equal(afterIt.status, 200, afterIt.text);
  assert.equal(assertRateLimitHeaders(afterIt.headers).remainingRequests, before - 1);
  // Billed: the 3 served requests (and the 2 demo-chat ones), never a refused one.
  let rows: { model: string; requests: number; cost_usd: string }[] = [];
  await eventually(async () => {
    rows = (await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['usage', '--project', key.projectId, '--by', 'model'])).rows;
    return rows.reduce((s, x) => s + x.requests, 0) >= 5;
  }, 'the served requests in usage');
  const cap = rows.find((x) => x.model === 'pool-cap');
  assert.equal(cap?.requests, 3, JSON.stringify(rows));
  assert.equal(rows.reduce((s, x) => s + x.requests, 0), 5, JSON.stringify(rows));
});

test("a request waits for a deployment's lease at most 250 ms, then is sent in advance of the answer; a client that leaves while it waits costs nothing", async () => {
  const key = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  const node = gw.nodes[0];
  const minute = Math.floor(CLOCK / 60_000);
  await eventually(async () => ((await request(`${node.adminUrl}/stats/leases`)).body as { standing: { minutes: number[] } }).standing.minutes.includes(minute), "the minute's standing shares");
  const before = assertRateLimitHeaders((await ask(0, key, 'demo-chat')).headers).remainingRequests;
  // The control plane stops answering (still connected): no lease can come.
  gw.cp.proc.child.kill('SIGSTOP');
  try {
    const first = await ask(0, key, 'pool-wait');
    assert.equal(first.status, 200, `the node's standing share of w: ${first.text}`);
    const gone = new AbortController();
    const abandoned = request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key.key), json: chatBody('Hello', 'pool-wait'), signal: gone.signal }).catch((e: Error) => e);
    setTimeout(() => gone.abort(), 50);
    const t0 = Date.now();
    const waited = await ask(0, key, 'pool-wait');
    // No answer within the bound is not the deployment's minute being spent: sent in advance, within
    // its rpm counted on this node (docs/leases.md), never a 429.
    assert.equal(waited.status, 200, waited.text);
    assert.ok(Date.now() - t0 < 2000, `waited ${Date.now() - t0} ms`);
    assert.ok((await abandoned) instanceof Error, 'the abandoned request got no answer');
  } finally {
    gw.cp.proc.child.kill('SIGCONT');
  }
  assert.equal(fakes.w.requests.length, 2, 'the one whose client left was never sent');
  // Nothing was taken of the key's minute by the abandoned request, and nothing billed for it.
  const afterIt = await ask(0, key, 'demo-chat');
  assert.equal(afterIt.status, 200, afterIt.text);
  assert.equal(assertRateLimitHeaders(afterIt.headers).remainingRequests, before - 3);
  let rows: { model: string; requests: number }[] = [];
  await eventually(async () => {
    rows = (await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['usage', '--project', key.projectId, '--by', 'model'])).rows;
    return rows.reduce((s, x) => s + x.requests, 0) >= 4;
  }, 'the served requests in usage');
  assert.deepEqual(rows.map((x) => [x.model, x.requests]).sort(), [['demo-chat', 2], ['pool-wait', 2]]);
});
