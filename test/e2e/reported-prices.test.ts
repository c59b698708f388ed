// Prices by what the upstream reports (issue 34, deliverable 4; docs/billing.md#prices-by-what-the-upstream-reports).
// Before: `service_tier: "priority"` (about twice the standard price upstream), flex, the built-in
// tools (priced per call) and long prompts were all billed at the model's plain token prices, so any
// customer could buy priority processing at the standard price. Now the tier the answer reports, a
// prompt past the long-context threshold and each built-in tool call the output lists are priced as
// configured; a request naming a tier or tool its model has no price for is refused before the
// upstream is asked. Micro-dollars are read back through the CLI (`tollgate logs`).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import type { DemoKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { DEFAULT_ANSWER, startFakePricedUpstream, type FakePricedUpstream, type PricedAnswer } from '../helpers/fake-priced-upstream.js';
import { launchGateway, type Gateway } from '../helpers/gateway-fixture.js';
import { bearer, request, type HttpResult } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, stopAll } from '../helpers/processes.js';
import { formatUsd } from '../../proto/lib/money.js';
import { openRealtime } from '../helpers/realtime.js';

/** Prices, in micro-dollars per million tokens (what the config's USD amounts read as). */
const STD = { input: 1_000_000, output: 4_000_000, cached: 100_000 };
const PRIORITY = { input: 2_000_000, output: 8_000_000, cached: 200_000 };
const FLEX = { input: 500_000, output: 2_000_000, cached: 50_000 };
const LONG = { above: 1000, input: 2_000_000, output: 6_000_000 };
/** Per call (per container for code interpreter), micro-dollars. */
const TOOL = { web_search: 10_000, file_search: 2_500, code_interpreter: 30_000, image_generation: 40_000 };

/** A usage's cost at some token prices, rounded up once (proto/lib/money.ts). */
function tokens(a: PricedAnswer, p: { input: number; output: number; cached: number }): number {
  const cached = a.cachedTokens ?? 0;
  return Math.ceil(((a.inputTokens - cached) * p.input + cached * p.cached + a.outputTokens * p.output) / 1_000_000);
}

let up: FakePricedUpstream;
let gw: Gateway;

