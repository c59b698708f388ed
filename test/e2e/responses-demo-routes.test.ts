// The demo provider answers the Conversations API, compact and input_tokens (the embedded `npm start`
// has no network), and owner records are bounded per project (issue 34): a project that floods
// its stored responses past its bound loses its own oldest records, never another project's. The
// bound is made small here through the config (`responses.owner_records_per_project`).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import OpenAI from 'openai';
import { configYaml } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { bearer, request } from '../helpers/http.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { cliJsonAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageTotals } from '../helpers/usage-db.js';

const BOUND = 20;
let cp: ControlPlane;
let node: DataPlane;
let a: DemoKey;
let b: DemoKey;

const gw = gatewayFixture(
  {
    controlPlane: {
      configYaml: configYaml((cfg) => {
        cfg.responses = { owner_records_per_project: BOUND };
      }),
    },
  },
  async (g) => {
    ({ cp, node } = g);
    a = await g.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
    b = await g.fundedKey({ orgId: a.orgId });
  },
);

const client = (k: DemoKey) => new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });

test('the demo provider answers conversations, compact and input_tokens; usage read back through the CLI', async () => {
  const k = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  const c = client(k);
  const conv = await c.conversations.create({ items: [{ type: 'message', role: 'user', content: 'Hello demo' }], metadata: { topic: 'demo' } });
  assert.equal(conv.object, 'conversation');
  assert.match(conv.id, /^conv_/);
  assert.deepEqual((await c.conversations.retrieve(conv.id)).metadata, { topic: 'demo' });
  assert.deepEqual((await c.conversations.update(conv.id, { metadata: { topic: 'two' } })).metadata, { topic: 'two' });
  const added = await c.conversations.items.create(conv.id, { items: [{ type: 'message', role: 'user', content: 'Second line' }] });
  assert.equal(added.data.length, 1);
  const r = await c.responses.create({ model: 'demo-chat', input: 'Answer me', conversation: conv.id });
  assert.match(r.output_text, /Answer me/);
  // The response's input and output joined the conversation.
  const items = await c.conversations.items.list(conv.id, { order: 'asc' });
  assert.equal(items.data.length, 4);
  const itemId = items.data[0].id!;
  assert.equal((await c.conversations.items.retrieve(itemId, { conversation_id: conv.id })).id, itemId);
  assert.equal((await c.conversations.items.delete(itemId, { conversation_id: conv.id })).id, conv.id);
  // No model: the conversation's.
  const count = await c.responses.inputTokens.count({ conversation: conv.id, input: 'how long?' });
  assert.equal(count.object, 'response.input_tokens');
  assert.ok(count.input_tokens > 3, String(count.input_tokens));
  const compacted = await c.responses.compact({ model: null, previous_response_id: r.id });
  assert.equal(compacted.object, 'response.compaction');
  assert.equal(compacted.output[compacted.output.length - 1].type, 'compaction');
  assert.ok(compacted.usage.input_tokens > 0 && compacted.usage.output_tokens > 0);
  assert.deepEqual(await c.conversations.delete(conv.id), { id: conv.id, object: 'conversation.deleted', deleted: true });
  assert.equal((await request(`${node.url}/v1/conversations/${conv.id}`, { headers: bearer(k.key) })).status, 404);

  // Eleven requests; tokens for the create and the compaction only.
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 11);
  const input = r.usage!.input_tokens + compacted.usage.input_tokens;
  const output = r.usage!.output_tokens + compacted.usage.output_tokens;
  assert.deepEqual(rows.map((x) => [x.model, x.requests, x.prompt_tokens, x.completion_tokens]), [['demo-chat', 11, input, output]]);
  const u = await cliJsonAsync(cp, cp.secrets.operatorToken, ['usage', '--project', k.projectId, '--by', 'model']);
  assert.deepEqual(u.rows.map((x: any) => [x.model, x.requests, x.input_tokens, x.output_tokens]), [['demo-chat', 11, input, output]]);
});

test("a flood of one project's stored responses past its bound leaves another project's responses readable", async () => {
  const ofB = [];
  for (let i = 0; i < 2; i++) ofB.push(await client(b).responses.create({ model: 'demo-chat', input: `B number ${i}` }));
  const ofA = [];
  for (let i = 0; i < 3 * BOUND; i++) ofA.push(await client(a).responses.create({ model: 'demo-chat', input: `A number ${i}` }));
  for (const r of ofB) {
    const got = await request(`${node.url}/v1/responses/${r.id}`, { headers: bearer(b.key) });
    assert.equal(got.status, 200, `B's ${r.id} after A's flood: ${got.text}`);
  }
  // A's own oldest went; its newest is there.
  assert.equal((await request(`${node.url}/v1/responses/${ofA[0].id}`, { headers: bearer(a.key) })).status, 404);
  assert.equal((await request(`${node.url}/v1/responses/${ofA[ofA.length - 1].id}`, { headers: bearer(a.key) })).status, 200);
  // A chain from B's response still goes on.
  const cont = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(b.key), json: { model: 'demo-chat', input: 'go on', previous_response_id: ofB[0].id } });
  assert.equal(cont.status, 200, cont.text);
});
