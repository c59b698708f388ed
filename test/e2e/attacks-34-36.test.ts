// An attacker's review of the Responses API's owned ids (issue 34): requests that named an upstream
// object another project (or the operator) holds by a route the id checks did not cover. Each is
// refused (404 Shape A over HTTP, SSE and WebSocket; an in-band error on a socket), and the fake
// upstream never receives the id. And one piece of evidence for upstream pools (issue 36): a pooled
// request whose client left is never failed over.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { configYaml, addUpstreamModel } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { startFakeResponsesUpstream, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { eventually } from '../helpers/data-plane.js';
import { cliJsonAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { bearer, request, type HttpResult } from '../helpers/http.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { openRealtime } from '../helpers/realtime.js';

let node: DataPlane;
let cp: ControlPlane;
let upstream: FakeResponsesUpstream;
/** A pooled model's two deployments: the first never answers, the second would. */
let stall: FakeUpstream;
let spare: FakeUpstream;
let a: DemoKey; // project A
let b: DemoKey; // project B, same organisation

const client = (k: DemoKey) => new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });

function assertNotFound(r: HttpResult, param: string | null, what: string): void {
  assert.equal(r.status, 404, `${what}: ${r.text}`);
  assert.deepEqual([r.body?.error?.code, r.body?.error?.type, r.body?.error?.param], ['404', 'invalid_request_error', param], what);
}

/** Everything the fake upstream was sent, over HTTP and WebSocket, as one text. */
function upstreamSaw(): string {
  return JSON.stringify([upstream.requests.map((r) => [r.url, r.body]), upstream.sockets.map((s) => s.received)]);
}

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    stall = await startFakeUpstream();
    stall.setMode('stall');
    spare = await startFakeUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid']);
          cfg.responses = { conversations_model: 'up-chat', prompts: { paid: ['pmpt_paid_allowed'] } };
          const dep = (id: string, baseUrl: string, weight: number) => ({ id, base_url: baseUrl, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', weight });
          // The stalled deployment first (the draw picks the other once in 10^9); its head times out after 2 s.
          cfg.models.push({ id: 'pool-abort', provider: 'openai', kind: 'chat', input_usd_per_mtok: '0.50', output_usd_per_mtok: '1.50', timeout_ms: 2_000, failover_timeout_ms: 10_000, deployments: [dep('stall', stall.baseUrl, 1_000_000_000), dep('spare', spare.baseUrl, 1)] });
          cfg.tiers.paid.models.push('pool-abort');
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' },
      },
    };
  },
  async (g) => {
    node = g.node;
    cp = g.cp;
    a = await g.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
    b = await g.fundedKey({ orgId: a.orgId });
  },
);
after(async () => {
  await Promise.all([upstream, stall, spare].map((f) => f?.close()));
});

// Before: only a message's `content` parts were searched for a `file_id`, so an upstream file (never
// created through Tollgate: the operator's) reached the model through a tool call's output parts, a
// computer screenshot or a prompt's variables.
test('an upstream file named in a tool output, a screenshot or a prompt variable is 404 over HTTP, SSE and WebSocket; never forwarded', async () => {
  const cases: Array<[string, string, Record<string, unknown>, string]> = [
    ['function_call_output parts', 'input[0].output[0].file_id', { input: [{ type: 'function_call_output', call_id: 'call_1', output: [{ type: 'input_file', file_id: 'file-fco' }] }] }, 'file-fco'],
    ['custom_tool_call_output parts', 'input[0].output[1].file_id', { input: [{ type: 'custom_tool_call_output', call_id: 'call_2', output: [{ type: 'input_text', text: 'see' }, { type: 'input_image', file_id: 'file-ctco' }] }] }, 'file-ctco'],
    ['computer_call_output screenshot', 'input[0].output.file_id', { input: [{ type: 'computer_call_output', call_id: 'call_3', output: { type: 'computer_screenshot', file_id: 'file-shot' } }] }, 'file-shot'],
    ['prompt variable', 'prompt.variables.doc.file_id', { input: 'x', prompt: { id: 'pmpt_paid_allowed', variables: { doc: { type: 'input_file', file_id: 'file-var' } } } }, 'file-var'],
  ];
  const socket = await openRealtime(node.address, { key: b.key, model: 'up-chat', path: '/v1/responses' });
  let errors = 0;
  for (const [what, param, fields, id] of cases) {
    const body = { model: 'up-chat', ...fields };
    assertNotFound(await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: body }), param, `${what} over HTTP`);
    assertNotFound(await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { ...body, stream: true } }), param, `${what} with stream: true`);
    assertNotFound(await request(`${node.url}/v1/responses/input_tokens`, { method: 'POST', headers: bearer(b.key), json: body }), param, `${what} counted`);
    socket.session.send({ type: 'response.create', ...body });
    const err = await socket.session.waitFor('error', ++errors);
    assert.deepEqual([err.status, err.error.code, err.error.param], [404, '404', param], `${what} over WebSocket`);
    assert.equal(upstreamSaw().includes(id), false, `${what}: the upstream never received ${id}`);
  }
  socket.ws.close(1000);
  await socket.session.waitClosed();
});