before(async () => {
  up = await startFakePricedUpstream();
  const usd = (micros: number) => formatUsd(micros);
  const yaml = configYaml((cfg) => {
    addUpstreamModel(cfg, 'up-priced', up.baseUrl, ['paid'], {
      input_usd_per_mtok: usd(STD.input),
      output_usd_per_mtok: usd(STD.output),
      cached_input_usd_per_mtok: usd(STD.cached),
      service_tiers: {
        priority: { input_usd_per_mtok: usd(PRIORITY.input), output_usd_per_mtok: usd(PRIORITY.output), cached_input_usd_per_mtok: usd(PRIORITY.cached) },
        flex: { input_usd_per_mtok: usd(FLEX.input), output_usd_per_mtok: usd(FLEX.output), cached_input_usd_per_mtok: usd(FLEX.cached) },
      },
      long_context: { above_input_tokens: LONG.above, input_usd_per_mtok: usd(LONG.input), output_usd_per_mtok: usd(LONG.output) },
      tool_calls_usd: { web_search: usd(TOOL.web_search), file_search: usd(TOOL.file_search), code_interpreter: usd(TOOL.code_interpreter), image_generation: usd(TOOL.image_generation) },
    });
    // The operator's vector store the file_search rows name (docs/configuration.md#responses).
    cfg.responses = { vector_stores: { paid: ['vs_1'] } };
    // Plain token prices only: no tier, no tool.
    addUpstreamModel(cfg, 'up-plain', up.baseUrl, ['paid'], { input_usd_per_mtok: usd(STD.input), output_usd_per_mtok: usd(STD.output) });
    // A pooled model whose one deployment bills at its own (priority's) prices.
    cfg.models.push({ id: 'up-pooled', provider: 'openai', kind: 'chat', timeout_ms: 10_000, input_usd_per_mtok: usd(STD.input), output_usd_per_mtok: usd(STD.output), cached_input_usd_per_mtok: usd(STD.cached), deployments: [{ id: 'dear', base_url: up.baseUrl, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', input_usd_per_mtok: usd(PRIORITY.input), output_usd_per_mtok: usd(PRIORITY.output), cached_input_usd_per_mtok: usd(PRIORITY.cached) }] });
    cfg.tiers.paid.models.push('up-pooled');
  });
  gw = await launchGateway({ controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } }, nodes: 2, node: { extraArgs: ['--report-every-ms', '0'] } });
});

after(async () => {
  await stopAll();
  await up?.close();
});

async function key(): Promise<DemoKey> {
  return gw.fundedKey({ tier: 'paid', creditMicros: 100_000_000 });
}

function post(k: DemoKey, path: string, json: Record<string, unknown>, node = gw.node): Promise<HttpResult> {
  return request(`${node.url}${path}`, { method: 'POST', headers: bearer(k.key), json });
}

/** The micro-dollars `tollgate logs` shows for one request. */
async function billed(k: DemoKey, requestId: string): Promise<number> {
  let cost: string | undefined;
  await eventually(async () => {
    const logs = (await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['logs', '--key', k.keyId])).logs as Array<{ request_id: string; cost_usd: string }>;
    cost = logs.find((l) => l.request_id === requestId)?.cost_usd;
    return cost !== undefined;
  }, `request ${requestId} logged`, 15_000);
  const [whole, frac = ''] = cost!.split('.');
  return Number(whole) * 1_000_000 + Number(frac.padEnd(6, '0'));
}

const chat = (extra: Record<string, unknown> = {}) => ({ model: 'up-priced', messages: [{ role: 'user', content: 'Hi' }], ...extra });
const responses = (extra: Record<string, unknown> = {}) => ({ model: 'up-priced', input: 'Hi', ...extra });

/** Sends one request with the upstream answering `answer`; returns the answer and what it was billed. */
async function run(path: string, body: Record<string, unknown>, answer: PricedAnswer): Promise<{ res: HttpResult; micros: number }> {
  up.answer = answer;
  const k = await key();
  const res = await post(k, path, body);
  assert.equal(res.status, 200, res.text);
  return { res, micros: await billed(k, res.headers.get('x-request-id')!) };
}

const TIER_ROWS: Array<{ name: string; requested?: string; reported?: string; prices: typeof STD }> = [
  { name: 'priority requested and reported', requested: 'priority', reported: 'priority', prices: PRIORITY },
  { name: 'flex requested and reported', requested: 'flex', reported: 'flex', prices: FLEX },
  { name: 'priority requested, default reported', requested: 'priority', reported: 'default', prices: STD },
  { name: 'auto requested, priority reported', requested: 'auto', reported: 'priority', prices: PRIORITY },
  // A tier the model has no prices for: the highest configured, part by part (priority's here).
  { name: 'scale reported', reported: 'scale', prices: PRIORITY },
  { name: 'no tier reported', prices: STD },
  // Before: an answer that reported no tier was billed at the standard prices whatever tier it asked
  // for, so an upstream (or a cut) that named none sold priority at the standard price.
  { name: 'priority requested, no tier reported', requested: 'priority', prices: PRIORITY },
];

for (const row of TIER_ROWS) {
  const expected = tokens(DEFAULT_ANSWER, row.prices);
  const extra = row.requested ? { service_tier: row.requested } : {};
  const answer = { ...DEFAULT_ANSWER, serviceTier: row.reported };
  test(`chat JSON, ${row.name}: bills ${expected} micro-dollars`, async () => {
    const { res, micros } = await run('/v1/chat/completions', chat(extra), answer);
    assert.equal(micros, expected);
    // The cost the answer shows is the one recorded, though its service_tier comes after its usage.
    assert.equal(Math.round(res.body.usage.cost * 1_000_000), expected);
  });
  test(`chat SSE, ${row.name}: bills ${expected} micro-dollars`, async () => {
    const { micros } = await run('/v1/chat/completions', chat({ ...extra, stream: true }), answer);
    assert.equal(micros, expected);
  });
  test(`responses JSON, ${row.name}: bills ${expected} micro-dollars`, async () => {
    const { res, micros } = await run('/v1/responses', responses(extra), answer);
    assert.equal(micros, expected);
    assert.equal(Math.round(res.body.usage.cost * 1_000_000), expected);
  });
  test(`responses SSE, ${row.name}: bills ${expected} micro-dollars`, async () => {
    const { micros } = await run('/v1/responses', responses({ ...extra, stream: true }), answer);
    assert.equal(micros, expected);
  });
}

/** What `tollgate logs` shows the key's one model call of `model` cost (a socket turn's id is the session's and its number). */
async function billedOfKey(k: DemoKey, model: string): Promise<number> {
  let cost: string | undefined;
  await eventually(async () => {
    const logs = (await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['logs', '--key', k.keyId])).logs as Array<{ model: string; cost_usd: string }>;
    cost = logs.find((l) => l.model === model)?.cost_usd;
    return cost !== undefined;
  }, `a ${model} call of ${k.keyId} logged`, 15_000);
  const [whole, frac = ''] = cost!.split('.');
  return Number(whole) * 1_000_000 + Number(frac.padEnd(6, '0'));
}

