import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SnapshotStore } from '../../control-plane/state/snapshot-store.js';
import { GatewayConfig, type Delta, type KeyEntry } from '../../proto/gen/tollgate/v1/sync.js';

const config = (serviceName: string): GatewayConfig => GatewayConfig.fromPartial({ serviceName });
const key = (id: string): KeyEntry => ({
  keyId: id,
  keyHash: `hash-${id}`,
  projectId: 'p',
  orgId: 'o',
  allowedModels: [],
  rpmLimit: 20,
  tpmLimit: 60000,
  maxParallelRequests: 100,
});

function storeAt(version: number, maxRetained = 100): SnapshotStore {
  const s = new SnapshotStore({ version: 0, config: config('tollgate'), keys: [], orgs: [], maxRetained });
  for (let v = 1; v <= version; v++) s.apply(v, { keyUpsert: key(`k${v}`) });
  return s;
}

test('apply moves the version and the state; a delta is published per change', () => {
  const s = storeAt(0);
  const seen: Delta[] = [];
  const off = s.subscribe((d) => seen.push(d));
  s.apply(1, { keyUpsert: key('a') });
  s.apply(2, { orgUpsert: { orgId: 'o', tier: 'free', blocked: true, blockedReason: 'balance_exhausted', fundsVersion: 0, ownerAccountId: '' } });
  s.apply(3, { keyRemoved: 'hash-a' });
  s.apply(4, { config: config('other') });
  off();
  s.apply(5, { keyUpsert: key('b') });
  assert.equal(s.version, 5);
  assert.deepEqual(
    seen.map((d) => [d.fromVersion, d.toVersion]),
    [[0, 1], [1, 2], [2, 3], [3, 4]],
  );
  const snap = s.snapshot();
  assert.equal(snap.version, 5);
  assert.deepEqual(snap.keys.map((k) => k.keyId), ['b']);
  assert.equal(snap.orgs[0].blockedReason, 'balance_exhausted');
  assert.equal(snap.config?.serviceName, 'other');
});

test('a change that does not follow the current version is refused', () => {
  const s = storeAt(3);
  assert.throws(() => s.apply(5, { keyRemoved: 'x' }), /does not follow 3/);
  assert.throws(() => s.apply(3, { keyRemoved: 'x' }), /does not follow 3/);
  assert.equal(s.version, 3);
});

test('catch-up: nothing, one delta, or a snapshot', () => {
  const s = storeAt(10, 5); // retains versions 6..10
  const cases: [number, string, number[]?][] = [
    [10, 'none'],
    [9, 'delta', [10]],
    [5, 'delta', [6, 7, 8, 9, 10]],
    [4, 'snapshot'], // version 5 no longer retained: a gap
    [0, 'snapshot'], // holds nothing
    [11, 'snapshot'], // from a future it cannot know
    [-1, 'snapshot'],
  ];
  for (const [have, kind, versions] of cases) {
    const r = s.catchUp(have);
    assert.equal(r.kind, kind, `have ${have}`);
    if (r.kind === 'delta') {
      assert.equal(r.delta.fromVersion, have);
      assert.equal(r.delta.toVersion, 10);
      assert.deepEqual(r.delta.changes.map((c) => c.keyUpsert?.keyId), versions!.map((v) => `k${v}`));
    }
    if (r.kind === 'snapshot') assert.equal(r.snapshot.version, 10);
  }
});

test('changesSince is null for unknown or unretained versions', () => {
  const s = storeAt(4, 2);
  assert.deepEqual(s.changesSince(4), []);
  assert.equal(s.changesSince(3)?.length, 1);
  assert.equal(s.changesSince(2)?.length, 2);
  assert.equal(s.changesSince(1), null);
  assert.equal(s.changesSince(5), null);
});

test('a store built from the database keeps deltas for retained versions', () => {
  const s = new SnapshotStore({
    version: 7,
    config: config('tollgate'),
    keys: [key('x')],
    orgs: [],
    changes: [
      { version: 6, change: { keyUpsert: key('x') } },
      { version: 7, change: { keyRemoved: 'hash-y' } },
    ],
  });
  assert.equal(s.catchUp(5).kind, 'delta');
  assert.equal(s.catchUp(4).kind, 'snapshot');
  assert.throws(
    () => new SnapshotStore({ version: 8, config: config('t'), keys: [], orgs: [], changes: [{ version: 6, change: {} }] }),
    /end at the current version/,
  );
});

test('a new store at version 0 answers a node holding nothing with a snapshot', () => {
  assert.equal(storeAt(0).catchUp(0).kind, 'snapshot');
});
