// Billing from what the upstream says it served: realtime events told apart by their parsed type,
// usage read from answers of any size, the prices the upstream bills by (cached, audio), and the
// charge shown to the caller (`usage.cost`, `x-request-id`).
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';
import { openRealtime } from '../helpers/realtime.js';
import { cliJsonAsync, runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageRows, waitForUsageTotals } from '../helpers/usage-db.js';
import { bearer, request } from '../helpers/http.js';

/** Answers over 4 MiB: the size past which the gateway used to give up reading the upstream's usage. */
const BIG_BYTES = 5 * 1024 * 1024;

/** A chat answer with logprobs over `bytes`, its usage after the content (and members after the usage, as OpenAI sends them). */
function bigChatAnswer(model: string, bytes: number, usage: Record<string, unknown>): string {
  const item = JSON.stringify({ token: 'tok', logprob: -0.25, bytes: [116, 111, 107], top_logprobs: [{ token: 'tok', logprob: -0.25, bytes: [116] }] });
  const n = Math.ceil(bytes / (item.length + 1));
  const content = new Array<string>(n).fill(item).join(',');
  return `{"id":"chatcmpl-big","object":"chat.completion","created":1,"model":"${model}","choices":[{"index":0,"message":{"role":"assistant","content":"tok"},"logprobs":{"content":[${content}]},"finish_reason":"stop"}],"usage":${JSON.stringify(usage)},"service_tier":"default","system_fingerprint":"fp_test"}`;
}

/** An embeddings answer over `bytes` with the usage the upstream reports. */
function bigEmbeddingsAnswer(model: string, bytes: number, promptTokens: number): string {
  const vector = `[${new Array<string>(1536).fill('0.0123456789').join(',')}]`;
  const n = Math.ceil(bytes / (vector.length + 50));
  const data = Array.from({ length: n }, (_, i) => `{"object":"embedding","index":${i},"embedding":${vector}}`).join(',');
  return `{"object":"list","data":[${data}],"model":"${model}","usage":{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens}}}`;
}

/** Usage the fixture reports for a chat request, chosen by the first message's text. */
const CHAT_USAGE: Record<string, Record<string, unknown>> = {
  cached: { prompt_tokens: 50_000, completion_tokens: 0, total_tokens: 50_000, prompt_tokens_details: { cached_tokens: 20_000 } },
  audio: { prompt_tokens: 1000, completion_tokens: 500, total_tokens: 1500, prompt_tokens_details: { audio_tokens: 600 }, completion_tokens_details: { audio_tokens: 300, reasoning_tokens: 100 } },
  small: { prompt_tokens: 12, completion_tokens: 4000, total_tokens: 4012 },
};

/** Error answers of an OpenAI-like upstream, naming the operator's upstream account. */
const UPSTREAM_ERRORS: Record<string, { status: number; body: unknown }> = {
  'err-401': { status: 401, body: { error: { message: 'Incorrect API key provided: sk-proj-Ab12****************************wxYZ. You can find your API key at https://platform.openai.com/account/api-keys.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } } },
  'err-403': { status: 403, body: { error: { message: 'Project proj_Q1w2E3r4T5y6U7 does not have access to model gpt-x', type: 'invalid_request_error', param: null, code: 'model_not_found' } } },
  'err-429': { status: 429, body: { error: { message: 'Rate limit reached for gpt-4o in organization org-AbCdEf1234567890 on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000.', type: 'tokens', param: null, code: 'rate_limit_exceeded', organization: 'org-AbCdEf1234567890' } } },
};

const fixture = createServer((req: IncomingMessage, res: ServerResponse) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    const body = JSON.parse(Buffer.concat(parts).toString('utf8') || '{}');
    if (req.url === '/v1/embeddings') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(bigEmbeddingsAnswer(body.model, BIG_BYTES, 512_000));
    }
    const what = String(body.messages?.[0]?.content ?? '');
    const upstreamError = UPSTREAM_ERRORS[what];
    if (upstreamError) {
      res.writeHead(upstreamError.status, { 'content-type': 'application/json', ...(upstreamError.status === 429 ? { 'retry-after': '7' } : {}) });
      return void res.end(JSON.stringify(upstreamError.body));
    }
    if (what === 'early-hints') {
      // A 103 with Content-Length: 0 first, then the real answer.
      res.socket!.write('HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nContent-Length: 0\r\n\r\n');
      const text = JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: body.model, choices: [{ index: 0, message: { role: 'assistant', content: 'after the hints' }, finish_reason: 'stop' }], usage: CHAT_USAGE.small });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) });
      return void res.end(text);
    }
    if (what === 'logprobs') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(bigChatAnswer(body.model, BIG_BYTES, CHAT_USAGE.small));
    }
    const usage = CHAT_USAGE[what] ?? CHAT_USAGE.small;
    if (body.stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
      res.write(chunk({ id: 'c', object: 'chat.completion.chunk', created: 1, model: body.model, choices: [{ index: 0, delta: { role: 'assistant', content: 'ok' }, finish_reason: null }], usage: null }));
      res.write(chunk({ id: 'c', object: 'chat.completion.chunk', created: 1, model: body.model, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: null }));
      if (body.stream_options?.include_usage) res.write(chunk({ id: 'c', object: 'chat.completion.chunk', created: 1, model: body.model, choices: [], usage }));
      return void res.end('data: [DONE]\n\n');
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: body.model, choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage, system_fingerprint: 'fp' }));
  });
});

