// Affinity (issue 36): a request of a pooled model naming a stored object goes to the deployment that
// holds it (affinity.ts), as a table over what a body names and what the owner records say.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ModelConfig, ModelDeployment } from '../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState } from '../../data-plane/state/key-table.js';
import { ResponseOwners } from '../../data-plane/state/response-owners.js';
import { pinOf } from '../../data-plane/endpoints/responses/affinity.js';
import { GatewayError } from '../../data-plane/errors.js';

const dep = (id: string, baseUrl: string, key = 'k'): ModelDeployment => ({ id, baseUrl, upstreamApiKey: key, upstreamModel: '', weight: 1, rpm: 0, tpm: 0, maxParallelRequests: 0, state: '' });
const model = (id: string, deployments: ModelDeployment[], baseUrl = ''): ModelConfig =>
  ({ id, provider: 'openai', kind: 'chat', baseUrl, upstreamApiKey: 'k', upstreamModel: '', deployments }) as unknown as ModelConfig;

const pool = model('pool', [dep('a', 'http://a/v1'), dep('b', 'http://b/v1')]);
// Another pooled model with a deployment on account b (same URL and key) and one elsewhere.
const other = model('other', [dep('c', 'http://c/v1'), dep('b2', 'http://b/v1')]);
const single = model('single', [], 'http://s/v1');
const state = { view: { models: new Map([pool, other, single].map((m) => [m.id, m])) } } as unknown as GatewayState;

const owners = new ResponseOwners();
const at = 1_000;
owners.add('resp_a', { projectId: 'p', model: 'pool', createdAtMs: at, deployment: 'a' });
owners.add('resp_b', { projectId: 'p', model: 'pool', createdAtMs: at, deployment: 'b' });
owners.add('conv_b', { projectId: 'p', model: 'pool', createdAtMs: at, deployment: 'b' });
owners.add('msg_b', { projectId: 'p', model: 'pool', createdAtMs: at, deployment: 'b' });
owners.add('resp_old', { projectId: 'p', model: 'pool', createdAtMs: at });
owners.add('resp_other_b', { projectId: 'p', model: 'other', createdAtMs: at, deployment: 'b2' });
owners.add('resp_other_c', { projectId: 'p', model: 'other', createdAtMs: at, deployment: 'c' });
owners.add('resp_single', { projectId: 'p', model: 'single', createdAtMs: at });

const pin = (m: ModelConfig, body: Record<string, unknown> | null, items: 'input' | 'items' = 'input', pathId = '') => {
  const r = pinOf(m, body, state, owners, at + 1, items, pathId);
  return r instanceof GatewayError ? `${r.code}:${r.param ?? ''}` : r;
};

test('a request naming a stored object goes to the deployment that holds it; naming none, to any', () => {
  const cases: Array<[string, ModelConfig, Record<string, unknown> | null, 'input' | 'items', string, string | undefined]> = [
    ['names nothing stored', pool, { input: 'hi' }, 'input', '', undefined],
    ['previous_response_id on a', pool, { previous_response_id: 'resp_a' }, 'input', '', 'a'],
    ['conversation on b, as {id}', pool, { conversation: { id: 'conv_b' } }, 'input', '', 'b'],
    ['an item_reference on b', pool, { input: [{ type: 'item_reference', id: 'msg_b' }] }, 'input', '', 'b'],
    ['a conversation path on b (its items stand in `items`)', pool, { items: [{ id: 'msg_b' }] }, 'items', 'conv_b', 'b'],
    ['recorded before pools kept the deployment: the first', pool, { previous_response_id: 'resp_old' }, 'input', '', 'a'],
    ['made with another model, on the same account: this model\'s deployment there', pool, { previous_response_id: 'resp_other_b' }, 'input', '', 'b'],
    ['a model with one upstream is never pinned', single, { previous_response_id: 'resp_single' }, 'input', '', undefined],
    ['an id nobody recorded pins nothing (owned-ids.ts refuses it)', pool, { previous_response_id: 'resp_none' }, 'input', '', undefined],
  ];
  for (const [what, m, body, items, pathId, want] of cases) assert.equal(pin(m, body, items, pathId), want, what);
});

test('objects no one deployment of the model holds are refused 400, naming the field', () => {
  assert.equal(pin(pool, { previous_response_id: 'resp_a', conversation: 'conv_b' }), 'INVALID_REQUEST:conversation');
  assert.equal(pin(pool, { previous_response_id: 'resp_a', input: [{ type: 'item_reference', id: 'msg_b' }] }), 'INVALID_REQUEST:input[0].id');
  assert.equal(pin(pool, { previous_response_id: 'resp_other_c' }), 'INVALID_REQUEST:previous_response_id');
});
