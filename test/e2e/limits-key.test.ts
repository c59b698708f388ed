// Key budgets (rpm, tpm, max parallel requests) as fixed on the key, counted per clock minute of an
// injected clock, with the x-ratelimit-* headers and the gateway's 429 body.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, listenLocal, minuteStart, rawRequest, request, setClock } from '../helpers/http.js';
import { type Console } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';

let node: DataPlane;
let admin: Console;
let clock = 0;
// A fake upstream that holds every chat completion until the test releases them.
const held: ServerResponse[] = [];
let onHeld: (() => void) | undefined;
const upstream = createServer((req: IncomingMessage, res: ServerResponse) => {
  req.resume();
  req.on('end', () => {
    held.push(res);
    onHeld?.();
  });
});

function releaseHeld(): void {
  for (const res of held.splice(0)) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        id: 'chatcmpl-held',
        object: 'chat.completion',
        created: 1,
        model: 'upstream-slow-chat',
        choices: [{ index: 0, message: { role: 'assistant', content: 'done' }, finish_reason: 'stop' }],
        usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 },
      }),
    );
  }
}

const gw = gatewayFixture(
  async () => {
    const port = await listenLocal(upstream);
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => addUpstreamModel(cfg, 'slow-chat', `http://127.0.0.1:${port}/v1`, ['paid'])),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
      },
      node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } },
    };
  },
  async (g) => {
    ({ node, console: admin } = g);
    clock = minuteStart() + 13_000;
    await setClock(node.adminUrl!, { now_ms: clock });
  },
);
after(() => {
  releaseHeld();
  upstream.close();
});

async function nextMinute(offsetMs = 13_000): Promise<void> {
  clock = minuteStart(clock) + 60_000 + offsetMs;
  await setClock(node.adminUrl!, { now_ms: clock });
}

test('free key: 20 requests per minute with counting-down headers, the 21st gets 429 to the top of the minute', async () => {
  await nextMinute();
  const { key } = await gw.fundedKey({ tier: 'free' });
  for (let i = 1; i <= 20; i++) {
    const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`hi ${i}`) });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.headers.get('x-ratelimit-limit-requests'), '20');
    assert.equal(res.headers.get('x-ratelimit-remaining-requests'), String(20 - i));
    assert.equal(res.headers.get('x-ratelimit-limit-tokens'), '60000');
    assert.ok(Number(res.headers.get('x-ratelimit-remaining-tokens')) < 60000);
  }
  const refused = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(refused.status, 429);
  assert.equal(refused.headers.get('retry-after'), '47', 'seconds to the top of the next minute');
  assert.equal(refused.headers.get('x-ratelimit-remaining-requests'), '0');
  assert.deepEqual(Object.keys(refused.body.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(refused.body.error.type, 'requests');
  assert.equal(refused.body.error.param, null);
  assert.equal(refused.body.error.code, '429');
  assert.match(refused.body.error.message, /20\/20/);
  assert.match(refused.body.error.message, /60000/);
  assert.match(refused.body.error.message, /100/);
  // Listings count as requests too, and their refusals carry the headers like every answer.
  const models = await request(`${node.url}/v1/models`, { headers: bearer(key) });
  assert.equal(models.status, 429);
  assert.equal(models.headers.get('x-ratelimit-limit-requests'), '20');
  assert.equal(models.headers.get('x-ratelimit-remaining-requests'), '0');
  // The next clock minute admits again.
  await nextMinute(0);
  const again = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(again.status, 200);
  assert.equal(again.headers.get('x-ratelimit-remaining-requests'), '19');
});

test('tpm trips on a large prompt with type tokens; the refused request costs nothing', async () => {
  await nextMinute();
  const { key } = await gw.fundedKey({ tier: 'free' });
  const big = 'word '.repeat(70_000);
  const refused = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(big) });
  assert.equal(refused.status, 429, refused.text);
  assert.equal(refused.body.error.type, 'tokens');
  assert.equal(refused.body.error.param, null);
  assert.equal(refused.body.error.code, '429');
  assert.match(refused.body.error.message, /60000/);
  assert.equal(refused.headers.get('retry-after'), '47');
  const ok = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(ok.status, 200);
  assert.equal(ok.headers.get('x-ratelimit-remaining-requests'), '19', 'the refused request consumed no rpm');
});