test('WebSocket mode: a turn is billed by the tier and tool calls its final event reports; an unpriced tier or tool is refused in-band, never forwarded', async () => {
  const k = await key();
  up.answer = { ...DEFAULT_ANSWER, serviceTier: 'priority', items: TOOL_ITEMS };
  const s = await openRealtime(gw.node.address, { key: k.key, model: 'up-priced', path: '/v1/responses' });
  s.session.send({ type: 'response.create', input: 'over the socket', service_tier: 'priority', tools: ALL_TOOLS });
  await s.session.waitFor('response.completed');
  const before = up.requests.length;
  s.session.send({ type: 'response.create', input: 'flex please', service_tier: 'scale' });
  const refused = await s.session.waitFor('error');
  assert.equal(refused.error.param, 'service_tier');
  s.ws.close(1000);
  await s.session.waitClosed();
  assert.equal(up.requests.length, before, 'the refused turn never went upstream');
  assert.equal(await billedOfKey(k, 'up-priced'), tokens(DEFAULT_ANSWER, PRIORITY) + TOOLS_COST);

  const plain = await openRealtime(gw.node.address, { key: k.key, model: 'up-plain', path: '/v1/responses' });
  plain.session.send({ type: 'response.create', input: 'search', tools: [{ type: 'web_search' }] });
  const noTool = await plain.session.waitFor('error');
  assert.equal(noTool.error.param, 'tools[0].type');
  plain.ws.close(1000);
  await plain.session.waitClosed();
  assert.equal(up.requests.length, before);
});

test('a background response: billed by its follower from the terminal response, by the tier and tool calls it reports', async () => {
  const k = await key();
  up.answer = { ...DEFAULT_ANSWER, serviceTier: 'priority', items: TOOL_ITEMS };
  const res = await post(k, '/v1/responses', responses({ background: true, service_tier: 'priority', tools: ALL_TOOLS }));
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body.status, 'queued');
  assert.equal(await billed(k, res.headers.get('x-request-id')!), tokens(DEFAULT_ANSWER, PRIORITY) + TOOLS_COST);
});

test('a prompt above the long-context threshold: the whole request at the long-context prices, on its tier too', async () => {
  const long = { inputTokens: 2000, cachedTokens: 0, outputTokens: 200 };
  const standard = await run('/v1/chat/completions', chat(), long);
  assert.equal(standard.micros, tokens(long, { input: LONG.input, output: LONG.output, cached: 0 }));
  // Priority above the threshold: the priority prices raised by the long-context ratio (2× in, 1.5× out).
  const priority = await run('/v1/responses', responses({ service_tier: 'priority' }), { ...long, serviceTier: 'priority' });
  assert.equal(priority.micros, tokens(long, { input: (PRIORITY.input * LONG.input) / STD.input, output: (PRIORITY.output * LONG.output) / STD.output, cached: 0 }));
  // At the threshold itself: standard prices.
  const at = { inputTokens: LONG.above, cachedTokens: 0, outputTokens: 200 };
  assert.equal((await run('/v1/chat/completions', chat(), at)).micros, tokens(at, STD));
});

