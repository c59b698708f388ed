// Every upstream object id a Responses request names is the caller's project's own (issue 34): all
// customers share the operator's one upstream account, so a response, a conversation or an item id
// another project learned would otherwise reach its owner's data through the model. For each id
// kind, project B naming project A's id is refused 404 Shape A over HTTP, SSE and WebSocket, and the
// fake upstream never receives the id; project A itself goes through.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import OpenAI from 'openai';
import { configYaml, addUpstreamModel } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { startFakeResponsesUpstream, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { bearer, request, type HttpResult } from '../helpers/http.js';
import { eventually } from '../helpers/data-plane.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { type DataPlane } from '../helpers/processes.js';
import { openRealtime } from '../helpers/realtime.js';

let node: DataPlane;
let upstream: FakeResponsesUpstream;
let a: DemoKey; // project A
let b: DemoKey; // project B, same organisation

const client = (k: DemoKey) => new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });

function assertNotFound(r: HttpResult, param: string | null, what: string): void {
  assert.equal(r.status, 404, `${what}: ${r.text}`);
  assert.equal(r.body?.error?.code, '404', what);
  assert.equal(r.body.error.type, 'invalid_request_error', what);
  assert.equal(r.body.error.param, param, what);
  assert.equal(typeof r.body.error.message, 'string', what);
}

/** Everything the fake upstream was sent, over HTTP and WebSocket, as one text. */
function upstreamSaw(): string {
  return JSON.stringify([upstream.requests.map((r) => [r.url, r.body]), upstream.sockets.map((s) => s.received)]);
}

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          // The built-in tools priced, so that a request naming an upstream object in one reaches its id check.
          addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid'], { tool_calls_usd: { web_search: '0.01', file_search: '0.0025', code_interpreter: '0.03', image_generation: '0.04' } });
          cfg.responses = { conversations_model: 'up-chat', prompts: { paid: ['pmpt_paid_allowed'] } };
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' },
      },
    };
  },
  async (g) => {
    node = g.node;
    a = await g.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
    b = await g.fundedKey({ orgId: a.orgId });
  },
);

