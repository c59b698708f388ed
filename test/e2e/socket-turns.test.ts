// Every turn on a socket is a request (issue 32): each `response.create` on a Responses-API WebSocket
// passes the admission an HTTP request passes (rpm, its tpm estimate, money), is checked on exactly
// the fields the upstream reads, and is billed on its own, cut or complete. Against a fake upstream
// that reads a create's fields at the top level, as OpenAI's WebSocket mode does.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { tokenCostMicros } from '../../proto/lib/money.js';
import { estimateTextTokens, estimateTokens } from '../../data-plane/proxy/tokens.js';
import { configYaml, addUpstreamModel } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { within } from '../helpers/data-plane.js';
import { startFakeResponsesUpstream, USAGE, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';
import { bearer, minuteStart, request, setClock } from '../helpers/http.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { cliJsonAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { attemptRealtime, openRealtime, type Opened } from '../helpers/realtime.js';
import { usageRowsOfKey, waitForUsageTotals } from '../helpers/usage-db.js';

const IN_PRICE = 500_000; // up-chat: 0.50 USD per million input tokens
const OUT_PRICE = 1_500_000;
const CACHED_PRICE = 50_000;
const USAGE_COST = Math.ceil(
  ((USAGE.input_tokens - USAGE.input_tokens_details.cached_tokens) * IN_PRICE + USAGE.input_tokens_details.cached_tokens * CACHED_PRICE + USAGE.output_tokens * OUT_PRICE) / 1_000_000,
);

let cp: ControlPlane;
let node: DataPlane;
let upstream: FakeResponsesUpstream;
let rt: FakeRealtimeUpstream;

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    rt = await startFakeRealtimeUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid'], { cached_input_usd_per_mtok: '0.05' });
          addUpstreamModel(cfg, 'up-other', upstream.baseUrl, ['free', 'paid']);
          cfg.models.push({ id: 'rt-up', provider: 'openai', kind: 'realtime', input_usd_per_mtok: '1.00', output_usd_per_mtok: '2.00' });
          cfg.realtime_upstreams = [{ model: 'rt-up', url: rt.url }];
          cfg.tiers.paid.models.push('rt-up');
          cfg.tiers['rpm-3'] = { rpm: 3, tpm: 1000000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['rt-up'] };
          // One fake answer uses 1,500 tokens (USAGE): a second fits, a chain re-reading the first does not.
          cfg.tiers['tpm-2800'] = { rpm: 300, tpm: 2800, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['up-chat'] };
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' },
      },
      // Debug: each session's end is logged, for nodeTail when a socket test fails.
      node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' }, extraArgs: ['--log-level', 'debug'] },
    };
  },
  async () => {
    ({ cp, node } = gw);
    // One minute for the whole file, read once: the rpm and tpm tests count within it.
    await setClock(node.adminUrl!, { now_ms: minuteStart() + 5_000 });
  },
);
after(async () => {
  await upstream?.close();
  await rt?.close();
});

/** The node's last output and whether it still runs, for a failure message. */
const nodeTail = () => `node ${node.proc.child.exitCode === null ? 'running' : `exited ${node.proc.child.exitCode}`}; its last output:\n${node.proc.output().slice(-3000)}`;

const socket = (k: DemoKey, model = 'up-chat') => openRealtime(node.address, { key: k.key, model, path: '/v1/responses', diagnose: nodeTail });

/** Creates the upstream's sockets received, over every socket opened so far. */
function creates(): any[] {
  return upstream.sockets.flatMap((s) => s.received.filter((e) => e.type === 'response.create'));
}

/** Waits until the socket got `n` answers to its creates (completed or error events). */
async function answers(s: Opened, n: number): Promise<{ completed: any[]; errors: any[] }> {
  const pick = () => ({ completed: s.session.events.filter((e) => e.type === 'response.completed'), errors: s.session.events.filter((e) => e.type === 'error') });
  const ok = await within(15_000, async () => pick().completed.length + pick().errors.length >= n);
  assert.ok(ok, `${n} answers; got ${s.session.events.map((e) => e.type).join(',')}; close: ${s.session.closeCode} ${s.session.closeReason}${s.session.errorText()}`);
  return pick();
}