let cp: ControlPlane;
let node: DataPlane;
let realtime: FakeRealtimeUpstream;

const gw = gatewayFixture(
  async () => {
    realtime = await startFakeRealtimeUpstream();
    await new Promise<void>((resolve) => fixture.listen(0, '127.0.0.1', resolve));
    const base = `http://127.0.0.1:${(fixture.address() as AddressInfo).port}/v1`;
    return {
      controlPlane: {
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test-credential' },
        configYaml: configYaml((cfg) => {
          cfg.models.push({ id: 'rt-up', provider: 'openai', kind: 'realtime', upstream_model: 'gpt-realtime-test', input_usd_per_mtok: '1.00', output_usd_per_mtok: '2.00', cached_input_usd_per_mtok: '0.50', input_audio_usd_per_mtok: '10.00', output_audio_usd_per_mtok: '20.00' });
          cfg.realtime_upstreams = [{ model: 'rt-up', url: realtime.url, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', connect_timeout_ms: 5000 }];
          cfg.tiers.free.models.push('rt-up');
          cfg.tiers.paid.models.push('rt-up');
          // Room for answers of half a million tokens.
          cfg.tiers.big = { rpm: 300, tpm: 10_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '100.00', models: [] };
          const prices = { input_usd_per_mtok: '1.00', output_usd_per_mtok: '10.00' };
          addUpstreamModel(cfg, 'up-chat', base, ['big'], prices);
          addUpstreamModel(cfg, 'up-cached', base, ['big'], { ...prices, cached_input_usd_per_mtok: '0.25' });
          addUpstreamModel(cfg, 'up-audio', base, ['big'], { ...prices, input_audio_usd_per_mtok: '40.00', output_audio_usd_per_mtok: '80.00' });
          addUpstreamModel(cfg, 'up-embed', base, ['big'], { kind: 'embeddings', input_usd_per_mtok: '0.02', output_usd_per_mtok: undefined });
        }),
      },
    };
  },
  (g) => {
    ({ cp, node } = g);
  },
);
after(async () => {
  await realtime?.close();
  fixture.close();
});

/** The micro-dollars recorded for each of the key's model calls, oldest first. */
async function billed(keyId: string, n: number): Promise<number[]> {
  return (await waitForUsageRows(cp.dbPath, keyId, n)).map((r) => r.cost_micros);
}

test('a chat answer with logprobs over 4 MiB is billed from the upstream\'s usage', async () => {
  // Before the fix the gateway gave up reading usage past 4 MiB and billed its own estimate: the
  // upstream said 12 + 4,000 tokens ($0.040012) and 3 micro-dollars were billed.
  const k = await gw.fundedKey({ tier: 'big' });
  const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(k.key), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'up-chat', logprobs: true, messages: [{ role: 'user', content: 'logprobs' }] }) });
  assert.equal(r.status, 200);
  const answer = JSON.parse(await r.text());
  assert.ok(answer.choices[0].logprobs.content.length > 10_000);
  assert.deepEqual(await billed(k.keyId, 1), [12 * 1 + 4000 * 10]);
});

