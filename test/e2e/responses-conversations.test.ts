// The Conversations API, `POST /v1/responses/compact` and `POST /v1/responses/input_tokens` (issue 34),
// driven by the official openai client against a fake OpenAI-compatible upstream: each forwarded as
// OpenAI documents it, billed as the upstream charges (a compaction its usage; conversations and
// counts a request of rpm and no tokens), a count or compaction without `model` taking the model of
// what it names, the usage read back through the CLI.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { configYaml, addUpstreamModel } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { COMPACT_USAGE, COUNTED_INPUT_TOKENS } from '../helpers/fake-conversations-upstream.js';
import { startFakeResponsesUpstream, USAGE, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { bearer, request } from '../helpers/http.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { cliJsonAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageTotals } from '../helpers/usage-db.js';

let cp: ControlPlane;
let node: DataPlane;
let upstream: FakeResponsesUpstream;
let k: DemoKey;

const IN = 500_000;
const CACHED = 50_000;
const OUT = 1_500_000;
const CREATE_COST = Math.ceil(((USAGE.input_tokens - USAGE.input_tokens_details.cached_tokens) * IN + USAGE.input_tokens_details.cached_tokens * CACHED + USAGE.output_tokens * OUT) / 1e6);
const COMPACT_COST = Math.ceil((COMPACT_USAGE.input_tokens * IN + COMPACT_USAGE.output_tokens * OUT) / 1e6);

gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid'], { cached_input_usd_per_mtok: '0.05' });
          cfg.responses = { conversations_model: 'up-chat' };
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' },
      },
    };
  },
  async (g) => {
    ({ cp, node } = g);
    k = await g.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  },
);
after(async () => {
  await upstream?.close();
});

const last = () => upstream.requests[upstream.requests.length - 1];

test('client.conversations.*, responses.compact and responses.inputTokens.count through the gateway, billed as the upstream charges', async () => {
  const c = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const conv = await c.conversations.create({ items: [{ type: 'message', role: 'user', content: 'Hello conversation' }], metadata: { topic: 'one' } });
  assert.equal(conv.object, 'conversation');
  assert.match(conv.id, /^conv_/);
  assert.deepEqual([last().method, last().url, last().headers.authorization], ['POST', '/v1/conversations', 'Bearer sk-upstream-test']);
  assert.deepEqual((await c.conversations.retrieve(conv.id)).metadata, { topic: 'one' });
  assert.deepEqual((await c.conversations.update(conv.id, { metadata: { topic: 'two' } })).metadata, { topic: 'two' });
  const added = await c.conversations.items.create(conv.id, { items: [{ type: 'message', role: 'user', content: 'More' }] });
  assert.equal(added.data.length, 1);
  const listed = await c.conversations.items.list(conv.id);
  assert.equal(listed.data.length, 2);
  const itemId = added.data[0].id!;
  assert.equal((await c.conversations.items.retrieve(itemId, { conversation_id: conv.id })).id, itemId);
  assert.equal((await c.conversations.items.delete(itemId, { conversation_id: conv.id })).id, conv.id);

  const r = await c.responses.create({ model: 'up-chat', input: 'Go on', conversation: conv.id });
  assert.equal(last().body.conversation, conv.id);
  // No model: the conversation's (its owner record says which model's upstream holds it).
  const count = await c.responses.inputTokens.count({ conversation: conv.id, input: 'how long?' });
  assert.deepEqual(count, { object: 'response.input_tokens', input_tokens: COUNTED_INPUT_TOKENS });
  assert.deepEqual([last().url, last().body.model, last().body.conversation], ['/v1/responses/input_tokens', 'upstream-up-chat', conv.id]);
  const compacted = await c.responses.compact({ model: null, previous_response_id: r.id });
  assert.equal(compacted.object, 'response.compaction');
  assert.equal(compacted.output[compacted.output.length - 1].type, 'compaction');
  assert.deepEqual([last().url, last().body.model, last().body.previous_response_id], ['/v1/responses/compact', 'upstream-up-chat', r.id]);
  // The answer says what it cost, as a create's does.
  assert.deepEqual(compacted.usage, { ...COMPACT_USAGE, cost: COMPACT_COST / 1e6 });

  const del = await c.conversations.delete(conv.id);
  assert.deepEqual(del, { id: conv.id, object: 'conversation.deleted', deleted: true });
  // Deleted: the gateway forgot it, and answers 404 without asking the upstream.
  const before = upstream.requests.length;
  const gone = await request(`${node.url}/v1/conversations/${conv.id}`, { headers: bearer(k.key) });
  assert.equal(gone.status, 404, gone.text);
  assert.equal(upstream.requests.length, before);

  // Without a model and naming nothing to take one from: 400 on `model`, nothing forwarded.
  for (const path of ['/v1/responses/compact', '/v1/responses/input_tokens']) {
    const res = await request(`${node.url}${path}`, { method: 'POST', headers: bearer(k.key), json: { input: 'x' } });
    assert.equal(res.status, 400, res.text);
    assert.equal(res.body.error.param, 'model');
  }
  assert.equal(upstream.requests.length, before);
  const wrongMethod = await request(`${node.url}/v1/responses/compact`, { method: 'GET', headers: bearer(k.key) });
  assert.equal(wrongMethod.status, 405, wrongMethod.text);
  assert.equal(wrongMethod.headers.get('allow'), 'POST');

  // Eleven requests: seven on the conversation, the create, the count, the compaction, the delete;
  // tokens and money only for the create and the compaction (the refusals cost nothing).
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 11);
  assert.deepEqual(
    rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens, x.cost_micros]),
    [['up-chat', 11, USAGE.input_tokens + COMPACT_USAGE.input_tokens, USAGE.output_tokens + COMPACT_USAGE.output_tokens, CREATE_COST + COMPACT_COST]],
  );
  const u = await cliJsonAsync(cp, cp.secrets.operatorToken, ['usage', '--project', k.projectId, '--by', 'model']);
  assert.deepEqual(
    u.rows.map((x: any) => [x.model, x.requests, x.input_tokens, x.output_tokens]),
    [['up-chat', 11, USAGE.input_tokens + COMPACT_USAGE.input_tokens, USAGE.output_tokens + COMPACT_USAGE.output_tokens]],
  );
});