/** The project's usage as the CLI reports it, by model. */
async function cliUsage(k: DemoKey): Promise<{ totals: any; rows: any[] }> {
  return cliJsonAsync(cp, cp.secrets.operatorToken, ['usage', '--project', k.projectId, '--by', 'model']);
}

function usd(micros: number): string {
  const whole = Math.floor(micros / 1_000_000);
  let frac = String(micros % 1_000_000).padStart(6, '0').replace(/0+$/, '');
  if (frac.length < 2) frac = frac.padEnd(2, '0');
  return `${whole}.${frac}`;
}

test('rpm: a 20 rpm key sends 60 creates on one socket; 19 go upstream (the socket took one), 41 are refused in-band with 429 requests, and the socket stays open', async () => {
  // Before: a socket took one request of rpm when it opened, and every create after it was forwarded.
  const k = await gw.fundedKey({ tier: 'free' });
  const before = creates().length;
  const s = await socket(k);
  for (let i = 0; i < 60; i++) s.session.send({ type: 'response.create', model: 'up-chat', input: `question ${i}` });
  const { completed, errors } = await answers(s, 60);
  assert.equal(completed.length, 19);
  assert.equal(errors.length, 41);
  for (const e of errors) {
    assert.equal(e.status, 429);
    assert.equal(e.error.type, 'requests');
    assert.equal(e.error.code, '429');
    assert.equal(e.error.param, null);
    assert.match(e.error.message, /requests per minute \(rpm\): 20\/20 used/);
    assert.ok(e.retry_after >= 1 && e.retry_after <= 60, JSON.stringify(e));
  }
  assert.equal(creates().length - before, 19, 'only the admitted creates reached the upstream');
  assert.equal(s.session.closeCode, null, 'the socket stays open');
  s.ws.close(1000);
  await s.session.waitClosed();
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 19);
  assert.deepEqual(rows.map((r) => [r.model, r.requests, r.cost_micros]), [['up-chat', 19, 19 * USAGE_COST]]);
  const u = await cliUsage(k);
  assert.equal(u.totals.cost_usd, usd(19 * USAGE_COST));
});

test('tpm: a create whose max_output_tokens passes the key\'s tpm is refused on the socket as over HTTP (429 tokens), not forwarded, and the socket goes on', async () => {
  // Before: max_output_tokens 500000 on a 60,000 tpm key was 429 over HTTP and forwarded on the socket.
  const k = await gw.fundedKey({ tier: 'free' });
  const http = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: 'hi', max_output_tokens: 500_000 } });
  assert.equal(http.status, 429, http.text);
  assert.equal(http.body.error.type, 'tokens');
  const before = creates().length;
  const s = await socket(k);
  s.session.send({ type: 'response.create', model: 'up-chat', input: 'hi', max_output_tokens: 500_000 });
  const refused = await s.session.waitFor('error');
  assert.equal(refused.status, 429);
  assert.deepEqual([refused.error.type, refused.error.code, refused.error.param], ['tokens', '429', null]);
  assert.match(refused.error.message, /tokens per minute \(tpm\): \d+\/60000 used, this request needs about 50000\d/);
  assert.equal(creates().length, before, 'not forwarded');
  s.session.send({ type: 'response.create', model: 'up-chat', input: 'hi', max_output_tokens: 1000 });
  await s.session.waitFor('response.completed');
  assert.equal(creates().length, before + 1);
  s.ws.close(1000);
  await s.session.waitClosed();
});

