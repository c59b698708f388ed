// Owner records of the Responses API's upstream objects (issue 34): bounded per project, so that one
// project cannot evict another's; every id a request names checked against the key's project
// (owned-ids.ts); the conversation paths; the config's `responses:` section.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { hashKey } from '../../proto/lib/keys.js';
import type { GatewayConfig, KeyEntry } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { ResponseOwners } from '../../data-plane/state/response-owners.js';
import { namedIdRefusal } from '../../data-plane/endpoints/responses/owned-ids.js';
import { GatewayError } from '../../data-plane/errors.js';
import { parseConversationPath } from '../../data-plane/routing/responses-paths.js';
import { parseResponsesConfig } from '../../control-plane/gateway-config/responses-config.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { ItemIdsReader, ResponsesJsonReader, ResponsesSseReader } from '../../data-plane/proxy/usage/responses-usage-readers.js';

const pepper = Buffer.alloc(32, 7);
const config: GatewayConfig = {
  serviceName: 'tollgate',
  tiers: [{ name: 'free', rpm: 20, tpm: 60000, maxParallelRequests: 100, freeGrantMicros: 5, allowedModels: ['chat'] }],
  models: [{ id: 'chat', provider: 'demo', upstreamModel: '', baseUrl: '', upstreamApiKey: '', kind: 'chat', inputMicrosPerMtok: 1, outputMicrosPerMtok: 1, audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments: [], maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0 }],
  toolBackends: [],
  realtimeUpstreams: [],
  trustedProxies: [],
  maxStalenessMs: 0,
  responses: { ownerRecordsPerProject: 0, ownerRecordsPerOrg: 0, conversationsModel: '', prompts: [{ tier: 'free', promptIds: ['pmpt_ok'] }], vectorStores: [{ tier: 'free', vectorStoreIds: ['vs_ok'] }] },
};

function keyEntry(id: string, value: string, projectId: string): KeyEntry {
  return { keyId: id, keyHash: hashKey(pepper, value), projectId, orgId: 'org_1', allowedModels: [], rpmLimit: 20, tpmLimit: 60000, maxParallelRequests: 100 };
}

const state = GatewayState.fromSnapshot({
  version: 1,
  config,
  keys: [keyEntry('key_a', 'sk-a', 'proj_a'), keyEntry('key_b', 'sk-b', 'proj_b')],
  orgs: [{ orgId: 'org_1', tier: 'free', blocked: false, blockedReason: '', fundsVersion: 0 } as never],
  tombstones: [],
});
const keyA = state.lookup(pepper, 'sk-a')!;
const keyB = state.lookup(pepper, 'sk-b')!;

test("a project past its bound loses its own oldest records, never another project's", () => {
  const o = new ResponseOwners({ maxEntries: 1_000, perProject: () => 3 });
  o.add('b1', { projectId: 'proj_b', model: 'chat', createdAtMs: 1 });
  for (let i = 0; i < 10; i++) o.add(`a${i}`, { projectId: 'proj_a', model: 'chat', createdAtMs: 10 + i });
  assert.equal(o.get('b1', 100)?.projectId, 'proj_b');
  assert.equal(o.countOf('proj_a'), 3);
  assert.deepEqual(['a6', 'a7', 'a8', 'a9'].map((id) => o.get(id, 100) !== undefined), [false, true, true, true]);
  // The sync's echo of a record this node evicted is not added again (it would evict a newer one).
  o.add('a0', { projectId: 'proj_a', model: 'chat', createdAtMs: 10 });
  assert.equal(o.get('a0', 100), undefined);
  assert.equal(o.get('a7', 100)?.projectId, 'proj_a');
  // A known id brought again keeps its place.
  o.add('a7', { projectId: 'proj_a', model: 'chat', createdAtMs: 17 });
  // An id never changes hands: another project's answer naming it again leaves it the first owner's.
  o.add('a9', { projectId: 'proj_b', model: 'chat', createdAtMs: 30 });
  assert.equal(o.get('a9', 100)?.projectId, 'proj_a');
  o.add('a10', { projectId: 'proj_a', model: 'chat', createdAtMs: 20 });
  assert.equal(o.get('a7', 100), undefined);
});

test("past the node's cap the project holding the most gives up its oldest", () => {
  // Before issue 34 the cap evicted the oldest of all: a flood of one project's creates evicted every other project's.
  const o = new ResponseOwners({ maxEntries: 5, perProject: () => 1_000 });
  o.add('b1', { projectId: 'proj_b', model: 'chat', createdAtMs: 1 });
  o.add('b2', { projectId: 'proj_b', model: 'chat', createdAtMs: 2 });
  for (let i = 0; i < 20; i++) o.add(`a${i}`, { projectId: 'proj_a', model: 'chat', createdAtMs: 10 + i });
  assert.ok(o.size <= 5);
  assert.equal(o.get('b1', 100)?.projectId, 'proj_b');
  assert.equal(o.get('b2', 100)?.projectId, 'proj_b');
  assert.equal(o.get('a19', 100)?.projectId, 'proj_a');
});

