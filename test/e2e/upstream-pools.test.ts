// Upstream pools (issue 36): a model served by several deployments. A connect refused, a timeout
// before the head, an upstream 503 or 429 moves the request to another deployment before any byte
// reached the client; the client sees one answer and one x-request-id, the request log both attempts
// and the deployment that served, the money is recorded once at the serving deployment's prices.
// After the first byte there is no failover. Consecutive failures open a deployment's circuit, a
// half-open probe closes it; a 429's retry-after cools its deployment (the node's clock is injected).
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { parse, stringify } from 'yaml';
import { after, test } from 'node:test';
import { assertRateLimitHeaders, assertShapeA, gatewayFixture } from '../helpers/gateway-fixture.js';
import { configYaml, type GatewayYaml } from '../helpers/config.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { startFakeResponsesUpstream, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { bearer, chatBody, minuteStart, request, setClock } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync } from '../helpers/processes.js';
import { scrapeMetrics } from '../helpers/prometheus.js';
import { usageRowsOfKey } from '../helpers/usage-db.js';
import { eventually } from '../helpers/data-plane.js';
import type { DemoKey } from '../helpers/console.js';

/** A weight that makes the first deployment the first choice (the draw picks another once in 10^9). */
const FIRST = 1_000_000_000;
const KEY_ENV = { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' };

const fakes: Record<string, FakeUpstream> = {};
/** Two Responses upstreams, the two accounts of pool-aff: each keeps only what was created on it. */
let affA: FakeResponsesUpstream;
let affB: FakeResponsesUpstream;
/** The Responses upstream of pool-compact, whose deployments have their own prices. */
let priced: FakeResponsesUpstream;
// The fakes hold connections (a stalled answer) that would keep the file's process alive.
after(() => Promise.all([...Object.values(fakes), affA, affB, priced].map((f) => f?.close())));
let clock = minuteStart() + 5_000;

function pooled(cfg: GatewayYaml, id: string, deployments: GatewayYaml[], extra: GatewayYaml = {}): void {
  cfg.models.push({ id, provider: 'openai', kind: 'chat', input_usd_per_mtok: '0.50', output_usd_per_mtok: '1.50', timeout_ms: 10_000, deployments, ...extra });
  cfg.tiers.paid.models.push(id);
}

const dep = (id: string, baseUrl: string, weight = 1, extra: GatewayYaml = {}): GatewayYaml => ({ id, base_url: baseUrl, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', upstream_model: `up-${id}`, weight, ...extra });

const gw = gatewayFixture(async () => {
  for (const name of ['ok', 'e503', 'e429', 'stall', 'cut', 'flaky']) fakes[name] = await startFakeUpstream();
  affA = await startFakeResponsesUpstream();
  affB = await startFakeResponsesUpstream();
  priced = await startFakeResponsesUpstream();
  fakes.e503.setMode('error-503');
  fakes.e429.setMode('error-429');
  fakes.e429.retryAfter = '30';
  fakes.stall.setMode('stall');
  fakes.cut.setMode('reset-mid-body');
  fakes.flaky.setMode('error-503');
  // The serving deployment's own prices: 2 $/Mtok in, 4 $/Mtok out (the model's are 0.50 and 1.50).
  const ok = (id = 'ok') => dep(id, fakes.ok.baseUrl, 1, { input_usd_per_mtok: '2.00', output_usd_per_mtok: '4.00' });
  const yaml = configYaml((cfg) => {
    pooled(cfg, 'pool-refused', [dep('dead', 'http://127.0.0.1:1/v1', FIRST), ok()]);
    pooled(cfg, 'pool-503', [dep('busy', fakes.e503.baseUrl, FIRST), ok()]);
    pooled(cfg, 'pool-429', [dep('limited', fakes.e429.baseUrl, FIRST), ok()]);
    pooled(cfg, 'pool-slow', [dep('slow', fakes.stall.baseUrl, FIRST), ok()], { timeout_ms: 400, failover_timeout_ms: 5_000 });
    pooled(cfg, 'pool-cut', [dep('cut', fakes.cut.baseUrl, FIRST), ok()]);
    pooled(cfg, 'pool-circuit', [dep('flaky', fakes.flaky.baseUrl, FIRST), ok()], { circuit_failures: 2, circuit_cooldown_ms: 10_000 });
    // B is listed first and weighs most, but takes one request a minute: past it, A serves.
    pooled(cfg, 'pool-aff', [dep('aff-b', affB.baseUrl, FIRST, { rpm: 1 }), dep('aff-a', affA.baseUrl, 1, { input_usd_per_mtok: '3.00', output_usd_per_mtok: '6.00' })]);
    cfg.responses = { conversations_model: 'pool-aff' };
    const cmp = (id: string, weight: number, inUsd: string, outUsd: string) => dep(id, priced.baseUrl, weight, { input_usd_per_mtok: inUsd, output_usd_per_mtok: outUsd });
    pooled(cfg, 'pool-compact', [cmp('cmp-a', FIRST, '3.00', '6.00'), cmp('cmp-b', 1, '1.00', '2.00')]);
    pooled(cfg, 'pool-full', [dep('a', fakes.ok.baseUrl, 1, { rpm: 1 }), dep('b', fakes.ok.baseUrl, 1, { rpm: 1 })]);
  });
  return {
    controlPlane: { configYaml: yaml, env: KEY_ENV },
    node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' }, extraArgs: ['--report-every-ms', '0'] },
  };
}, async (g) => {
  await setClock(g.node.adminUrl!, { now_ms: clock });
});

async function advance(ms: number): Promise<void> {
  clock += ms;
  await setClock(gw.node.adminUrl!, { now_ms: clock });
}

let key: DemoKey;
async function paidKey(): Promise<DemoKey> {
  key ??= await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  return key;
}

async function ask(model: string, body: unknown = chatBody('Hello', model)) {
  const k = await paidKey();
  return request(`${gw.node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: body });
}

/** The request's row as `tollgate logs --json` prints it. */
async function logOf(requestId: string): Promise<Record<string, unknown>> {
  const k = await paidKey();
  for (let i = 0; i < 100; i++) {
    const { logs } = await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['logs', '--key', k.keyId, '--all']);
    const row = (logs as Record<string, unknown>[]).find((l) => l.request_id === requestId);
    if (row) return row;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`no log row for ${requestId}`);
}

for (const [model, first, outcome] of [
  ['pool-refused', 'dead', 'refused'],
  ['pool-503', 'busy', '503'],
  ['pool-slow', 'slow', 'timeout'],
] as const) {
  test(`${model}: ${outcome} before the head moves the request to the other deployment; one answer, one x-request-id, both attempts logged, billed once at its prices`, async () => {
    const before = fakes.ok.requests.length;
    const r = await ask(model);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.choices[0].message.content, 'Hello from the fake upstream.');
    const id = r.headers.get('x-request-id');
    assert.match(id ?? '', /\S+/);
    assert.equal(fakes.ok.requests.length, before + 1);
    // The serving deployment's upstream model, not the first one's.
    assert.equal(fakes.ok.requests.at(-1)!.body.model, 'up-ok');
    const row = await logOf(id!);
    assert.equal(row.status, 200);
    assert.equal(row.deployment, 'ok');
    assert.equal(row.attempts, `${first}:${outcome} ok:200`);
    // 11 tokens in at 2 $/Mtok + 6 out at 4 $/Mtok = 46 µ$: the ok deployment's prices.
    assert.equal(row.cost_usd, '0.000046');
    const usage = (await usageRowsOfKey(gw.cp.dbPath, key.keyId)).filter((u) => u.request_id === id);
    assert.equal(usage.length, 1, 'recorded once');
    assert.equal(usage[0].cost_micros, 46);
    assert.equal(usage[0].model, model);
    // The money ledger, through the CLI: one request of the model, billed once.
    const byModel = await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['usage', '--project', key.projectId, '--by', 'model']);
    const mine = (byModel.rows as { model: string; requests: number; cost_usd: string }[]).find((x) => x.model === model);
    assert.deepEqual([mine?.requests, mine?.cost_usd], [1, '0.000046']);
  });
}

test("pool-429: an upstream 429 fails over, and its retry-after cools that deployment for that long (the node's clock)", async () => {
  const limited = fakes.e429;
  const r1 = await ask('pool-429');
  assert.equal(r1.status, 200, r1.text);
  assert.equal(limited.requests.length, 1);
  assert.equal((await logOf(r1.headers.get('x-request-id')!)).attempts, 'limited:429 ok:200');
  // Cooling for 30 s: not tried at all.
  const r2 = await ask('pool-429');
  assert.equal(r2.status, 200);
  assert.equal(limited.requests.length, 1);
  assert.equal((await logOf(r2.headers.get('x-request-id')!)).attempts, 'ok:200');
  await advance(30_000);
  limited.setMode('normal');
  const r3 = await ask('pool-429');
  assert.equal(r3.status, 200);
  assert.equal(limited.requests.length, 2);
  assert.equal((await logOf(r3.headers.get('x-request-id')!)).deployment, 'limited');
});

test('no failover after the first byte: a stream cut mid-way ends with an error event, nothing spliced in', async () => {
  const before = fakes.ok.requests.length;
  const r = await ask('pool-cut', { model: 'pool-cut', stream: true, messages: [{ role: 'user', content: 'Hello' }] });
  assert.equal(r.status, 200);
  assert.match(r.text, /Hello/);
  assert.match(r.text, /The upstream failed in the middle of the stream\./);
  assert.doesNotMatch(r.text, /\[DONE\]/);
  assert.equal(fakes.ok.requests.length, before, 'the other deployment was never asked');
  const row = await logOf(r.headers.get('x-request-id')!);
  assert.equal(row.deployment, 'cut');
  assert.equal(row.attempts, 'cut:200');
});

test('the circuit opens after the configured failures and a half-open probe closes it once the upstream recovers', async () => {
  const flaky = fakes.flaky;
  for (let i = 0; i < 2; i++) assert.equal((await ask('pool-circuit')).status, 200);
  assert.equal(flaky.requests.length, 2);
  // Open: the flaky deployment is passed over however heavy its weight.
  const open = await ask('pool-circuit');
  assert.equal(open.status, 200);
  assert.equal(flaky.requests.length, 2);
  assert.equal((await logOf(open.headers.get('x-request-id')!)).attempts, 'ok:200');
  flaky.setMode('normal');
  await advance(10_000);
  // Half-open: the next real request probes it, and its success closes the circuit.
  const probe = await ask('pool-circuit');
  assert.equal(probe.status, 200);
  assert.equal(flaky.requests.length, 3);
  assert.equal((await logOf(probe.headers.get('x-request-id')!)).attempts, 'flaky:200');
  const closed = await ask('pool-circuit');
  assert.equal(closed.status, 200);
  assert.equal(flaky.requests.length, 4);
});

test("every deployment at its own limits: 429 naming the model's capacity, retry-after to the next minute, the key's rpm not charged", async () => {
  const served = new Set<string>();
  let last = await ask('pool-full');
  for (const r of [last, (last = await ask('pool-full'))]) {
    assert.equal(r.status, 200, r.text);
    served.add((await logOf(r.headers.get('x-request-id')!)).deployment as string);
  }
  assert.deepEqual([...served].sort(), ['a', 'b'], 'one request each, then both are at rpm 1');
  const before = assertRateLimitHeaders(last.headers).remainingRequests;
  const full = await ask('pool-full');
  assertShapeA(full, 429, { message: /Every upstream deployment of model pool-full is at its capacity; retry after \d+ s\./ });
  assert.equal(full.headers.get('retry-after'), String(Math.ceil((60_000 - (clock % 60_000)) / 1000)));
  // Given back whole: the next request finds one more request of the key's minute left than it would.
  const after = await ask('demo-chat', chatBody('Hello', 'demo-chat'));
  assert.equal(after.status, 200);
  assert.equal(assertRateLimitHeaders(after.headers).remainingRequests, before - 1);
  const row = await logOf(full.headers.get('x-request-id')!);
  assert.deepEqual([row.status, row.cost_usd, row.model], [429, '0.00', null]);
});

test('a reload with a bad deployment is refused naming the model and the field; the old config stays and serves', async () => {
  const path = gw.cp.configPath!;
  const good = readFileSync(path, 'utf8');
  const bad = parse(good);
  const m = bad.models.find((x: { id: string }) => x.id === 'pool-503');
  m.deployments[1].id = m.deployments[0].id;
  writeFileSync(path, stringify(bad));
  try {
    await assert.rejects(gw.console.reloadConfig(), (e: Error & { details?: string }) => {
      assert.match(e.details ?? e.message, /old config kept: .*: model pool-503\.deployments\[1\]\.id: "busy" is listed twice/);
      return true;
    });
  } finally {
    writeFileSync(path, good);
  }
  const r = await ask('pool-503');
  assert.equal(r.status, 200, r.text);
  assert.equal((await logOf(r.headers.get('x-request-id')!)).attempts, 'busy:503 ok:200');
});

test('/metrics shows each deployment: requests, errors by kind, failovers, circuit state, in flight and its minute', async () => {
  const m = await scrapeMetrics(`${gw.node.adminUrl}/metrics`);
  const at = (model: string, deployment: string) => ({ model, deployment });
  // pool-503: its busy deployment answered 503 twice (the failover test and the reload test), each failed over.
  assert.equal(m.value('tollgate_node_deployment_requests_total', at('pool-503', 'busy')), 2);
  assert.equal(m.value('tollgate_node_deployment_errors_total', { ...at('pool-503', 'busy'), kind: '5xx' }), 2);
  assert.equal(m.value('tollgate_node_deployment_failovers_total', at('pool-503', 'busy')), 2);
  assert.equal(m.value('tollgate_node_deployment_errors_total', { ...at('pool-refused', 'dead'), kind: 'refused' }), 1);
  assert.equal(m.value('tollgate_node_deployment_errors_total', { ...at('pool-slow', 'slow'), kind: 'timeout' }), 1);
  assert.equal(m.value('tollgate_node_deployment_errors_total', { ...at('pool-429', 'limited'), kind: '429' }), 1);
  // The flaky deployment's circuit closed again after its probe: 0 closed, 1 half-open, 2 open.
  assert.equal(m.value('tollgate_node_deployment_circuit', at('pool-circuit', 'flaky')), 0);
  assert.equal(m.value('tollgate_node_deployment_in_flight', at('pool-circuit', 'flaky')), 0);
  // Each of pool-full's deployments sent its one request of this minute (rpm 1).
  assert.equal(m.value('tollgate_node_deployment_minute_requests', at('pool-full', 'a')), 1);
});

test("a pooled model's compaction is billed at the serving deployment's prices, and a count names its deployment", async () => {
  // Before, compaction and counts bypassed the pool: billed at the model's own prices (0.00075 here).
  const k = await paidKey();
  const c = await request(`${gw.node.url}/v1/responses/compact`, { method: 'POST', headers: bearer(k.key), json: { model: 'pool-compact', input: 'A long history.' } });
  assert.equal(c.status, 200, c.text);
  assert.equal(c.body.object, 'response.compaction');
  assert.equal(priced.requests.at(-1)!.body.model, 'up-cmp-a');
  // 900 in at 3 $/Mtok + 200 out at 6 $/Mtok (COMPACT_USAGE), at cmp-a's prices.
  assert.equal(c.body.usage.cost, 0.0039);
  const row = await logOf(c.headers.get('x-request-id')!);
  assert.deepEqual([row.deployment, row.attempts, row.cost_usd], ['cmp-a', 'cmp-a:200', '0.0039']);
  const usage = (await usageRowsOfKey(gw.cp.dbPath, k.keyId)).filter((u) => u.request_id === c.headers.get('x-request-id'));
  assert.deepEqual(usage.map((u) => [u.model, u.cost_micros]), [['pool-compact', 3900]]);
  const n = await request(`${gw.node.url}/v1/responses/input_tokens`, { method: 'POST', headers: bearer(k.key), json: { model: 'pool-compact', input: 'How long?' } });
  assert.equal(n.status, 200, n.text);
  assert.equal(n.body.input_tokens, 42);
  const nRow = await logOf(n.headers.get('x-request-id')!);
  assert.deepEqual([nRow.deployment, nRow.cost_usd], ['cmp-a', '0.00']);
});

// Issue 36, affinity: a stored response, a conversation, a background response lives in the upstream
// account that created it. Before, every Responses request of a pooled model went to its first
// deployment, so a response created elsewhere would have been a 404 from the wrong account.
// Last in the file: it moves the node's clock a minute on (the metrics test reads this minute's counts).
test('affinity: a stored response created on deployment A is read and chained through A only, a conversation too; A down is a 503 naming it, never B', async () => {
  const k = await paidKey();
  const post = (path: string, json: unknown) => request(`${gw.node.url}${path}`, { method: 'POST', headers: bearer(k.key), json });
  const get = (path: string) => request(`${gw.node.url}${path}`, { headers: bearer(k.key) });
  await advance(60_000 - (clock % 60_000));
  // B by its weight, then (B at its rpm) A.
  const r1 = await post('/v1/responses', { model: 'pool-aff', input: 'Hello' });
  assert.equal(r1.status, 200, r1.text);
  assert.equal(affB.requests.length, 1);
  const r2 = await post('/v1/responses', { model: 'pool-aff', input: 'Hello' });
  assert.equal(r2.status, 200, r2.text);
  const conv = await post('/v1/conversations', { items: [{ role: 'user', content: 'Hi' }] });
  assert.equal(conv.status, 200, conv.text);
  assert.deepEqual([affA.requests.length, affB.requests.length], [2, 1]);
  assert.equal(affA.requests[0].body.model, 'up-aff-a');
  const row = await logOf(r2.headers.get('x-request-id')!);
  assert.deepEqual([row.deployment, row.attempts], ['aff-a', 'aff-a:200']);
  // 1,200 in at 3 $/Mtok + 300 out at 6 $/Mtok: A's prices (the model's own would give 0.00105).
  assert.equal(row.cost_usd, '0.0054');
  assert.equal(r2.body.usage.cost, 0.0054);

  // The next minute B has room again and weighs a billion times A: only affinity sends these to A.
  await advance(60_000);
  const read = await get(`/v1/responses/${r2.body.id}`);
  assert.equal(read.status, 200, read.text);
  assert.equal(read.body.id, r2.body.id);
  assert.equal((await get(`/v1/responses/${r2.body.id}/input_items`)).status, 200);
  const chained = await post('/v1/responses', { model: 'pool-aff', input: 'And then?', previous_response_id: r2.body.id });
  assert.equal(chained.status, 200, chained.text);
  assert.equal(affA.requests.at(-1)!.body.previous_response_id, r2.body.id);
  assert.equal((await get(`/v1/conversations/${conv.body.id}`)).status, 200);
  const inConv = await post('/v1/responses', { model: 'pool-aff', input: 'More', conversation: conv.body.id });
  assert.equal(inConv.status, 200, inConv.text);
  assert.equal(affA.requests.at(-1)!.body.conversation, conv.body.id);
  const count = await post('/v1/responses/input_tokens', { conversation: conv.body.id, input: 'How long?' });
  assert.equal(count.status, 200, count.text);
  assert.deepEqual([affA.requests.length, affB.requests.length], [8, 1], 'all six on A, none on B');
  // And what B created is read on B.
  const onB = await get(`/v1/responses/${r1.body.id}`);
  assert.equal(onB.status, 200, onB.text);
  assert.equal(affB.requests.length, 2);

  // The deployment travels with the owner record: a second node, whose own choice would be B (room,
  // weight), reads r2 and its conversation on A.
  const n2 = await gw.addNode({ adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' }, extraArgs: ['--report-every-ms', '0'] });
  await setClock(n2.adminUrl!, { now_ms: clock });
  const onN2 = (path: string) => request(`${n2.url}${path}`, { headers: bearer(k.key) });
  await eventually(async () => (await onN2(`/v1/responses/${r2.body.id}`)).status === 200, 'r2 read on node 2');
  assert.equal((await onN2(`/v1/conversations/${conv.body.id}`)).status, 200);
  assert.deepEqual([affA.requests.length, affB.requests.length], [10, 2], 'node 2 asked A twice, B never');

  // A background response (created on A: B used its one request this minute) is followed on A and
  // billed there from its final usage, not read on B (a 404 there would bill it safely above).
  const bg = await post('/v1/responses', { model: 'pool-aff', input: 'Slowly', background: true });
  assert.equal(bg.status, 200, bg.text);
  assert.equal(bg.body.status, 'queued');
  affA.background.finish(bg.body.id);
  const bgId = bg.headers.get('x-request-id');
  let billed: { cost_micros: number }[] = [];
  await eventually(async () => (billed = (await usageRowsOfKey(gw.cp.dbPath, k.keyId)).filter((u) => u.request_id === bgId)).length === 1, 'the background response billed');
  assert.equal(billed[0].cost_micros, 5400, "A's prices, its final usage");
  assert.ok(affA.requests.some((x) => x.method === 'GET' && x.url === `/v1/responses/${bg.body.id}`), 'followed on A');
  assert.equal(affB.requests.length, 2, 'never on B');

  // The operator drains A: new work goes elsewhere, but what lives on A is still read there. Disabled,
  // A takes nothing: what lives there is a 503 naming it, never B's 404. Before, a drained A was a 503 too.
  const cli = (args: string[]) => runCliAsync(gw.cp, gw.cp.secrets.operatorToken, args);
  assert.equal((await cli(['models', 'drain', 'pool-aff', 'aff-a'])).code, 0);
  const beforeDrainRead = affA.requests.length;
  const drainedRead = await get(`/v1/responses/${r2.body.id}`);
  assert.equal(drainedRead.status, 200, drainedRead.text);
  assert.equal(affA.requests.length, beforeDrainRead + 1, 'read on the drained A');
  assert.equal((await cli(['models', 'disable', 'pool-aff', 'aff-a'])).code, 0);
  const disabledRead = await get(`/v1/responses/${r2.body.id}`);
  assertShapeA(disabledRead, 503, { type: 'api_error', message: /lives on an upstream deployment of model pool-aff that is unavailable/ });
  assert.equal(affA.requests.length, beforeDrainRead + 1, 'nothing sent to the disabled A');
  assert.equal((await cli(['models', 'enable', 'pool-aff', 'aff-a'])).code, 0);

  // A gone: what lives there is a clear 503, never a 404 from B's account.
  await affA.close();
  const down = await get(`/v1/responses/${r2.body.id}`);
  assertShapeA(down, 503, { type: 'api_error', message: /lives on an upstream deployment of model pool-aff that is unavailable/ });
  const downChain = await post('/v1/responses', { model: 'pool-aff', input: 'Again', previous_response_id: r2.body.id });
  assertShapeA(downChain, 503, { message: /lives on an upstream deployment of model pool-aff that is unavailable/ });
  assert.equal(affB.requests.length, 2, 'B was never asked');
  const downRow = await logOf(downChain.headers.get('x-request-id')!);
  assert.deepEqual([downRow.status, downRow.cost_usd], [503, '0.00']);
});