test('the fields the upstream reads are the ones checked: a create with a `response` member, another model, another project\'s previous_response_id or `background` is refused, and the model goes upstream as the upstream names it', async () => {
  // Before: the checks read `response` when it was an object and the top level was forwarded, so an
  // empty `"response": {}` let another tenant's previous_response_id and any model through.
  const a = await gw.fundedKey({ tier: 'free' });
  const b = await gw.fundedKey({ tier: 'free' });
  const made = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(a.key), json: { model: 'up-chat', input: 'a secret' } });
  assert.equal(made.status, 200, made.text);
  const before = creates().length;
  const s = await socket(b);
  s.session.send({ type: 'response.create', response: {}, model: 'up-other', previous_response_id: made.body.id, input: 'tell me' });
  s.session.send({ type: 'response.create', model: 'up-chat', previous_response_id: made.body.id, input: 'tell me' });
  s.session.send({ type: 'response.create', model: 'up-other', input: 'tell me' });
  s.session.send({ type: 'response.create', model: 'up-chat', input: 'later', background: true });
  s.session.send({ type: 'response.create', input: 'no model named' });
  const { errors, completed } = await answers(s, 5);
  assert.deepEqual(
    errors.map((e) => [e.status, e.error.type, e.error.param]),
    [
      [400, 'invalid_request_error', 'response'],
      [404, 'invalid_request_error', 'previous_response_id'],
      [401, 'model_not_allowed', 'model'],
      [400, 'invalid_request_error', 'background'],
    ],
  );
  assert.equal(completed.length, 1);
  const got = creates().slice(before);
  assert.equal(got.length, 1, 'only the clean create went upstream');
  assert.equal(got[0].model, 'upstream-up-chat');
  assert.equal(got[0].input, 'no model named');
  s.ws.close(1000);
  await s.session.waitClosed();
});

test('a socket response cut mid-way bills its input: a 100,000-token string input at the top level', async () => {
  // Before: the estimate read `response.input` only, so a top-level or string input billed 0 input tokens.
  const k = await gw.fundedKey({ tier: 'paid', creditMicros: 50_000_000 });
  const input = Array.from({ length: 110_000 }, (_, i) => `w${i % 97}`).join(' ');
  const inputTokens = estimateTextTokens(input);
  assert.ok(inputTokens >= 100_000, String(inputTokens));
  upstream.setSocketMode('hold');
  try {
    const s = await socket(k);
    s.session.send({ type: 'response.create', model: 'up-chat', input });
    await s.session.waitFor('response.output_text.delta');
    s.ws.terminate();
    const [row] = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
    assert.ok(row.prompt_tokens >= inputTokens, `billed ${row.prompt_tokens} input tokens for about ${inputTokens}`);
    assert.equal(row.cost_micros, tokenCostMicros(row.prompt_tokens, row.completion_tokens, IN_PRICE, OUT_PRICE));
    const u = await cliUsage(k);
    assert.equal(u.totals.cost_usd, usd(row.cost_micros));
  } finally {
    upstream.setSocketMode('normal');
  }
});

/** What a refusal kept of rpm: remaining before it, less remaining after it, less the probe itself. */
async function remaining(k: DemoKey): Promise<number> {
  const r = await request(`${node.url}/v1/models`, { headers: bearer(k.key) });
  assert.equal(r.status, 200);
  return Number(r.headers.get('x-ratelimit-remaining-requests'));
}

test('the same failing condition gets the same refusal on a socket turn as over HTTP, and keeps the same rpm', async () => {
  const cases: Array<{ name: string; http: Record<string, unknown>; turn: Record<string, unknown>; status: number; type: string }> = [
    { name: 'tokens', http: { model: 'up-chat', input: 'x', max_output_tokens: 500_000 }, turn: { model: 'up-chat', input: 'x', max_output_tokens: 500_000 }, status: 429, type: 'tokens' },
    { name: 'previous response of another project', http: { model: 'up-chat', input: 'x', previous_response_id: 'resp_nobody' }, turn: { model: 'up-chat', input: 'x', previous_response_id: 'resp_nobody' }, status: 404, type: 'invalid_request_error' },
    { name: 'repeated key', http: { model: 'up-chat', input: 'x' }, turn: { model: 'up-chat', input: 'x' }, status: 400, type: 'invalid_request_error' },
  ];
  for (const c of cases) {
    const repeated = c.name === 'repeated key';
    const h = await gw.fundedKey({ tier: 'free' });
    const h0 = await remaining(h);
    const body = repeated ? '{"model":"up-chat","input":"x","input":"y"}' : JSON.stringify(c.http);
    const res = await request(`${node.url}/v1/responses`, { method: 'POST', headers: { ...bearer(h.key), 'content-type': 'application/json' }, body });
    const h1 = await remaining(h);
    const w = await gw.fundedKey({ tier: 'free' });
    const s = await socket(w);
    const w0 = Number(s.headers['x-ratelimit-remaining-requests']);
    if (repeated) s.ws.send('{"type":"response.create","model":"up-chat","input":"x","input":"y"}');
    else s.session.send({ type: 'response.create', ...c.turn });
    const ev = await s.session.waitFor('error');
    const w1 = await remaining(w);
    assert.equal(res.status, c.status, `${c.name}: ${res.text}`);
    assert.deepEqual([ev.status, ev.error.type, ev.error.code], [res.status, res.body.error.type, res.body.error.code], `${c.name}: ${JSON.stringify(ev)}`);
    assert.equal(ev.error.param, res.body.error.param, c.name);
    assert.equal(w0 - w1 - 1, h0 - h1 - 1, `${c.name}: rpm kept on the socket (${w0}→${w1}) vs over HTTP (${h0}→${h1})`);
    s.ws.close(1000);
    await s.session.waitClosed();
  }
});

