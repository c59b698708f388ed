// The Responses API (`/v1/responses`) through real processes: the official openai client against the
// demo provider (offline) and against a fake OpenAI-compatible upstream with known usage; stored
// responses readable only by the project that created them; every refusal in Shape A.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { tokenCostMicros } from '../../proto/lib/money.js';
import { countTokens, estimateTextTokens, estimateTokens } from '../../data-plane/proxy/tokens.js';
import { configYaml, addUpstreamModel } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { BIG_OUTPUT_BYTES, startFakeResponsesUpstream, USAGE, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { bearer, request, type HttpResult } from '../helpers/http.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { ROOT, runCliAsync, runProcessAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageTotals } from '../helpers/usage-db.js';
import { openRealtime } from '../helpers/realtime.js';

const IN_PRICE = 500_000; // up-chat: 0.50 USD per million input tokens
const OUT_PRICE = 1_500_000;
const CACHED_PRICE = 50_000; // cached_input_usd_per_mtok: 0.05
/** What one answer with the fake upstream's USAGE costs: the cached tokens at the cached price, reasoning inside output. */
const USAGE_COST = Math.ceil(
  ((USAGE.input_tokens - USAGE.input_tokens_details.cached_tokens) * IN_PRICE + USAGE.input_tokens_details.cached_tokens * CACHED_PRICE + USAGE.output_tokens * OUT_PRICE) / 1_000_000,
);

let cp: ControlPlane;
let node: DataPlane;
let upstream: FakeResponsesUpstream;
let a: DemoKey; // project A
let aDemoOnly: DemoKey; // project A, allowed_models: demo-chat only
let b: DemoKey; // project B, same organisation
let billed: DemoKey; // project C: only the fake upstream's traffic, for exact billing

function client(k: DemoKey): OpenAI {
  return new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
}

/** The CLI as a process, with --json and the operator's token, without blocking this process. */
async function cliJsonAsync(args: string[]): Promise<any> {
  const r = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', ...args]);
  assert.equal(r.code, 0, `tollgate ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

function assertShapeA(r: HttpResult, status: number, param: string | null | undefined, what: string): void {
  assert.equal(r.status, status, `${what}: ${r.text}`);
  assert.equal(typeof r.body?.error?.message, 'string', what);
  assert.equal(r.body.error.code, String(status), what);
  if (param !== undefined) assert.equal(r.body.error.param, param, what);
}

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid'], { cached_input_usd_per_mtok: '0.05' })),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' },
      },
    };
  },
  async (g) => {
    ({ cp, node } = g);
    a = await g.fundedKey();
    aDemoOnly = await g.fundedKey({ orgId: a.orgId, projectId: a.projectId, allowedModels: ['demo-chat'] });
    b = await g.fundedKey({ orgId: a.orgId });
    billed = await g.fundedKey({ orgId: a.orgId });
  },
);
after(async () => {
  await upstream?.close();
});

test('demo provider: client.responses.create answers with text output and usage', async () => {
  const r = await client(a).responses.create({ model: 'demo-chat', input: 'Hello there, gateway!' });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'completed');
  assert.equal(r.model, 'demo-chat');
  assert.match(r.output_text, /Hello there, gateway!/);
  // "Hello there, gateway!" is Hello / there / , / gateway / ! = 5 tokens.
  assert.equal(r.usage?.input_tokens, 5);
  assert.equal(r.usage?.output_tokens, countTokens(r.output_text));
  assert.equal(r.usage?.total_tokens, 5 + countTokens(r.output_text));
  assert.equal(r.usage?.input_tokens_details.cached_tokens, 0);
});

test('demo provider: stream: true sends the Responses event types, usage in response.completed', async () => {
  const stream = await client(a).responses.create({ model: 'demo-chat', input: [{ role: 'user', content: 'Tell me something' }], stream: true });
  const types: string[] = [];
  let text = '';
  let completed: OpenAI.Responses.Response | undefined;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') completed = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[types.length - 1], 'response.completed');
  assert.ok(types.filter((t) => t === 'response.output_text.delta').length >= 2, types.join(','));
  for (const t of ['response.in_progress', 'response.output_item.added', 'response.content_part.added', 'response.output_text.done', 'response.output_item.done']) assert.ok(types.includes(t), t);
  assert.match(text, /Tell me something/);
  assert.equal(completed?.usage?.input_tokens, 3);
  assert.equal(completed?.output_text ?? text, text);
});

test('stored responses: the creating project reads, lists input items and deletes; previous_response_id works', async () => {
  const ca = client(a);
  const r = await ca.responses.create({ model: 'demo-chat', input: 'Remember me' });
  const got = await ca.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text, r.output_text);
  const items = await ca.responses.inputItems.list(r.id);
  assert.equal(items.data.length, 1);
  const next = await ca.responses.create({ model: 'demo-chat', input: 'And again', previous_response_id: r.id });
  assert.equal(next.previous_response_id, r.id);
  // The demo answers in the foreground: nothing to cancel (OpenAI cancels background responses only).
  assertShapeA(await request(`${node.url}/v1/responses/${r.id}/cancel`, { method: 'POST', headers: bearer(a.key) }), 400, null, 'cancel of a finished response');
  const del = await request(`${node.url}/v1/responses/${r.id}`, { method: 'DELETE', headers: bearer(a.key) });
  assert.equal(del.status, 200, del.text);
  assert.deepEqual(del.body, { id: r.id, object: 'response', deleted: true });
  assertShapeA(await request(`${node.url}/v1/responses/${r.id}`, { headers: bearer(a.key) }), 404, null, 'read after delete');
});

test("a key of project B gets 404 for project A's response on every stored path and in previous_response_id", async () => {
  const r = await client(a).responses.create({ model: 'demo-chat', input: 'Private to A' });
  const paths: Array<[string, string]> = [
    ['GET', `/v1/responses/${r.id}`],
    ['GET', `/v1/responses/${r.id}/input_items`],
    ['DELETE', `/v1/responses/${r.id}`],
    ['POST', `/v1/responses/${r.id}/cancel`],
  ];
  for (const [method, path] of paths) {
    const res = await request(`${node.url}${path}`, { method, headers: bearer(b.key) });
    assertShapeA(res, 404, null, `${method} ${path} by B`);
    assert.equal(res.body.error.message.includes(r.id), true);
  }
  const prev = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { model: 'demo-chat', input: 'hi', previous_response_id: r.id } });
  assertShapeA(prev, 404, 'previous_response_id', 'previous_response_id by B');
  // An id nobody created answers the same.
  assertShapeA(await request(`${node.url}/v1/responses/resp_nobody`, { headers: bearer(b.key) }), 404, null, 'unknown id');
  // A still reads it (deleted by nobody above).
  const got = await request(`${node.url}/v1/responses/${r.id}`, { headers: bearer(a.key) });
  assert.equal(got.status, 200, got.text);
});

test("a key whose allowed_models excludes a stored response's model cannot read it", async () => {
  const r = await client(a).responses.create({ model: 'up-chat', input: 'from the upstream' });
  const before = upstream.requests.length;
  assertShapeA(await request(`${node.url}/v1/responses/${r.id}`, { headers: bearer(aDemoOnly.key) }), 404, null, 'model outside allowed_models');
  assertShapeA(await request(`${node.url}/v1/responses/${r.id}`, { headers: bearer(b.key) }), 404, null, 'other project');
  assert.equal(upstream.requests.length, before, 'the upstream was never asked');
  const got = await request(`${node.url}/v1/responses/${r.id}/input_items`, { headers: bearer(a.key) });
  assert.equal(got.status, 200, got.text);
  assert.equal(upstream.requests[upstream.requests.length - 1].url, `/v1/responses/${r.id}/input_items`);
  assert.equal(upstream.requests[upstream.requests.length - 1].headers.authorization, 'Bearer sk-upstream-test');
});

test('an OpenAI-compatible upstream: forwarded with the model spliced, billed from its usage (cached and reasoning tokens), read back by model', async () => {
  const c = client(billed);
  const body = { model: 'up-chat', input: [{ role: 'user' as const, content: 'Hi "there"' }], instructions: 'Be brief.', max_output_tokens: 50, metadata: { k: 'v' } };
  const r = await c.responses.create(body);
  assert.equal(r.output_text, 'Upstream says hello.');
  // The answer says what it cost, as chat's do: the upstream's usage with `cost` (USD) written in.
  assert.deepEqual(r.usage, { ...USAGE, cost: USAGE_COST / 1e6 });
  const sent = upstream.requests[upstream.requests.length - 1];
  assert.equal(sent.url, '/v1/responses');
  const { safety_identifier: safetyId, ...forwarded } = sent.body;
  assert.deepEqual(forwarded, { ...body, model: 'upstream-up-chat' });
  // Whose request it is, for the upstream's safety systems: the project's identifier (docs/safety-identifier.md).
  assert.match(safetyId, /^tg_[A-Za-z0-9_-]{22}$/);

  const stream = await c.responses.create({ model: 'up-chat', input: 'stream it', stream: true });
  let final: OpenAI.Responses.Response | undefined;
  for await (const ev of stream) if (ev.type === 'response.completed') final = ev.response;
  assert.deepEqual(final?.usage, { ...USAGE, cost: USAGE_COST / 1e6 });

  // Both billed from the upstream's usage: input tokens (the cached ones at the model's cached price,
  // not the input price) and output tokens, reasoning included.
  const rows = await waitForUsageTotals(cp.dbPath, billed.keyId, 2);
  const cost = USAGE_COST;
  assert.notEqual(cost, tokenCostMicros(USAGE.input_tokens, USAGE.output_tokens, IN_PRICE, OUT_PRICE), 'the cached price differs from the input price');
  assert.deepEqual(
    rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens, x.cost_micros]),
    [['up-chat', 2, 2 * USAGE.input_tokens, 2 * USAGE.output_tokens, 2 * cost]],
  );
  const own = await request(`${node.url}/v1/usage?group_by=model`, { headers: bearer(billed.key) });
  assert.equal(own.status, 200, own.text);
  assert.deepEqual(
    own.body.data.map((x: any) => [x.model, x.requests, x.input_tokens, x.output_tokens, x.cost_micros]),
    [['up-chat', 2, 2 * USAGE.input_tokens, 2 * USAGE.output_tokens, 2 * cost]],
  );
  const u = await cliJsonAsync(['usage', '--project', billed.projectId, '--by', 'model']);
  assert.deepEqual(
    u.rows.map((x: any) => [x.model, x.requests, x.input_tokens, x.output_tokens]),
    [['up-chat', 2, 2 * USAGE.input_tokens, 2 * USAGE.output_tokens]],
  );
  // The request log holds each response's id (the JSON one and the streamed one).
  let logs: any[] = [];
  await eventually(async () => (logs = (await cliJsonAsync(['logs', '--key', billed.keyId])).logs.filter((l: any) => l.path === '/v1/responses')).length >= 2, 'two Responses log rows');
  assert.deepEqual(logs.map((l) => l.response_id).sort(), [r.id, final!.id].sort());
  assert.deepEqual(logs.map((l) => [l.model, l.prompt_tokens, l.completion_tokens]), [['up-chat', USAGE.input_tokens, USAGE.output_tokens], ['up-chat', USAGE.input_tokens, USAGE.output_tokens]]);
});

test('a JSON answer over 4 MiB is billed from the upstream\'s usage, its usage.cost written in', async () => {
  // Before the fix the Responses reader read no usage from a JSON answer over 4 MiB: the request was
  // billed the gateway's own estimate (its input, no output) instead of what the upstream served.
  const k = await gw.fundedKey({ orgId: a.orgId });
  upstream.setMode('big-json');
  let r: HttpResult;
  try {
    r = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: 'a long answer please' } });
  } finally {
    upstream.setMode('normal');
  }
  assert.equal(r.status, 200);
  assert.equal(r.body.output[0].content[0].text.length, BIG_OUTPUT_BYTES);
  assert.match(r.body.id, /^resp_/);
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
  assert.deepEqual(
    rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens, x.cost_micros]),
    [['up-chat', 1, USAGE.input_tokens, USAGE.output_tokens, USAGE_COST]],
  );
  assert.deepEqual(r.body.usage, { ...USAGE, cost: USAGE_COST / 1e6 });
  // Its id was recorded as the project's own while the answer went through.
  assert.equal((await request(`${node.url}/v1/responses/${r.body.id}`, { headers: bearer(k.key) })).status, 200);
});

test('an upstream failing mid-stream: the input and the output streamed so far are billed, as for chat', async () => {
  const k = await gw.fundedKey({ orgId: a.orgId });
  upstream.setMode('cut-stream');
  try {
    const res = await fetch(`${node.url}/v1/responses`, { method: 'POST', headers: { ...bearer(k.key), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'up-chat', input: 'cut me off', stream: true }) });
    assert.equal(res.status, 200);
    await res.text().catch(() => '');
  } finally {
    upstream.setMode('normal');
  }
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
  assert.deepEqual(
    rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens]),
    // The one estimator, as for chat: the request as sent, and the one delta that arrived.
    [['up-chat', 1, estimateTokens({ model: 'up-chat', input: 'cut me off', stream: true }), estimateTextTokens('Upstream says')]],
  );
});

test('a client leaving mid-stream: the input and the output streamed so far are billed, as for chat', async () => {
  const k = await gw.fundedKey({ orgId: a.orgId });
  upstream.setMode('hold-stream');
  try {
    const abort = new AbortController();
    const res = await fetch(`${node.url}/v1/responses`, {
      method: 'POST',
      headers: { ...bearer(k.key), 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'up-chat', input: 'leave early please', stream: true }),
      signal: abort.signal,
    });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    let seen = '';
    while (!seen.includes('response.output_text.delta')) seen += new TextDecoder().decode((await reader.read()).value);
    abort.abort();
    await reader.read().catch(() => undefined);
  } finally {
    upstream.setMode('normal');
  }
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
  assert.deepEqual(
    rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens]),
    [['up-chat', 1, estimateTokens({ model: 'up-chat', input: 'leave early please', stream: true }), estimateTextTokens('Upstream says')]],
  );
});

test('refusals: 400 unknown model, 400 missing input, 401 model not allowed, 405 with Allow, 429 with retry-after', async () => {
  const url = `${node.url}/v1/responses`;
  const post = (k: DemoKey, json: unknown) => request(url, { method: 'POST', headers: bearer(k.key), json });
  const unknown = await post(a, { model: 'no-such-model', input: 'x' });
  assertShapeA(unknown, 400, 'model', 'unknown model');
  assert.equal(unknown.body.error.type, 'invalid_request_error');
  const noInput = await post(a, { model: 'demo-chat' });
  assertShapeA(noInput, 400, 'input', 'missing input');
  assertShapeA(await post(a, { model: 'demo-chat', input: 42 }), 400, 'input', 'input of the wrong type');
  assertShapeA(await post(a, { input: 'x' }), 400, 'model', 'missing model');
  assertShapeA(await request(url, { method: 'POST', headers: { ...bearer(a.key), 'content-type': 'application/json' }, body: '{"model":' }), 400, null, 'malformed JSON');
  // up-chat is in the plan, but not in this key's allowed_models.
  assertShapeA(await post(aDemoOnly, { model: 'up-chat', input: 'x' }), 401, 'model', 'model not allowed');
  // demo-chat-pro is outside the free plan.
  assertShapeA(await post(a, { model: 'demo-chat-pro', input: 'x' }), 401, 'model', 'model outside the plan');
  const put = await request(url, { method: 'PUT', headers: bearer(a.key), json: { model: 'demo-chat', input: 'x' } });
  assertShapeA(put, 405, undefined, 'PUT');
  assert.equal(put.headers.get('allow'), 'POST');
  const putStored = await request(`${url}/resp_abc`, { method: 'PUT', headers: bearer(a.key) });
  assertShapeA(putStored, 405, undefined, 'PUT on a stored response');
  assert.equal(putStored.headers.get('allow'), 'GET, DELETE');
  assertShapeA(await request(url, { method: 'POST', json: { model: 'demo-chat', input: 'x' } }), 401, undefined, 'no key');
  // The free tier's 60,000 tpm: a request that may produce 70,000 output tokens does not fit.
  const big = await post(a, { model: 'demo-chat', input: 'x', max_output_tokens: 70_000 });
  assertShapeA(big, 429, null, 'tpm');
  assert.equal(big.body.error.type, 'tokens');
  assert.match(big.headers.get('retry-after') ?? '', /^\d+$/);
});

test('another node learns who owns a response from the control plane: at connect, and as it is created', async () => {
  // A key of its own in project A: key a's 20 rpm (free tier) are used up by the tests above within
  // one clock minute, and these polls on node 2 count too (this test failed whenever no minute ended
  // during the run).
  const a1 = await gw.fundedKey({ orgId: a.orgId, projectId: a.projectId });
  const early = await client(a1).responses.create({ model: 'up-chat', input: 'made before node 2 started' });
  const node2 = await gw.addNode({ nodeId: 'responses-node-2' });
  await waitUntilKnown(node2.url, a1.key);
  await waitUntilKnown(node2.url, b.key);
  const late = await client(a1).responses.create({ model: 'up-chat', input: 'made while node 2 runs' });
  for (const r of [early, late]) {
    // Until the record arrives, node 2 answers 404 (it never guesses); then A reads it there.
    await eventually(async () => (await request(`${node2.url}/v1/responses/${r.id}`, { headers: bearer(a1.key) })).status === 200, `${r.id} on node 2`);
    assertShapeA(await request(`${node2.url}/v1/responses/${r.id}`, { headers: bearer(b.key) }), 404, null, `B on node 2`);
    const prev = await request(`${node2.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { model: 'up-chat', input: 'x', previous_response_id: r.id } });
    assertShapeA(prev, 404, 'previous_response_id', 'previous_response_id by B on node 2');
  }
  const cont = await request(`${node2.url}/v1/responses`, { method: 'POST', headers: bearer(a1.key), json: { model: 'up-chat', input: 'go on', previous_response_id: late.id } });
  assert.equal(cont.status, 200, cont.text);
});

