// The node's in-memory state: snapshots swap, deltas apply only in order, revocation removes the hash,
// scope is the plan ∩ allowed_models.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { hashKey } from '../../proto/lib/keys.js';
import type { GatewayConfig, KeyEntry, Snapshot } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayState, StateHolder } from '../../data-plane/state/key-table.js';

const pepper = Buffer.alloc(32, 7);
const config: GatewayConfig = {
  serviceName: 'tollgate',
  tiers: [
    { name: 'free', rpm: 20, tpm: 60000, maxParallelRequests: 100, freeGrantMicros: 5, allowedModels: ['chat', 'embed'] },
    { name: 'paid', rpm: 300, tpm: 1e6, maxParallelRequests: 100, freeGrantMicros: 0, allowedModels: ['chat', 'embed', 'pro'] },
  ],
  models: ['chat', 'embed', 'pro'].map((id) => ({
    id,
    provider: 'demo',
    upstreamModel: '',
    baseUrl: '',
    upstreamApiKey: '',
    kind: id === 'embed' ? 'embeddings' : 'chat',
    inputMicrosPerMtok: 1,
    outputMicrosPerMtok: 1,
    audioMicrosPerUnit: 0,
    timeoutMs: 0,
    voices: [],
  deployments: [],
  maxAttempts: 0,
  failoverTimeoutMs: 0,
  circuitFailures: 0,
  circuitCooldownMs: 0,
  })),
  toolBackends: [],
  realtimeUpstreams: [],
  trustedProxies: [],
  maxStalenessMs: 0,
};

function keyEntry(id: string, value: string, allowed: string[] = [], org = 'org_1'): KeyEntry {
  return { keyId: id, keyHash: hashKey(pepper, value), projectId: 'proj_1', orgId: org, allowedModels: allowed, rpmLimit: 20, tpmLimit: 60000, maxParallelRequests: 100 };
}

function snapshot(version: number, keys: KeyEntry[]): Snapshot {
  return { version, config, keys, orgs: [{ orgId: 'org_1', tier: 'free', blocked: false, blockedReason: '', fundsVersion: 0 } as never], tombstones: [] };
}

test('lookup finds a key by its peppered hash only', () => {
  const st = GatewayState.fromSnapshot(snapshot(3, [keyEntry('key_a', 'sk-a')]));
  assert.equal(st.lookup(pepper, 'sk-a')?.keyId, 'key_a');
  assert.equal(st.lookup(pepper, 'sk-b'), undefined);
  assert.equal(st.lookup(Buffer.alloc(32, 8), 'sk-a'), undefined);
});

test('deltas apply only on top of the version they were made from', () => {
  const st = GatewayState.fromSnapshot(snapshot(3, [keyEntry('key_a', 'sk-a')]));
  assert.equal(st.applyDelta({ fromVersion: 4, toVersion: 5, changes: [{ keyRemoved: hashKey(pepper, 'sk-a') }] }), 'gap');
  assert.equal(st.version, 3);
  assert.ok(st.lookup(pepper, 'sk-a'));
  assert.equal(st.applyDelta({ fromVersion: 2, toVersion: 3, changes: [] }), 'stale');
  assert.equal(st.applyDelta({ fromVersion: 3, toVersion: 4, changes: [{ keyUpsert: keyEntry('key_b', 'sk-b') }] }), 'applied');
  assert.equal(st.applyDelta({ fromVersion: 4, toVersion: 5, changes: [{ keyRemoved: hashKey(pepper, 'sk-a') }] }), 'applied');
  assert.equal(st.version, 5);
  assert.equal(st.lookup(pepper, 'sk-a'), undefined);
  assert.equal(st.lookup(pepper, 'sk-b')?.keyId, 'key_b');
});

test('an organisation upsert reaches its keys at once', () => {
  const st = GatewayState.fromSnapshot(snapshot(1, [keyEntry('key_a', 'sk-a')]));
  const rec = st.lookup(pepper, 'sk-a')!;
  assert.equal(rec.org.blocked, false);
  st.applyDelta({ fromVersion: 1, toVersion: 2, changes: [{ orgUpsert: { orgId: 'org_1', tier: 'free', blocked: true, blockedReason: 'balance_exhausted' } as never }] });
  assert.equal(st.lookup(pepper, 'sk-a')!.org.blocked, true);
});

test('scope: the plan is a ceiling; allowed_models narrows it', () => {
  const st = GatewayState.fromSnapshot(snapshot(1, [keyEntry('key_all', 'sk-all'), keyEntry('key_embed', 'sk-e', ['embed']), keyEntry('key_pro', 'sk-p', ['pro'])]));
  const all = st.lookup(pepper, 'sk-all')!;
  const embed = st.lookup(pepper, 'sk-e')!;
  const pro = st.lookup(pepper, 'sk-p')!;
  assert.deepEqual(st.modelsFor(all).map((m) => m.id), ['chat', 'embed']);
  assert.deepEqual(st.modelsFor(embed).map((m) => m.id), ['embed']);
  assert.equal(st.mayUseModel(pro, 'pro'), false);
  assert.deepEqual(st.modelsFor(pro), []);
  // Tier change of the organisation widens the plan.
  st.applyDelta({ fromVersion: 1, toVersion: 2, changes: [{ orgUpsert: { orgId: 'org_1', tier: 'paid', blocked: false, blockedReason: '' } as never }] });
  assert.equal(st.mayUseModel(pro, 'pro'), true);
});

test('a snapshot swaps the whole state', () => {
  const h = new StateHolder();
  assert.equal(h.ready, false);
  h.applySnapshot(snapshot(1, [keyEntry('key_a', 'sk-a')]));
  const first = h.current;
  h.applySnapshot(snapshot(9, [keyEntry('key_b', 'sk-b')]));
  assert.notEqual(h.current, first);
  assert.equal(h.current.version, 9);
  assert.equal(h.current.lookup(pepper, 'sk-a'), undefined);
  assert.ok(first.lookup(pepper, 'sk-a'));
});