test('embeddings over 4 MiB with 512,000 tokens are billed 512,000 tokens', async () => {
  // Before the fix: 256 tokens billed (one per token array of the gateway's own count).
  const k = await gw.fundedKey({ tier: 'big' });
  const r = await request(`${node.url}/v1/embeddings`, { method: 'POST', json: { model: 'up-embed', input: new Array(256).fill([1, 2, 3]) }, headers: bearer(k.key) });
  assert.equal(r.status, 200);
  const [row] = await waitForUsageRows(cp.dbPath, k.keyId, 1);
  assert.equal(row.prompt_tokens, 512_000);
  assert.equal(row.cost_micros, Math.ceil((512_000 * 20_000) / 1_000_000));
  assert.deepEqual(r.body.usage, { prompt_tokens: 512_000, total_tokens: 512_000, cost: 0.01024 });
  assert.equal(r.body.data.length > 100, true);
});

test('cached input tokens at the cached price, or at the input price when the model has none; audio tokens at the audio prices', async () => {
  const k = await gw.fundedKey({ tier: 'big' });
  const ask = async (model: string, what: string) => {
    const r = await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: { model, messages: [{ role: 'user', content: what }] }, headers: bearer(k.key) });
    assert.equal(r.status, 200);
  };
  await ask('up-cached', 'cached');
  await ask('up-chat', 'cached');
  await ask('up-audio', 'audio');
  assert.deepEqual(await billed(k.keyId, 3), [
    // 30,000 fresh at $1.00 + 20,000 cached at $0.25.
    30_000 + 5_000,
    // No cached price: the input price, never 0.
    50_000,
    // 400 text in at $1, 600 audio in at $40, 200 text out (reasoning included) at $10, 300 audio out at $80.
    400 + 24_000 + 2_000 + 24_000,
  ]);
});

test('realtime: a response.done whose metadata mentions "response.created" is billed like any other', async () => {
  // Before the fix, events were told apart by substring tests: a response.done containing the text
  // "response.created" anywhere (here in the client's own metadata, which the upstream echoes) was
  // taken for a response.created and never billed (4 responses delivered, 1 billed).
  const k = await gw.fundedKey({ tier: 'free' });
  realtime.usage = { input_tokens: 10_000, output_tokens: 0 };
  const { session } = await openRealtime(node.address, { key: k.key, model: 'rt-up' });
  await session.waitFor('session.created');
  session.send({ type: 'response.create' });
  for (let i = 2; i <= 4; i++) session.send({ type: 'response.create', response: { metadata: { note: 'response.created', n: String(i) } } });
  await session.waitFor('response.done', 4);
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 4);
  assert.deepEqual(rows.map((r) => [r.model, r.requests, r.cost_micros]), [['rt-up', 4, 40_000]]);
  session.ws.close(1000, 'bye');
  await session.waitClosed();
});

test('realtime: audio tokens priced as audio, cached as cached; turning on input-audio transcription is refused in-band', async () => {
  // Before the fix every realtime token was priced as text: this response was billed 2,000 micro-dollars.
  const k = await gw.fundedKey({ tier: 'free' });
  realtime.usage = {
    input_tokens: 1000,
    output_tokens: 500,
    input_token_details: { text_tokens: 200, audio_tokens: 800, cached_tokens: 100, cached_tokens_details: { text_tokens: 0, audio_tokens: 100 } },
    output_token_details: { text_tokens: 100, audio_tokens: 400 },
  };
  const before = realtime.connections.length;
  const { session } = await openRealtime(node.address, { key: k.key, model: 'rt-up' });
  const conn = await realtime.waitForConnection(before + 1);
  await session.waitFor('session.created');
  session.send({ type: 'session.update', session: { type: 'realtime', audio: { input: { transcription: { model: 'gpt-4o-transcribe' } } } } });
  const err = await session.waitFor('error');
  assert.equal(err.error.code, 'feature_not_available');
  session.send({ type: 'response.create' });
  await session.waitFor('response.done');
  assert.ok(!conn.received.some((e) => e.type === 'session.update'), 'the transcription request never reached the upstream');
  const [row] = await waitForUsageTotals(cp.dbPath, k.keyId, 1);
  // 200 text in at $1, 700 fresh audio in at $10, 100 cached audio at $0.50, 100 text out at $2, 400 audio out at $20.
  assert.equal(row.cost_micros, 200 + 7_000 + 50 + 200 + 8_000);
  assert.deepEqual([row.prompt_tokens, row.completion_tokens], [1000, 500]);
  session.ws.close(1000, 'bye');
  await session.waitClosed();
});