const TOOL_ITEMS = [
  { type: 'web_search_call', id: 'ws_1', status: 'completed', action: { type: 'search', query: 'a' } },
  { type: 'web_search_call', id: 'ws_2', status: 'completed', action: { type: 'search', query: 'b' } },
  { type: 'file_search_call', id: 'fs_1', status: 'completed', queries: ['q'], results: null },
  { type: 'code_interpreter_call', id: 'ci_1', status: 'completed', container_id: 'cntr_1', code: 'print(1)', outputs: null },
  { type: 'code_interpreter_call', id: 'ci_2', status: 'completed', container_id: 'cntr_1', code: 'print(2)', outputs: null },
  { type: 'code_interpreter_call', id: 'ci_3', status: 'completed', container_id: 'cntr_2', code: 'print(3)', outputs: null },
  { type: 'image_generation_call', id: 'ig_1', status: 'completed', result: 'iVBORw0KGgo=' },
];
const ALL_TOOLS = [{ type: 'web_search' }, { type: 'file_search', vector_store_ids: ['vs_1'] }, { type: 'code_interpreter', container: { type: 'auto' } }, { type: 'image_generation' }];
/** Two searches, one file search, two containers (three calls), one image. */
const TOOLS_COST = 2 * TOOL.web_search + TOOL.file_search + 2 * TOOL.code_interpreter + TOOL.image_generation;

for (const stream of [false, true]) {
  test(`responses ${stream ? 'SSE' : 'JSON'}: each built-in tool call the output lists is billed, code interpreter per container`, async () => {
    const { micros } = await run('/v1/responses', responses({ tools: ALL_TOOLS, stream }), { ...DEFAULT_ANSWER, items: TOOL_ITEMS });
    assert.equal(micros, tokens(DEFAULT_ANSWER, STD) + TOOLS_COST);
  });
}

test('responses: one tool call of each kind, each at its own price', async () => {
  for (const item of TOOL_ITEMS.filter((i) => ['ws_1', 'fs_1', 'ci_1', 'ig_1'].includes(i.id))) {
    const { micros } = await run('/v1/responses', responses({ tools: ALL_TOOLS }), { ...DEFAULT_ANSWER, items: [item] });
    const tool = item.type.replace(/_call$/, '') as keyof typeof TOOL;
    assert.equal(micros, tokens(DEFAULT_ANSWER, STD) + TOOL[tool], item.type);
  }
});

test('chat with web_search_options: one web search billed', async () => {
  const { micros } = await run('/v1/chat/completions', chat({ web_search_options: {} }), DEFAULT_ANSWER);
  assert.equal(micros, tokens(DEFAULT_ANSWER, STD) + TOOL.web_search);
});

test('a tier or built-in tool the model has no price for is refused 400 naming it; the upstream is never asked', async () => {
  const k = await key();
  const cases: Array<[string, Record<string, unknown>, string]> = [
    ['/v1/chat/completions', { model: 'up-plain', messages: [{ role: 'user', content: 'Hi' }], service_tier: 'priority' }, 'service_tier'],
    ['/v1/chat/completions', { model: 'up-plain', messages: [{ role: 'user', content: 'Hi' }], service_tier: 'flex', stream: true }, 'service_tier'],
    ['/v1/responses', { model: 'up-plain', input: 'Hi', service_tier: 'scale' }, 'service_tier'],
    ['/v1/responses', { model: 'up-plain', input: 'Hi', tools: [{ type: 'function', name: 'f', parameters: {} }, { type: 'web_search_preview' }] }, 'tools[1].type'],
    ['/v1/responses', { model: 'up-plain', input: 'Hi', tools: [{ type: 'code_interpreter', container: { type: 'auto' } }] }, 'tools[0].type'],
    ['/v1/chat/completions', { model: 'up-plain', messages: [{ role: 'user', content: 'Hi' }], web_search_options: {} }, 'web_search_options'],
  ];
  const before = up.requests.length;
  for (const [path, body, param] of cases) {
    const r = await post(k, path, body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.body.error.param, param);
    assert.equal(r.body.error.type, 'invalid_request_error');
  }
  assert.equal(up.requests.length, before, 'the upstream was never asked');
  // auto and default need no price of their own.
  up.answer = DEFAULT_ANSWER;
  for (const tier of ['auto', 'default']) assert.equal((await post(k, '/v1/chat/completions', { model: 'up-plain', messages: [{ role: 'user', content: 'Hi' }], service_tier: tier })).status, 200);
});