test("every id kind of project A is 404 for project B over HTTP, SSE and WebSocket; the upstream never receives it", async (t) => {
  t.after(() => upstream.close());
  // Project A's objects, made through the gateway.
  const r = await client(a).responses.create({ model: 'up-chat', input: 'made by A' });
  const itemId = (r.output[0] as { id: string }).id;
  const conv = await client(a).conversations.create({ metadata: { owner: 'A' } });
  assert.match(conv.id, /^conv_/);
  const cases: Array<[string, string | null, Record<string, unknown>, string]> = [
    ['previous_response_id', 'previous_response_id', { previous_response_id: r.id }, r.id],
    ['conversation (string)', 'conversation', { conversation: conv.id }, conv.id],
    ['conversation ({id})', 'conversation', { conversation: { id: conv.id } }, conv.id],
    ['item_reference', 'input[0].id', { input: [{ type: 'item_reference', id: itemId }] }, itemId],
    ['prompt not in the tier list', 'prompt', { prompt: { id: 'pmpt_operator_secret' } }, 'pmpt_operator_secret'],
    ['an upstream file', 'input[0].content[0].file_id', { input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'file-operator' }] }] }, 'file-operator'],
    ['an upstream vector store', 'tools[0].vector_store_ids[0]', { tools: [{ type: 'file_search', vector_store_ids: ['vs_operator'] }] }, 'vs_operator'],
  ];
  const socket = await openRealtime(node.address, { key: b.key, model: 'up-chat', path: '/v1/responses' });
  let errors = 0;
  for (const [what, param, fields, id] of cases) {
    const body = { model: 'up-chat', input: 'hello', ...fields };
    assertNotFound(await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: body }), param, `${what} over HTTP`);
    assertNotFound(await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { ...body, stream: true } }), param, `${what} with stream: true`);
    socket.session.send({ type: 'response.create', ...body });
    const err = await socket.session.waitFor('error', ++errors);
    assert.deepEqual([err.status, err.error.code, err.error.param], [404, '404', param], `${what} over WebSocket`);
    assert.equal(upstreamSaw().includes(id), false, `${what}: the upstream never received ${id}`);
  }
  // Compact and input_tokens check what they name too.
  for (const path of ['/v1/responses/compact', '/v1/responses/input_tokens']) {
    for (const [param, fields] of [['previous_response_id', { previous_response_id: r.id }], ['conversation', { conversation: conv.id }], ['conversation', { conversation: { id: conv.id } }]] as const) {
      assertNotFound(await request(`${node.url}${path}`, { method: 'POST', headers: bearer(b.key), json: { model: 'up-chat', ...fields } }), param, `${path} ${param} by B`);
    }
  }
  // The conversation's own paths, as for stored responses.
  for (const [method, path] of [['GET', `/v1/conversations/${conv.id}`], ['POST', `/v1/conversations/${conv.id}`], ['DELETE', `/v1/conversations/${conv.id}`], ['GET', `/v1/conversations/${conv.id}/items`], ['POST', `/v1/conversations/${conv.id}/items`], ['GET', `/v1/conversations/${conv.id}/items/${itemId}`], ['DELETE', `/v1/conversations/${conv.id}/items/${itemId}`]]) {
    const json = method === 'POST' ? (path.endsWith('/items') ? { items: [{ type: 'message', role: 'user', content: 'x' }] } : { metadata: {} }) : undefined;
    assertNotFound(await request(`${node.url}${path}`, { method, headers: bearer(b.key), json }), null, `${method} ${path} by B`);
  }
  // An item_reference in a conversation's items is checked as in a create.
  assertNotFound(await request(`${node.url}/v1/conversations`, { method: 'POST', headers: bearer(b.key), json: { items: [{ type: 'item_reference', id: itemId }] } }), 'items[0].id', 'create with A’s item');
  assert.equal(upstreamSaw().includes(conv.id), false, 'the upstream never received the conversation id from B');
  assert.equal(upstreamSaw().includes(r.id), false, 'the upstream never received the response id from B');
  // An id nobody created is refused alike.
  assertNotFound(await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { model: 'up-chat', input: 'x', conversation: 'conv_nobody' } }), 'conversation', 'unknown conversation');
  socket.ws.close(1000);

  // Project A itself goes through with each of its own ids (and the prompt its tier lists).
  const own: Array<Record<string, unknown>> = [
    { previous_response_id: r.id },
    { conversation: conv.id },
    { conversation: { id: conv.id } },
    { input: [{ type: 'item_reference', id: itemId }] },
    { prompt: { id: 'pmpt_paid_allowed' } },
  ];
  for (const fields of own) {
    const res = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(a.key), json: { model: 'up-chat', input: 'hello', ...fields } });
    assert.equal(res.status, 200, `A with ${JSON.stringify(fields)}: ${res.text}`);
  }
  // An input item is the project's once its response's input items were listed to it.
  const inputItem = (await client(a).responses.inputItems.list(r.id)).data[0].id;
  const refInput = { model: 'up-chat', input: [{ type: 'item_reference', id: inputItem }] };
  assertNotFound(await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: refInput }), 'input[0].id', 'B names A’s input item');
  const ownInput = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(a.key), json: refInput });
  assert.equal(ownInput.status, 200, ownInput.text);
  const sa = await openRealtime(node.address, { key: a.key, model: 'up-chat', path: '/v1/responses' });
  sa.session.send({ type: 'response.create', model: 'up-chat', input: 'go on', conversation: conv.id });
  await sa.session.waitFor('response.completed');
  assert.equal(sa.session.count('error'), 0);
  sa.ws.close(1000);

  // Another node learns who owns the conversation and the item from the control plane, as it learns
  // a response's owner; until then it refuses them to everyone.
  const node2 = await gw.addNode({ nodeId: 'responses-ids-node-2' });
  await eventually(async () => (await request(`${node2.url}/v1/conversations/${conv.id}`, { headers: bearer(a.key) })).status === 200, 'the conversation on node 2');
  assertNotFound(await request(`${node2.url}/v1/conversations/${conv.id}`, { headers: bearer(b.key) }), null, 'B on node 2');
  assertNotFound(await request(`${node2.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { model: 'up-chat', input: [{ type: 'item_reference', id: itemId }] } }), 'input[0].id', 'B’s item_reference on node 2');
  const withItem = await request(`${node2.url}/v1/responses`, { method: 'POST', headers: bearer(a.key), json: { model: 'up-chat', input: [{ type: 'item_reference', id: itemId }] } });
  assert.equal(withItem.status, 200, withItem.text);
});