test('models list shows every price, and what an unset one is billed at', async () => {
  const models = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['models', 'list'])).models;
  const rt = models.find((m: { id: string }) => m.id === 'rt-up');
  assert.deepEqual(
    [rt.input_usd_per_mtok, rt.output_usd_per_mtok, rt.cached_input_usd_per_mtok, rt.cache_write_usd_per_mtok, rt.input_audio_usd_per_mtok, rt.output_audio_usd_per_mtok],
    ['1.00', '2.00', '0.50', '1.00', '10.00', '20.00'],
  );
  assert.deepEqual(rt.prices_set, { cached_input: true, cache_write: false, input_audio: true, output_audio: true });
  const table = (await runCliAsync(cp, cp.secrets.operatorToken, ['models', 'list'])).stdout;
  assert.match(table, /CACHED_INPUT_USD_PER_MTOK\s+CACHE_WRITE_USD_PER_MTOK\s+INPUT_AUDIO_USD_PER_MTOK\s+OUTPUT_AUDIO_USD_PER_MTOK/);
  assert.match(table, /up-chat\s+chat\s+openai\s+1\.00\s+10\.00\s+-\s+1\.00 \(=input\)\s+1\.00 \(=input\)\s+1\.00 \(=input\)\s+10\.00 \(=output\)/);
});

test('the caller sees the charge: x-request-id on every answer, usage.cost in JSON and in the SSE usage chunk, as the ledger recorded', async () => {
  const k = await gw.fundedKey({ tier: 'big' });
  const client = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  // 12 in at $1, 4,000 out at $10 per million tokens: $0.040012.
  const { data, response } = await client.chat.completions.create({ model: 'up-chat', messages: [{ role: 'user', content: 'small' }] }).withResponse();
  const jsonId = response.headers.get('x-request-id');
  assert.match(jsonId ?? '', /\S+/);
  assert.equal((data.usage as any).cost, 0.040012);
  assert.equal(data.usage?.prompt_tokens, 12);

  const stream = await client.chat.completions.create({ model: 'up-chat', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'small' }] });
  let usage: any = null;
  for await (const c of stream) if (c.usage) usage = c.usage;
  assert.equal(usage.cost, 0.040012);
  assert.equal(usage.completion_tokens, 4000);

  // Without include_usage the client gets no usage chunk (the gateway's own is dropped), yet the call is billed.
  const plain = await client.chat.completions.create({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'small' }] });
  for await (const c of plain) assert.equal(c.usage, undefined);

  // The raw text: a number with six decimals.
  const raw = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(k.key), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'up-chat', messages: [{ role: 'user', content: 'cached' }] }) });
  const rawId = raw.headers.get('x-request-id');
  const rawText = await raw.text();
  assert.match(rawText, /"cost":0\.050000\}/);
  // A small JSON answer goes out whole with its length, usage.cost written in: not chunked.
  assert.equal(raw.headers.get('transfer-encoding'), null);
  assert.equal(Number(raw.headers.get('content-length')), Buffer.byteLength(rawText));

  // Refusals and listings carry one too.
  const missing = await fetch(`${node.url}/v1/models`);
  assert.equal(missing.status, 401);
  assert.match(missing.headers.get('x-request-id') ?? '', /\S+/);
  const listed = await fetch(`${node.url}/v1/models`, { headers: bearer(k.key) });
  assert.match(listed.headers.get('x-request-id') ?? '', /\S+/);
  assert.notEqual(listed.headers.get('x-request-id'), missing.headers.get('x-request-id'));

  // The ids are the ones `tollgate logs` shows, with the same micro-dollars.
  await waitForUsageRows(cp.dbPath, k.keyId, 4);
  const logs = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['logs', '--key', k.keyId])).logs as Array<{ request_id: string; cost_usd: string }>;
  const byId = new Map(logs.map((l) => [l.request_id, l.cost_usd]));
  assert.equal(byId.get(jsonId!), '0.040012');
  assert.equal(byId.get(rawId!), '0.05');
});