test('the worst case reserved before admission counts the tier: priority is refused where standard fits', async () => {
  // A key limited to $0.01: 2,000 output tokens fit at 4 $/Mtok (8,000 µ$ and the input), not at 8 $/Mtok.
  const k = await key();
  const created = await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['key', 'create', '--project', k.projectId, '--limit-usd', '0.01']);
  const limited: DemoKey = { ...k, key: created.key, keyId: created.id };
  for (const n of gw.nodes) await waitUntilKnown(n.url, created.key);
  up.answer = { inputTokens: 5, outputTokens: 5 };
  const before = up.requests.length;
  const priority = await post(limited, '/v1/chat/completions', chat({ max_tokens: 2000, service_tier: 'priority' }));
  assert.equal(priority.status, 401, priority.text);
  assert.equal(priority.body.error.type, 'insufficient_quota');
  assert.equal(up.requests.length, before, 'refused before the upstream');
  const standard = await post(limited, '/v1/chat/completions', chat({ max_tokens: 2000 }));
  assert.equal(standard.status, 200, standard.text);
});

test('tollgate models list shows every price: tiers, long context, tools', async () => {
  const out = await cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, ['models', 'list']);
  const m = out.models.find((x: any) => x.id === 'up-priced');
  assert.deepEqual(m.service_tiers, {
    priority: { input_usd_per_mtok: '2.00', output_usd_per_mtok: '8.00', cached_input_usd_per_mtok: '0.20' },
    flex: { input_usd_per_mtok: '0.50', output_usd_per_mtok: '2.00', cached_input_usd_per_mtok: '0.05' },
  });
  assert.deepEqual(m.long_context, { above_input_tokens: 1000, input_usd_per_mtok: '2.00', output_usd_per_mtok: '6.00' });
  assert.deepEqual(m.tool_calls_usd, { web_search: '0.01', file_search: '0.0025', code_interpreter: '0.03', image_generation: '0.04' });
  const plain = out.models.find((x: any) => x.id === 'up-plain');
  assert.deepEqual(plain.service_tiers, {});
  assert.equal(plain.long_context, null);
  assert.deepEqual(plain.tool_calls_usd, {});
  const table = await runCliAsync(gw.cp, gw.cp.secrets.operatorToken, ['models', 'list']);
  assert.equal(table.code, 0, table.stderr);
  const line = table.stdout.split('\n').find((l) => l.startsWith('up-priced'))!;
  assert.match(line, /priority 2\.00\/8\.00\/0\.20 flex 0\.50\/2\.00\/0\.05/);
  assert.match(line, /above 1000: 2\.00\/6\.00/);
  assert.match(line, /web_search 0\.01 file_search 0\.0025 code_interpreter 0\.03 image_generation 0\.04/);
});

// Before: a stream that ended without its usage (cut by the upstream, or its client gone before the
// final event) was billed its estimate at the standard prices, whatever tier it asked for: a client
// could ask for priority, read the answer and leave before the usage, and pay half.
for (const [what, path, body] of [
  ['chat SSE', '/v1/chat/completions', chat({ stream: true })],
  ['responses SSE', '/v1/responses', responses({ stream: true })],
] as const) {
  test(`${what} cut before its usage: billed its estimate at the tier it asked for, not the standard prices`, async () => {
    const cut: PricedAnswer = { ...DEFAULT_ANSWER, cut: true };
    const standard = await run(path, body, cut);
    const priority = await run(path, { ...body, service_tier: 'priority' }, cut);
    assert.ok(standard.micros > 0, 'the estimate is billed');
    // The same estimate (service_tier counts no token) at priority's prices, twice the standard's here.
    assert.equal(priority.micros, 2 * standard.micros);
  });
}

test('WebSocket mode: a turn cut before its final event is billed at the tier it asked for', async () => {
  const cost = async (tier: Record<string, string>) => {
    const k = await key();
    up.answer = { ...DEFAULT_ANSWER, cut: true };
    const s = await openRealtime(gw.node.address, { key: k.key, model: 'up-priced', path: '/v1/responses' });
    s.session.send({ type: 'response.create', input: 'cut short', ...tier });
    await s.session.waitFor('response.output_text.delta');
    s.ws.close(1000);
    await s.session.waitClosed();
    return billedOfKey(k, 'up-priced');
  };
  const standard = await cost({});
  assert.ok(standard > 0);
  assert.equal(await cost({ service_tier: 'priority' }), 2 * standard);
});

