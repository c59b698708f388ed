// An attacker's review of namedIdRefusal (owned-ids.ts, issue 34): shapes of a request that named an
// upstream object without being checked.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { hashKey } from '../../proto/lib/keys.js';
import type { GatewayConfig, KeyEntry } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { ResponseOwners } from '../../data-plane/state/response-owners.js';
import { namedIdRefusal } from '../../data-plane/endpoints/responses/owned-ids.js';

const pepper = Buffer.alloc(32, 9);
const config: GatewayConfig = {
  serviceName: 'tollgate',
  tiers: [{ name: 'free', rpm: 20, tpm: 60000, maxParallelRequests: 100, freeGrantMicros: 5, allowedModels: ['chat'] }],
  models: [{ id: 'chat', provider: 'demo', upstreamModel: '', baseUrl: '', upstreamApiKey: '', kind: 'chat', inputMicrosPerMtok: 1, outputMicrosPerMtok: 1, audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments: [], maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0 }],
  toolBackends: [],
  realtimeUpstreams: [],
  trustedProxies: [],
  maxStalenessMs: 0,
  responses: { ownerRecordsPerProject: 0, ownerRecordsPerOrg: 0, conversationsModel: '', prompts: [{ tier: 'free', promptIds: ['pmpt_ok'] }], vectorStores: [] },
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

test("an item without content is read as a reference whatever else it carries: another project's id is 404", () => {
  // Before: an item with no type and no content was checked only when it had no `role` either, so
  // `{id, role: null}` (or any role) named a stored item unchecked; the upstream's item_reference has
  // an optional, nullable type and a message cannot be one without its content.
  const o = new ResponseOwners();
  o.add('msg_a', { projectId: 'proj_a', model: 'chat', createdAtMs: 1 });
  for (const item of [{ id: 'msg_a', role: null }, { id: 'msg_a', role: 'user' }, { id: 'msg_a', type: null, content: null }]) {
    const err = namedIdRefusal({ input: [item] }, keyB, state, o, 2);
    assert.deepEqual([err?.code, err?.param], ['NOT_FOUND', 'input[0].id'], JSON.stringify(item));
    assert.equal(namedIdRefusal({ input: [item] }, keyA, state, o, 2), null, `A's own: ${JSON.stringify(item)}`);
  }
  // A message sent by its content is not a reference.
  assert.equal(namedIdRefusal({ input: [{ id: 'msg_x', role: 'user', content: 'hi' }] }, keyB, state, o, 2), null);
});

test('a file named anywhere in an input item or a prompt variable is 404 naming where', () => {
  // Before: only a message's content parts were searched for a file_id.
  const o = new ResponseOwners();
  const cases: Array<[Record<string, unknown>, string]> = [
    [{ input: [{ type: 'function_call_output', call_id: 'c', output: [{ type: 'input_file', file_id: 'file-1' }] }] }, 'input[0].output[0].file_id'],
    [{ input: [{ type: 'computer_call_output', call_id: 'c', output: { type: 'computer_screenshot', file_id: 'file-2' } }] }, 'input[0].output.file_id'],
    [{ input: 'x', prompt: { id: 'pmpt_ok', variables: { a: 'text', doc: { type: 'input_file', file_id: 'file-3' } } } }, 'prompt.variables.doc.file_id'],
    [{ items: [{ type: 'message', role: 'user', content: [{ type: 'input_image', file_id: 'file-4' }] }] }, 'items[0].content[0].file_id'],
  ];
  for (const [body, param] of cases) {
    const err = namedIdRefusal(body, keyA, state, o, 2, 'items' in body ? 'items' : 'input');
    assert.deepEqual([err?.code, err?.param], ['NOT_FOUND', param], JSON.stringify(body));
  }
  // An image by URL and a prompt's text variables name nothing.
  assert.equal(namedIdRefusal({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }], prompt: { id: 'pmpt_ok', variables: { a: 'b' } } }, keyA, state, o, 2), null);
});