test('the 101st parallel request of a key is refused and a finished request frees its slot', async () => {
  await nextMinute();
  const { key } = await gw.fundedKey({ tier: 'paid', creditMicros: 100_000_000 });
  const allHeld = new Promise<void>((resolve) => {
    onHeld = () => held.length >= 100 && resolve();
  });
  const inflight = Array.from({ length: 100 }, () =>
    request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('wait', 'slow-chat') }),
  );
  await allHeld;
  const refused = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('one more', 'slow-chat') });
  assert.equal(refused.status, 429, refused.text);
  assert.equal(refused.body.error.type, 'max_parallel_requests');
  assert.match(refused.body.error.message, /100\/100/);
  // Every gateway 429 counts to the top of the next clock minute, a parallel refusal too (it said 1 s).
  assert.equal(refused.headers.get('retry-after'), '47');
  releaseHeld();
  const done = await Promise.all(inflight);
  assert.ok(done.every((r) => r.status === 200));
  const after = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(after.status, 200, 'slots are released when requests finish');
});

test('tier change: an old key keeps 20 rpm, a key created after gets 300', async () => {
  await nextMinute();
  const first = await gw.fundedKey({ tier: 'free' });
  await admin.setOrgTier({ orgId: first.orgId, tier: 'paid' });
  await admin.creditOrg({ orgId: first.orgId, amountMicros: 10_000_000, note: 'test' });
  const second = await gw.fundedKey({ orgId: first.orgId, projectId: first.projectId });
  const oldRes = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(first.key), json: chatBody() });
  const newRes = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(second.key), json: chatBody() });
  assert.equal(oldRes.status, 200, oldRes.text);
  assert.equal(newRes.status, 200, newRes.text);
  assert.equal(oldRes.headers.get('x-ratelimit-limit-requests'), '20');
  assert.equal(oldRes.headers.get('x-ratelimit-limit-tokens'), '60000');
  assert.equal(newRes.headers.get('x-ratelimit-limit-requests'), '300');
  assert.equal(newRes.headers.get('x-ratelimit-limit-tokens'), '1000000');
});

test('a chunked body that grows over the 32 MB cap is refused with 413 while streaming', async () => {
  await nextMinute();
  const { key } = await gw.fundedKey({ tier: 'free' });
  const head =
    `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n` +
    `Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
  const chunk = Buffer.alloc(1024 * 1024, 0x20);
  const parts: Buffer[] = [];
  for (let i = 0; i < 33; i++) parts.push(Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n'));
  parts.push(Buffer.from('0\r\n\r\n'));
  const res = await rawRequest(node.url.replace('http://', ''), head, Buffer.concat(parts));
  assert.equal(res.status, 413);
  const body = JSON.parse(res.text.slice(res.text.indexOf('\r\n\r\n') + 4));
  assert.equal(body.error.code, '413');
  const next = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(next.status, 200, 'the node still serves');
});

test('a body refused by validation keeps its one request of rpm; model scope refusals consume nothing', async () => {
  // Issue 21: a body read and then refused for its content (400) counts one request, so bad bodies are
  // not free to send (docs/design.md#what-counts-as-a-request); before, it gave its request back.
  await nextMinute();
  const { key } = await gw.fundedKey({ tier: 'free', allowedModels: ['demo-chat'] });
  const missing = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'demo-chat' } });
  assert.equal(missing.status, 400);
  const unknown = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('x', 'no-such-model') });
  assert.equal(unknown.status, 400);
  const outOfScope = await request(`${node.url}/v1/embeddings`, { method: 'POST', headers: bearer(key), json: { model: 'demo-embed', input: 'x' } });
  assert.equal(outOfScope.status, 401);
  assert.equal(outOfScope.body.error.type, 'model_not_allowed');
  const ok = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(ok.status, 200);
  assert.equal(ok.headers.get('x-ratelimit-remaining-requests'), '17', 'the two 400s and the admitted request count');
});