test('a realtime ?model= refusal keeps its request of rpm, as an HTTP body refusal does', async () => {
  // Before: the realtime refusal after admission was refunded whole, the HTTP 400 kept one request.
  const h = await gw.fundedKey({ tier: 'free' });
  const h0 = await remaining(h);
  const bad = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(h.key), json: { messages: [{ role: 'user', content: 'x' }] } });
  assert.equal(bad.status, 400);
  const h1 = await remaining(h);
  const w = await gw.fundedKey({ tier: 'free' });
  const w0 = await remaining(w);
  const r = await attemptRealtime(node.address, { key: w.key, model: null });
  assert.ok(!('ws' in r) && r.status === 400, JSON.stringify(r));
  const w1 = await remaining(w);
  assert.equal(h0 - h1 - 1, 1, 'the HTTP 400 keeps its request');
  assert.equal(w0 - w1 - 1, 1, 'the realtime 400 keeps its request');
});

test('a chained create reserves the context it re-reads as far as the node knows it, over HTTP and on a socket', async () => {
  // Before: a create naming previous_response_id was estimated from its new input only.
  const total = USAGE.input_tokens + USAGE.output_tokens;
  for (const via of ['http', 'socket'] as const) {
    const k = await gw.fundedKey({ tier: 'tpm-2800' });
    const first = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: 'first' } });
    assert.equal(first.status, 200, first.text);
    const body = { model: 'up-chat', input: 'go on', previous_response_id: first.body.id };
    // The minute holds the first's 1,500; the chain's 1,500 more and its input pass 2,800.
    if (via === 'http') {
      const r = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: body });
      assert.equal(r.status, 429, r.text);
      assert.equal(r.body.error.type, 'tokens');
      assert.match(r.body.error.message, new RegExp(`this request needs about ${total + estimateTokens(body)}`));
    } else {
      const s = await socket(k);
      s.session.send({ type: 'response.create', ...body });
      const ev = await s.session.waitFor('error');
      assert.deepEqual([ev.status, ev.error.type], [429, 'tokens'], JSON.stringify(ev));
      assert.match(ev.error.message, new RegExp(`this request needs about ${total + estimateTokens({ type: 'response.create', ...body })}`));
      s.ws.close(1000);
      await s.session.waitClosed();
    }
  }
});

test('a chained socket response cut mid-way bills the context it re-reads', async () => {
  const k = await gw.fundedKey({ tier: 'paid', creditMicros: 50_000_000 });
  const s = await socket(k);
  s.session.send({ type: 'response.create', model: 'up-chat', input: 'first' });
  const one = await s.session.waitFor('response.completed');
  upstream.setSocketMode('hold');
  try {
    const ev = { type: 'response.create', model: 'up-chat', input: 'go on', previous_response_id: one.response.id };
    s.session.send(ev);
    await s.session.waitFor('response.output_text.delta', 2);
    s.ws.terminate();
    const cut = { prompt: USAGE.input_tokens + USAGE.output_tokens + estimateTokens(ev), completion: estimateTextTokens('hi') };
    const [row] = await waitForUsageTotals(cp.dbPath, k.keyId, 2);
    assert.equal(row.requests, 2);
    assert.equal(row.prompt_tokens, USAGE.input_tokens + cut.prompt);
    assert.equal(row.cost_micros, USAGE_COST + tokenCostMicros(cut.prompt, cut.completion, IN_PRICE, OUT_PRICE));
    assert.equal((await cliUsage(k)).totals.cost_usd, usd(row.cost_micros));
  } finally {
    upstream.setSocketMode('normal');
  }
});