test('every id a body names must be the key’s project’s own: 404 on the param at fault', () => {
  const o = new ResponseOwners();
  for (const id of ['resp_a', 'conv_a', 'msg_a']) o.add(id, { projectId: 'proj_a', model: 'chat', createdAtMs: 1 });
  const cases: Array<[Record<string, unknown>, string | null]> = [
    [{ previous_response_id: 'resp_a' }, 'previous_response_id'],
    [{ conversation: 'conv_a' }, 'conversation'],
    [{ conversation: { id: 'conv_a' } }, 'conversation'],
    [{ input: ['x', { type: 'item_reference', id: 'msg_a' }] }, 'input[1].id'],
    [{ input: [{ id: 'msg_a' }] }, 'input[0].id'],
    [{ prompt: { id: 'pmpt_other' } }, 'prompt'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'file-1' }] }] }, 'input[0].content[0].file_id'],
    [{ tools: [{ type: 'code_interpreter', container: 'cntr_1' }] }, 'tools[0].container'],
    [{ tools: [{ type: 'function', name: 'f' }, { type: 'code_interpreter', container: { type: 'auto', file_ids: ['file-2'] } }] }, 'tools[1].container.file_ids[0]'],
    [{ tools: [{ type: 'image_generation', input_image_mask: { file_id: 'file-3' } }] }, 'tools[0].input_image_mask.file_id'],
  ];
  for (const [body, param] of cases) {
    const err = namedIdRefusal(body, keyB, state, o, 2);
    assert.ok(err instanceof GatewayError, JSON.stringify(body));
    assert.deepEqual([err.code, err.param], ['NOT_FOUND', param], JSON.stringify(body));
    // Project A may name its own (the prompt is the tier's, the files nobody's).
    const own = namedIdRefusal(body, keyA, state, o, 2);
    if (param === 'prompt' || param?.includes('file_id') || param?.includes('container')) assert.ok(own, JSON.stringify(body));
    else assert.equal(own, null, JSON.stringify(body));
  }
  assert.equal(namedIdRefusal({ prompt: { id: 'pmpt_ok' } }, keyB, state, o, 2), null);
  // The operator's vector stores, as its prompts: each one the tier's list names, else 404 naming the first that is not.
  assert.equal(namedIdRefusal({ tools: [{ type: 'file_search', vector_store_ids: ['vs_ok'] }] }, keyB, state, o, 2), null);
  assert.equal(namedIdRefusal({ tools: [{ type: 'file_search', vector_store_ids: ['vs_ok', 'vs_other'] }] }, keyB, state, o, 2)?.param, 'tools[0].vector_store_ids[1]');
  assert.equal(namedIdRefusal({ items: [{ type: 'item_reference', id: 'msg_a' }] }, keyB, state, o, 2, 'items')?.param, 'items[0].id');
  // A message with content and an id is sent by content: not a reference.
  assert.equal(namedIdRefusal({ input: [{ id: 'msg_x', role: 'user', content: 'hi' }] }, keyB, state, o, 2), null);
  assert.equal(namedIdRefusal({ conversation: 42 }, keyB, state, o, 2)?.code, 'INVALID_REQUEST');
  // A code interpreter the upstream makes a container for names no id.
  assert.equal(namedIdRefusal({ tools: [{ type: 'code_interpreter', container: { type: 'auto' } }] }, keyB, state, o, 2), null);
});

test('conversation paths', () => {
  assert.deepEqual(parseConversationPath('/v1/conversations'), { action: 'create', id: '', itemId: '' });
  assert.deepEqual(parseConversationPath('/v1/conversations/conv_1'), { action: 'conversation', id: 'conv_1', itemId: '' });
  assert.deepEqual(parseConversationPath('/v1/conversations/conv_1/items'), { action: 'items', id: 'conv_1', itemId: '' });
  assert.deepEqual(parseConversationPath('/v1/conversations/conv_1/items/msg_2'), { action: 'item', id: 'conv_1', itemId: 'msg_2' });
  for (const p of ['/v1/conversations/', '/v1/conversations/conv_1/other', '/v1/conversations/conv_1/items/msg_2/x', '/v1/conversations/a%2Fb', '/v1/conversationsx']) assert.equal(parseConversationPath(p), null, p);
});