test("upstream errors: 401/403 become 502 upstream_unreachable, the upstream account's identifiers never reach the customer, 429 keeps retry-after", async () => {
  // Before the fix the upstream's error answer went to the customer unchanged: its masked key and
  // organisation id, a 401 as if the customer's own key were bad, and a 429 without retry-after.
  const k = await gw.fundedKey({ tier: 'big' });
  const ask = (what: string) => request(`${node.url}/v1/chat/completions`, { method: 'POST', json: { model: 'up-chat', messages: [{ role: 'user', content: what }] }, headers: bearer(k.key) });
  for (const what of ['err-401', 'err-403']) {
    const r = await ask(what);
    assert.equal(r.status, 502, what);
    assert.deepEqual(Object.keys(r.body.error).sort(), ['code', 'message', 'param', 'type']);
    assert.equal(r.body.error.code, '502');
    assert.equal(r.body.error.type, 'api_error');
    assert.doesNotMatch(r.text, /sk-proj|proj_Q1w2|invalid_api_key/);
  }
  const limited = await ask('err-429');
  assert.equal(limited.status, 429);
  assert.equal(limited.headers.get('retry-after'), '7');
  assert.doesNotMatch(limited.text, /AbCdEf1234567890/);
  assert.match(limited.body.error.message, /Rate limit reached/);
  assert.equal(limited.body.error.code, 'rate_limit_exceeded');
  // The operator's log has what the upstream said.
  await node.proc.waitFor(/AbCdEf1234567890/);
  await node.proc.waitFor(/sk-proj-Ab12\*+wxYZ/);
});

test('an upstream 103 Early Hints is not taken for the answer: the client gets the real one', async () => {
  // Before the fix the 103 (with Content-Length: 0) was taken as the final head: the client got an
  // empty 103 and lost the answer.
  const k = await gw.fundedKey({ tier: 'big' });
  const r = await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: { model: 'up-chat', messages: [{ role: 'user', content: 'early-hints' }] }, headers: bearer(k.key) });
  assert.equal(r.status, 200);
  assert.equal(r.body.choices[0].message.content, 'after the hints');
  const [row] = await waitForUsageRows(cp.dbPath, k.keyId, 1);
  assert.deepEqual([row.status, row.cost_micros], [200, 40_012]);
});

test('the built-in demo models show usage.cost too, equal to what is recorded', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const client = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const chat = await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello there, gateway!' }] });
  const stream = await client.chat.completions.create({ model: 'demo-chat', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'Hello there, gateway!' }] });
  let streamed: any = null;
  for await (const c of stream) if (c.usage) streamed = c.usage;
  const emb = await fetch(`${node.url}/v1/embeddings`, { method: 'POST', headers: { ...bearer(k.key), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'demo-embed', input: 'alpha beta' }) });
  const embText = await emb.text();
  assert.match(embText, /"usage":\{"prompt_tokens":2,"total_tokens":2,"cost":0\.000001\}/);
  const rows = await waitForUsageRows(cp.dbPath, k.keyId, 3);
  // demo-chat: $0.50 in, $1.50 out per million tokens.
  const chatCost = Math.ceil((chat.usage!.prompt_tokens * 500_000 + chat.usage!.completion_tokens * 1_500_000) / 1_000_000);
  assert.equal((chat.usage as any).cost, chatCost / 1_000_000);
  assert.equal(streamed.cost, chatCost / 1_000_000);
  assert.deepEqual(rows.map((r) => r.cost_micros), [chatCost, chatCost, 1]);
});