test('WebSocket mode to an OpenAI-compatible upstream: {base_url}/responses over ws, the model spliced, billed from its usage', async () => {
  const k = await gw.fundedKey({ orgId: a.orgId });
  const s = await openRealtime(node.address, { key: k.key, model: 'up-chat', path: '/v1/responses' });
  s.session.send({ type: 'response.create', model: 'up-chat', input: 'over the socket' });
  const done = await s.session.waitFor('response.completed');
  s.ws.close(1000);
  await s.session.waitClosed();
  const up = upstream.sockets[upstream.sockets.length - 1];
  assert.match(up.url, /^\/v1\/responses(\?|$)/);
  assert.equal(up.authorization, 'Bearer sk-upstream-test');
  assert.equal(up.received.length, 1);
  const { safety_identifier: safetyId, ...create } = up.received[0];
  assert.deepEqual(create, { type: 'response.create', model: 'upstream-up-chat', input: 'over the socket' });
  assert.match(safetyId, /^tg_[A-Za-z0-9_-]{22}$/, "the project's safety identifier (docs/safety-identifier.md)");
  // Created over the socket: the project's own, on the upstream.
  const got = await request(`${node.url}/v1/responses/${done.response.id}`, { headers: bearer(b.key) });
  assertShapeA(got, 404, null, 'B reads a socket-made response');
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
  assert.deepEqual(
    rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens]),
    [['up-chat', 1, USAGE.input_tokens, USAGE.output_tokens]],
  );
});

test("README's client.responses.create example runs as written against the demo provider", async () => {
  // A key of its own: key a's 20 rpm may be used up by the tests above within one clock minute.
  const own = await gw.fundedKey({ orgId: a.orgId });
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('### The Responses API'));
  const block = /```js\n([\s\S]*?)```/.exec(section)![1].replace('http://127.0.0.1:8080/v1', `${node.url}/v1`);
  const r = await runProcessAsync(process.execPath, ['--input-type=module', '-e', block], { env: { ...process.env, TOLLGATE_KEY: own.key }, timeoutMs: 30_000 });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^resp_\S+ You said: "Hello"\./);
  assert.match(r.stdout, /You said: "Stream please"/);
});