test('the responses: config section', () => {
  const known = { models: new Map([['chat', { kind: 'chat' }], ['embed', { kind: 'embeddings' }]]), tiers: new Map([['free', {}]]) };
  assert.deepEqual(parseResponsesConfig(undefined, known), { ownerRecordsPerProject: 100_000, ownerRecordsPerOrg: 250_000, conversationsModel: '', prompts: [], vectorStores: [] });
  assert.deepEqual(parseResponsesConfig({ owner_records_per_project: 7, conversations_model: 'chat', prompts: { free: ['p1', 'p1'] }, vector_stores: { free: ['vs_1'] } }, known), {
    ownerRecordsPerProject: 7,
    ownerRecordsPerOrg: 250_000,
    conversationsModel: 'chat',
    prompts: [{ tier: 'free', promptIds: ['p1'] }],
    vectorStores: [{ tier: 'free', vectorStoreIds: ['vs_1'] }],
  });
  // The organisation's bound: as given, else 250,000 or the project's when that is larger.
  assert.equal(parseResponsesConfig({ owner_records_per_org: 30 }, known).ownerRecordsPerOrg, 30);
  assert.equal(parseResponsesConfig({ owner_records_per_project: 400_000 }, known).ownerRecordsPerOrg, 400_000);
  for (const bad of [{ owner_records_per_project: 0 }, { owner_records_per_org: 0 }, { owner_records_per_org: 1.5 }, { conversations_model: 'embed' }, { conversations_model: 'nope' }, { prompts: { gold: [] } }, { prompts: { free: [1] } }, { vector_stores: { gold: [] } }, { vector_stores: ['vs_1'] }, { other: 1 }, []]) {
    assert.throws(() => parseResponsesConfig(bad, known), ConfigError, JSON.stringify(bad));
  }
});

test('ids an answer names are named before the chunk holding their end goes on', () => {
  // Before, items were recorded when the exchange ended, after the client could have the answer: an
  // item_reference sent at once could be refused.
  const seen: string[][] = [];
  const list = new ItemIdsReader('data', (ids) => seen.push(ids));
  const text = JSON.stringify({ object: 'list', data: [{ id: 'msg_1', type: 'message' }, { id: 'msg_2' }], has_more: false });
  const cut = text.indexOf('has_more');
  assert.equal(list.transform(Buffer.from(text.slice(0, 20))).toString(), text.slice(0, 20));
  assert.deepEqual(seen, []);
  list.transform(Buffer.from(text.slice(20, cut)));
  assert.deepEqual(seen, [['msg_1', 'msg_2']]);
  const one: string[][] = [];
  new ItemIdsReader('id', (ids) => one.push(ids)).transform(Buffer.from('{"id":"msg_9","type":"message"}'));
  assert.deepEqual(one, [['msg_9']]);
  const out: string[][] = [];
  const r = new ResponsesJsonReader(() => {}, null, (ids) => out.push(ids));
  r.transform(Buffer.from('{"id":"resp_1","output":[{"id":"msg_o","type":"message"}],'));
  assert.deepEqual(out, [['msg_o']]);
  const sse: string[][] = [];
  const s = new ResponsesSseReader(() => {}, null, (ids) => sse.push(ids));
  const final = { type: 'response.completed', response: { id: 'resp_1', output: [{ id: 'rs_1', type: 'reasoning' }, { id: 'msg_2', type: 'message' }], usage: { input_tokens: 1, output_tokens: 1, total_tokens: 2 } } };
  s.transform(Buffer.from(`event: response.completed\ndata: ${JSON.stringify(final)}\n\n`));
  assert.deepEqual(sse, [['rs_1', 'msg_2']]);
});

test('placed owner records: a project not held is asked for once; its waiters go on when it arrives, or after their wait', async () => {
  const owners = new ResponseOwners({ placed: true });
  const asked: string[] = [];
  owners.onNeed = (p) => asked.push(p);
  assert.equal(owners.holdsAllOf('proj_a'), false);
  const got: Array<[string, boolean]> = [];
  owners.whenHeld({ projectId: 'proj_a', orgId: 'org_1' }, 10_000, (held) => got.push(['a1', held]));
  owners.whenHeld({ projectId: 'proj_a', orgId: 'org_1' }, 10_000, (held) => got.push(['a2', held]));
  assert.deepEqual(asked, ['proj_a'], 'asked once');
  assert.deepEqual(owners.askedProjects(), ['proj_a']);
  owners.caughtUp(['proj_a']);
  assert.deepEqual(got, [['a1', true], ['a2', true]]);
  assert.equal(owners.holdsAllOf('proj_a'), true);
  assert.deepEqual([owners.heldProjects(), owners.askedProjects()], [['proj_a'], []]);
  // Held: at once, nothing asked.
  owners.whenHeld({ projectId: 'proj_a', orgId: 'org_1' }, 10_000, (held) => got.push(['a3', held]));
  assert.deepEqual(got.at(-1), ['a3', true]);
  // Never sent: the wait ends unheld (its timer does not hold the process open: this one does, meanwhile).
  const keepAlive = setTimeout(() => {}, 10_000);
  const late = await new Promise<boolean>((resolve) => owners.whenHeld({ projectId: 'proj_b', orgId: 'org_1' }, 5, resolve));
  clearTimeout(keepAlive);
  assert.equal(late, false);
  assert.deepEqual(asked, ['proj_a', 'proj_b']);
  // Unplaced (every project's records sent): always held.
  assert.equal(new ResponseOwners().holdsAllOf('proj_x'), true);
});

test('an id deleted through this node is not taken back when its project records are sent again', () => {
  const owners = new ResponseOwners();
  const rec = { projectId: 'proj_a', model: 'chat', createdAtMs: 1 };
  owners.add('conv_1', rec);
  owners.forget('conv_1');
  owners.add('conv_1', rec);
  assert.equal(owners.get('conv_1', 2), undefined);
});