// Before: a conversation item path checked only the conversation: project B could name project A's
// item id under a conversation of its own, and the id went upstream.
test("another project's item under one's own conversation is 404, never forwarded", async () => {
  const convA = await client(a).conversations.create({});
  const added = await client(a).conversations.items.create(convA.id, { items: [{ type: 'message', role: 'user', content: 'A secret' }] });
  const itemA = added.data[0].id!;
  const convB = await client(b).conversations.create({});
  for (const method of ['GET', 'DELETE']) {
    const before = upstream.requests.length;
    assertNotFound(await request(`${node.url}/v1/conversations/${convB.id}/items/${itemA}`, { method, headers: bearer(b.key) }), null, `${method} A's item under B's conversation`);
    assert.equal(upstream.requests.length, before, `${method}: the upstream was never asked`);
  }
  assert.equal(upstreamSaw().includes(`${convB.id}/items/${itemA}`), false);
  // A's own item, under A's conversation, still goes through.
  assert.equal((await client(a).conversations.items.retrieve(itemA, { conversation_id: convA.id })).id, itemA);
});

// Before: a create naming another project's response reserved that response's context (its input
// and output, as this node saw it end) before the id was refused, and the 404's rate headers showed
// the reservation: project B learned that A's id exists and how many tokens its response holds,
// though a refused id must read the same whether it exists or not.
test("a refusal of another project's response id reads the same as an unknown id's: its context is not reserved", async () => {
  const r = await client(a).responses.create({ model: 'up-chat', input: 'made by A' });
  const remaining = async (id: string) => {
    const res = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { model: 'up-chat', input: 'hi', previous_response_id: id } });
    assertNotFound(res, 'previous_response_id', `B names ${id}`);
    return Number(res.headers.get('x-ratelimit-remaining-tokens'));
  };
  const unknown = await remaining(`resp_${'0'.repeat(r.id.length - 5)}`);
  assert.ok(Number.isSafeInteger(unknown), 'the 404 carries the rate headers');
  assert.equal(await remaining(r.id), unknown);
});

// Before: a Responses socket passed every client event but a create upstream unread (only a repeated
// key was refused). The beta `response.steer` carries input (files among it) and a
// `previous_response_id`, and queues a successor response: another project's id, an upstream file and
// input that no admission counted reached the upstream.
test('a Responses socket refuses every client event but response.create in-band; none reaches the upstream', async () => {
  const r = await client(a).responses.create({ model: 'up-chat', input: 'made by A' });
  const s = await openRealtime(node.address, { key: b.key, model: 'up-chat', path: '/v1/responses' });
  const steer = { type: 'response.steer', previous_response_id: r.id, input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'file-steer' }] }] };
  s.session.send(steer);
  s.session.send({ type: 'conversation.item.create', item: { type: 'item_reference', id: r.id } });
  for (const n of [1, 2]) {
    const err = await s.session.waitFor('error', n);
    assert.deepEqual([err.error.code, err.error.param], ['unknown_event', 'type'], JSON.stringify(err));
  }
  // The socket goes on: a create after them is served.
  s.session.send({ type: 'response.create', model: 'up-chat', input: 'hello' });
  await s.session.waitFor('response.completed');
  s.ws.close(1000);
  await s.session.waitClosed();
  assert.equal(upstreamSaw().includes('file-steer'), false);
  assert.equal(upstream.sockets.some((x) => JSON.stringify(x.received).includes(r.id)), false, "A's id never went upstream from B's socket");
});

// Evidence for issue 36's failover (passes on main): a client that leaves while a pooled request's
// first attempt waits for its head is never failed over to another deployment when that attempt then
// fails (its head timing out); the request ends once, billed once, as any abort.
test('a pooled request whose client left is not failed over when its attempt then fails: one ending, one row', async () => {
  const fresh = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  const ac = new AbortController();
  const sent = fetch(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${fresh.key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'pool-abort', messages: [{ role: 'user', content: 'hi' }] }), signal: ac.signal });
  await stall.waitForRequests(1);
  ac.abort();
  await sent.catch(() => undefined);
  // The node ends the stalled attempt at its head timeout, within the abort's usage grace.
  await stall.waitForClientClose();
  let rows: Array<Record<string, unknown>> = [];
  await eventually(async () => {
    const logs = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['logs', '--key', fresh.keyId, '--all'])).logs as Array<Record<string, unknown>>;
    // The key's readiness probe (a GET answered 405) is logged too.
    rows = logs.filter((l) => l.model === 'pool-abort');
    return rows.length > 0;
  }, 'the aborted request logged');
  assert.equal(rows.length, 1, JSON.stringify(rows));
  assert.deepEqual([rows[0].status, rows[0].deployment, rows[0].attempts], [499, 'stall', 'stall:aborted']);
  assert.equal(spare.requests.length, 0, 'never failed over after its client left');
});