// Before: a compaction's tier was neither checked nor billed: a tier the model has no price for went
// upstream, and a compaction that ran on priority was billed at the standard prices.
test('a compaction: a tier the model has no price for is refused 400; the tier it reports is billed', async () => {
  const k = await key();
  const before = up.requests.length;
  const refused = await post(k, '/v1/responses/compact', { model: 'up-plain', input: 'Hi', service_tier: 'priority' });
  assert.equal(refused.status, 400, refused.text);
  assert.deepEqual([refused.body.error.type, refused.body.error.param], ['invalid_request_error', 'service_tier']);
  assert.equal(up.requests.length, before, 'the upstream was never asked');
  const compact = (extra: Record<string, unknown>) => ({ model: 'up-priced', input: 'Hi', ...extra });
  const priority = await run('/v1/responses/compact', compact({ service_tier: 'priority' }), { ...DEFAULT_ANSWER, serviceTier: 'priority' });
  assert.equal(priority.micros, tokens(DEFAULT_ANSWER, PRIORITY));
  assert.equal(Math.round(priority.res.body.usage.cost * 1_000_000), tokens(DEFAULT_ANSWER, PRIORITY));
  const downgraded = await run('/v1/responses/compact', compact({ service_tier: 'priority' }), { ...DEFAULT_ANSWER, serviceTier: 'default' });
  assert.equal(downgraded.micros, tokens(DEFAULT_ANSWER, STD));
});

// Before: a WebSocket-mode turn cut before its final event (the client closed the socket) billed its
// token estimate only: the built-in tool calls the upstream had begun were never counted, though an
// HTTP stream cut alike counts them from `response.output_item.added`.
test('WebSocket mode: a turn cut before its final event bills the built-in tool calls begun', async () => {
  const cost = async (items: PricedAnswer['items']) => {
    const k = await key();
    up.answer = { ...DEFAULT_ANSWER, items, cut: true };
    const s = await openRealtime(gw.node.address, { key: k.key, model: 'up-priced', path: '/v1/responses' });
    s.session.send({ type: 'response.create', input: 'search then stop', tools: ALL_TOOLS });
    await s.session.waitFor('response.output_text.delta');
    s.ws.close(1000);
    await s.session.waitClosed();
    return billedOfKey(k, 'up-priced');
  };
  // The same request and the same text: the difference is the calls alone.
  assert.equal((await cost(TOOL_ITEMS)) - (await cost([])), TOOLS_COST);
});

// Before: a pooled model's compaction went to its first deployment, as its creates do, but was billed
// at the model's own prices, not at the prices that deployment overrides (a create's were).
test("a pooled model's compaction is billed at the prices of the deployment that served it, as its create is", async () => {
  const expected = tokens(DEFAULT_ANSWER, PRIORITY);
  const create = await run('/v1/responses', { model: 'up-pooled', input: 'Hi' }, DEFAULT_ANSWER);
  assert.equal(create.micros, expected);
  const compact = await run('/v1/responses/compact', { model: 'up-pooled', input: 'Hi' }, DEFAULT_ANSWER);
  assert.equal(compact.micros, expected);
  assert.equal(Math.round(compact.res.body.usage.cost * 1_000_000), expected);
});

// Before: a chat stream's tier was read from its usage chunk only, so a stream cut before it (the
// client gone) was billed at the standard prices though every chunk said it ran on priority (a
// request for `auto` the upstream ran on priority).
test('chat SSE cut before its usage: billed at the tier its chunks report', async () => {
  const standard = await run('/v1/chat/completions', chat({ stream: true }), { ...DEFAULT_ANSWER, cut: true });
  const reported = await run('/v1/chat/completions', chat({ stream: true, service_tier: 'auto' }), { ...DEFAULT_ANSWER, cut: true, serviceTier: 'priority' });
  assert.ok(standard.micros > 0);
  assert.equal(reported.micros, 2 * standard.micros);
});