test('a realtime response.create sent as a binary frame is a turn like any other: counted against rpm, refused in-band past it', async () => {
  // Before: a binary frame went upstream unread, so a create framed as binary skipped admission.
  const k = await gw.fundedKey({ tier: 'free' });
  const s = await openRealtime(node.address, { key: k.key, model: 'demo-realtime' });
  await s.session.waitFor('session.created');
  s.session.send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'hi' }] } });
  for (let i = 0; i < 25; i++) s.ws.send(Buffer.from(JSON.stringify({ type: 'response.create' })), { binary: true });
  const ok = await within(15_000, async () => s.session.count('error') >= 6);
  assert.ok(ok, `6 refusals; got ${s.session.count('error')} errors`);
  const errors = s.session.events.filter((e) => e.type === 'error');
  assert.deepEqual([...new Set(errors.map((e) => `${e.status} ${e.error.type}`))], ['429 requests']);
  s.ws.close(1000);
  await s.session.waitClosed();
});

test('money: a burst of 30 creates on a socket of a key limited to $0.01 stays within the limit plus one turn\'s worst case', async () => {
  // Before: a turn reserved no money at all; the socket forwarded every create (30 × 690 µ$ here).
  const funded = await gw.fundedKey({ tier: 'paid', creditMicros: 1_000_000_000 });
  const created = await cliJsonAsync(cp, cp.secrets.operatorToken, ['key', 'create', '--project', funded.projectId, '--limit-usd', '0.01']);
  const k: DemoKey = { ...funded, key: created.key, keyId: created.id };
  await within(10_000, async () => (await request(`${node.url}/v1/models`, { headers: bearer(k.key) })).status === 200);
  const s = await socket(k);
  const create = { type: 'response.create', model: 'up-chat', input: 'hi', max_output_tokens: 1000 };
  for (let i = 0; i < 30; i++) s.session.send(create);
  const { completed, errors } = await answers(s, 30);
  const worst = Math.ceil(((estimateTokens(create)) * IN_PRICE + 1000 * OUT_PRICE) / 1_000_000);
  const spent = completed.length * USAGE_COST;
  assert.ok(completed.length >= 1, 'the first turns fit');
  assert.ok(spent <= 10_000 + worst, `spent ${spent} µ$ of a 10,000 µ$ limit: past it by more than one worst case (${worst})`);
  assert.ok(errors.length >= 1);
  for (const e of errors) assert.deepEqual([e.status, e.error.type, e.error.code], [401, 'insufficient_quota', '401'], JSON.stringify(e));
  s.ws.close(1000);
  await s.session.waitClosed();
  const shown = await within(10_000, async () => (await cliJsonAsync(cp, cp.secrets.operatorToken, ['key', 'show', k.keyId])).spent_usd === usd(spent));
  assert.ok(shown, `key show says ${usd(spent)} spent`);
});

test('a realtime response the upstream begins on its own is counted and billed as a turn, never refused; the client\'s next create is refused past the rpm', async () => {
  const k = await gw.fundedKey({ tier: 'rpm-3' });
  const s = await openRealtime(node.address, { key: k.key, model: 'rt-up' });
  await s.session.waitFor('session.created');
  // The socket took one request of 3; five responses begun upstream are counted past it, not refused.
  for (let i = 0; i < 5; i++) s.session.send({ type: 'test.spontaneous' });
  await s.session.waitFor('response.done', 5);
  s.session.send({ type: 'response.create' });
  const refused = await s.session.waitFor('error');
  assert.deepEqual([refused.status, refused.error.type], [429, 'requests']);
  s.ws.close(1000);
  await s.session.waitClosed();
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 5);
  // The fake's usage: 10 in, 20 out, at 1 and 2 µ$ a token.
  assert.deepEqual(rows.map((r) => [r.model, r.requests, r.cost_micros]), [['rt-up', 5, 5 * (10 * 1 + 20 * 2)]]);
});

