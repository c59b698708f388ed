// Streaming through an OpenAI-compatible upstream (a fake one that can hold a stream, stall, reset
// and answer errors): chunks pass as they arrive, a client that leaves mid-stream costs the node
// nothing, upstream failures map to the spec's statuses, and usage reaches the control plane.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { type Console } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer, request } from '../helpers/http.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { type DataPlane } from '../helpers/processes.js';

let up: FakeUpstream;
let dp: DataPlane;
let c: Console;

const gw = gatewayFixture(
  async () => {
    up = await startFakeUpstream();
    const yaml = configYaml((cfg) => {
      addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['free'], { timeout_ms: 1500 });
      addUpstreamModel(cfg, 'dead-chat', 'http://127.0.0.1:1/v1', ['free']);
      addUpstreamModel(cfg, 'up-embed', up.baseUrl, ['free'], { kind: 'embeddings' });
      // One request in flight per key: a leaked slot shows as a 429 on the next request.
      cfg.tiers.free.max_parallel_requests = 1;
    });
    return { controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } } };
  },
  (g) => {
    ({ node: dp, console: c } = g);
  },
);
after(async () => {
  await up?.close();
});

async function newKey(): Promise<{ key: string; projectId: string }> {
  const k = await gw.fundedKey();
  return { key: k.key, projectId: k.projectId };
}

function streamChat(key: string, extra: Record<string, unknown> = {}, signal?: AbortSignal): Promise<Response> {
  return fetch(`${dp.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'Say hello' }], ...extra }),
    signal,
  });
}

async function readUntil(reader: ReadableStreamDefaultReader<Uint8Array>, re: RegExp, sofar = ''): Promise<string> {
  const dec = new TextDecoder();
  let text = sofar;
  while (!re.test(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
  }
  return text;
}

test('the client sees the first chunk before the upstream finished', async () => {
  const { key } = await newKey();
  up.setMode('hold-stream');
  const before = up.requests.length;
  const res = await streamChat(key);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type') ?? '', /text\/event-stream/);
  const reader = res.body!.getReader();
  // The upstream holds everything after its first chunk until release().
  const first = await readUntil(reader, /"content":"Hello"/);
  assert.match(first, /"content":"Hello"/);
  assert.doesNotMatch(first, /\[DONE\]/);
  const sent = up.requests[before];
  assert.equal(sent.body.model, 'upstream-up-chat');
  assert.equal(sent.body.stream_options.include_usage, true);
  assert.equal(sent.headers.authorization, 'Bearer upstream-secret');
  up.release();
  const all = await readUntil(reader, /\[DONE\]/, first);
  const content = [...all.matchAll(/"content":"([^"]*)"/g)].map((m) => m[1]).join('');
  assert.equal(content, 'Hello from the fake upstream.');
  // The client did not ask for usage: the usage chunk the gateway asked for is not passed on.
  assert.doesNotMatch(all, /"usage"/);
  up.setMode('normal');
});

test('a client that asked for usage gets the usage chunk', async () => {
  const { key } = await newKey();
  up.setMode('normal');
  const res = await streamChat(key, { stream_options: { include_usage: true } });
  const text = await res.text();
  assert.match(text, /"usage":\{"prompt_tokens":11,"completion_tokens":6/);
  assert.match(text, /data: \[DONE\]/);
});

test('a client that disconnects mid-stream: upstream aborted, slot released, node keeps serving', async () => {
  const { key } = await newKey();
  up.setMode('hold-stream');
  const ac = new AbortController();
  const res = await streamChat(key, {}, ac.signal);
  const reader = res.body!.getReader();
  await readUntil(reader, /"content":"Hello"/);
  const upstreamClosed = up.waitForClientClose();
  ac.abort();
  await upstreamClosed;
  up.setMode('normal');
  // max_parallel_requests is 1: this succeeds only if the aborted request released its slot.
  let r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-chat', messages: [{ role: 'user', content: 'x' }] } });
  for (let i = 0; i < 40 && r.status === 429; i++) {
    await new Promise((res) => setTimeout(res, 25));
    r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-chat', messages: [{ role: 'user', content: 'x' }] } });
  }
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.choices[0].message.content, 'Hello from the fake upstream.');
  up.release();
});

test('upstream unreachable or timing out before answering: 502 Shape A', async () => {
  const { key } = await newKey();
  const dead = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'dead-chat', messages: [{ role: 'user', content: 'x' }] } });
  assert.equal(dead.status, 502);
  assert.deepEqual(Object.keys(dead.body.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(dead.body.error.code, '502');
  assert.equal(dead.body.error.type, 'api_error');
  up.setMode('stall');
  const stalled = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-chat', messages: [{ role: 'user', content: 'x' }] } });
  assert.equal(stalled.status, 502);
  assert.match(stalled.body.error.message, /in time/);
  up.setMode('normal');
});

test('upstream reset mid-stream: the SSE stream ends with one error event', async () => {
  const { key } = await newKey();
  up.setMode('reset-mid-body');
  const res = await streamChat(key);
  assert.equal(res.status, 200);
  const text = await res.text();
  assert.match(text, /"content":"Hello"/);
  assert.match(text, /data: \{"error":\{"message":"The upstream failed in the middle of the stream\."/);
  up.setMode('normal');
  // And the node still serves.
  const ok = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-chat', messages: [{ role: 'user', content: 'x' }] } });
  assert.equal(ok.status, 200);
});

test('an upstream error answer is passed through with its status and body', async () => {
  const { key } = await newKey();
  up.setMode('error-429');
  const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-chat', messages: [{ role: 'user', content: 'x' }] } });
  assert.equal(r.status, 429);
  assert.equal(r.body.error.message, 'upstream says slow down');
  up.setMode('normal');
});

test("usage reaches the control plane: the upstream's, or counted when it gives none", async () => {
  const { key, projectId } = await newKey();
  up.setMode('no-usage');
  const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-chat', messages: [{ role: 'user', content: 'one two three' }] } });
  assert.equal(r.status, 200);
  up.setMode('normal');
  const e = await request(`${dp.url}/v1/embeddings`, { method: 'POST', headers: bearer(key), json: { model: 'up-embed', input: 'abc' } });
  assert.equal(e.status, 200);
  await eventually(async () => {
    const u = await c.getUsage({ projectId, orgId: '', month: '' });
    const chat = u.rows.find((row) => row.model === 'up-chat');
    const emb = u.rows.find((row) => row.model === 'up-embed');
    // The gateway's estimate (proxy/tokens.ts): the prompt's 13 characters (4) with the message's and
    // the reply's overhead (4 + 3) = 11; "Hello from the fake upstream." = 29 characters = 8.
    return !!chat && chat.promptTokens === 11 && chat.completionTokens === 8 && !!emb && emb.promptTokens === 7;
  }, 'usage rows in the control plane');
});