test('a create the upstream refuses (an error event, no response) is settled at once, billed nothing, and the next response is its own', async () => {
  // Before: it stayed waiting for a response.created that never came, the next response was taken
  // for it, and at the session's end each was billed its input estimate (40,050 µ$ for one 50 µ$ answer).
  const k = await gw.fundedKey({ tier: 'paid', creditMicros: 50_000_000 });
  const s = await openRealtime(node.address, { key: k.key, model: 'rt-up' });
  await s.session.waitFor('session.created');
  const big = 'word '.repeat(4000);
  s.session.send({ type: 'response.create', event_id: 'mine_1', response: { instructions: big, metadata: { reject: '1' } } });
  s.session.send({ type: 'response.create', response: { instructions: big, metadata: { reject: '1' } } });
  await s.session.waitFor('error', 2);
  s.session.send({ type: 'response.create' });
  await s.session.waitFor('response.done');
  s.ws.close(1000);
  await s.session.waitClosed();
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
  assert.equal(rows.reduce((n, r) => n + r.cost_micros, 0), 10 * 1 + 20 * 2, JSON.stringify(rows));
  assert.equal(rows.reduce((n, r) => n + r.prompt_tokens, 0), 10);
});

test('a realtime create is a turn however it is written: binary with leading space, unparsable, or naming a key twice', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const s = await openRealtime(node.address, { key: k.key, model: 'demo-realtime' });
  await s.session.waitFor('session.created');
  const refusals = (status: number) => s.session.events.filter((e) => e.type === 'error' && e.status === status);
  // Before: a create whose type reads but whose JSON does not parse went upstream unadmitted. Now it
  // is a turn refused as malformed (a 400: it keeps its request of rpm).
  s.ws.send('{"type":"response.create","response":{"temperature":NaN}}');
  assert.ok(await within(10_000, async () => refusals(400).length >= 1), 'refused as malformed');
  assert.equal(refusals(400)[0].error.type, 'invalid_request_error');
  // Before: ' {…}' as a binary frame skipped admission (the check wanted '{' first). The socket and
  // the malformed create took 2 of 20 requests: 18 of 25 are admitted, 7 refused.
  s.session.send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'hi' }] } });
  for (let i = 0; i < 25; i++) s.ws.send(Buffer.from(' {"type":"response.create"}'), { binary: true });
  assert.ok(await within(15_000, async () => refusals(429).length >= 7), `7 rpm refusals; got ${JSON.stringify(s.session.events.filter((e) => e.type === 'error').slice(0, 2))}`);
  s.ws.close(1000);
  await s.session.waitClosed();
  // Before: a realtime create naming `response` twice went on as sent (the gateway read the last copy).
  const k2 = await gw.fundedKey({ tier: 'paid', creditMicros: 50_000_000 });
  const before = rt.connections.length;
  const t = await openRealtime(node.address, { key: k2.key, model: 'rt-up' });
  const conn = await rt.waitForConnection(before + 1);
  await t.session.waitFor('session.created');
  t.ws.send('{"type":"response.create","response":{"max_output_tokens":1},"response":{"max_output_tokens":"inf"}}');
  const dup = await t.session.waitFor('error');
  assert.deepEqual([dup.status, dup.error.type, dup.error.param], [400, 'invalid_request_error', 'response'], JSON.stringify(dup));
  assert.equal(conn.received.filter((e) => e.type === 'response.create').length, 0, 'not forwarded');
  t.ws.close(1000);
  await t.session.waitClosed();
});

test('a chain from a background response reserves the context the background response ended with', async () => {
  // Before: the follower billed without recording the response's context, so a chain from it was estimated from its new input only.
  const k = await gw.fundedKey({ tier: 'tpm-2800' });
  const made = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: 'first', background: true } });
  assert.equal(made.status, 200, made.text);
  upstream.background.finish(made.body.id);
  assert.ok(await within(15_000, async () => (await usageRowsOfKey(cp.dbPath, k.keyId)).length >= 1), 'the background response was billed');
  const body = { model: 'up-chat', input: 'go on', previous_response_id: made.body.id };
  const r = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: body });
  assert.equal(r.status, 429, r.text);
  assert.match(r.body.error.message, new RegExp(`this request needs about ${USAGE.input_tokens + USAGE.output_tokens + estimateTokens(body)}`));
});

test('every socket above was upgraded after its upstream opened, and uWS printed no warning about writes outside a cork', () => {
  // An upgrade outside any cork of its response (realtime/cork-anchor.ts) is what uWS.js warns about on stderr, once per socket.
  assert.ok(node.proc.output().includes('realtime session closed'), 'sockets were opened');
  assert.doesNotMatch(node.proc.output(), /Warning: uWS/);
});
