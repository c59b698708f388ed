// The packed key table (data-plane/state/packed-keys.ts behind GatewayState) against a plain Map model:
// random snapshots, then random upserts (new keys, changed fields, a key id moving to a new hash),
// revocations, tombstones and lookups, with growth and index deletions along the way.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { hashKey } from '../../proto/lib/keys.js';
import { ControlMessage, type KeyEntry, type KeyTombstone } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayState, StateHolder } from '../../data-plane/state/key-table.js';
import { decodeControlMessage } from '../../data-plane/state/snapshot-decoder.js';

const pepper = Buffer.alloc(32, 3);
const VALUES = Array.from({ length: 48 }, (_, i) => `sk-tollgate-prop${i}`);
const HASHES = VALUES.map((v) => hashKey(pepper, v));
const MODELS = ['chat', 'embed', 'pro'];

interface Live {
  keyId: string;
  projectId: string;
  orgId: string;
  allowedModels: string[];
  rpmLimit: number;
  tpmLimit: number;
  maxParallelRequests: number;
  expiresAtMs: number;
}
interface Names {
  keyId: string;
  projectId: string;
  orgId: string;
}

/** The behaviour the packed table must keep, written the obvious way. */
class Model {
  live = new Map<string, Live>();
  revoked = new Map<string, Names>();
  byKeyId = new Map<string, string>();

  upsert(k: KeyEntry): void {
    const old = this.byKeyId.get(k.keyId);
    if (old !== undefined && old !== k.keyHash) this.live.delete(old);
    const other = this.live.get(k.keyHash);
    if (other && other.keyId !== k.keyId) this.byKeyId.delete(other.keyId);
    this.revoked.delete(k.keyHash);
    this.live.set(k.keyHash, { keyId: k.keyId, projectId: k.projectId, orgId: k.orgId, allowedModels: k.allowedModels, rpmLimit: k.rpmLimit, tpmLimit: k.tpmLimit, maxParallelRequests: k.maxParallelRequests, expiresAtMs: k.expiresAtMs ?? 0 });
    this.byKeyId.set(k.keyId, k.keyHash);
  }

  remove(hash: string): void {
    const rec = this.live.get(hash);
    if (!rec) return;
    this.live.delete(hash);
    this.revoked.set(hash, { keyId: rec.keyId, projectId: rec.projectId, orgId: rec.orgId });
    if (this.byKeyId.get(rec.keyId) === hash) this.byKeyId.delete(rec.keyId);
  }

  tombstone(t: KeyTombstone): void {
    if (!this.live.has(t.keyHash)) this.revoked.set(t.keyHash, { keyId: t.keyId, projectId: t.projectId, orgId: t.orgId });
  }
}

const keyArb = fc.record({
  v: fc.nat(VALUES.length - 1),
  id: fc.nat(30),
  project: fc.constantFrom('proj_a', 'proj_b', 'proj_ç'),
  org: fc.constantFrom('org_1', 'org_2', 'org_3'),
  models: fc.subarray(MODELS),
  rpm: fc.constantFrom(20, 300, 1_000_000_000_000),
  tpm: fc.constantFrom(0, 60_000),
  parallel: fc.constantFrom(1, 100),
  expires: fc.constantFrom(0, 500, 2_000),
});
type KeyGen = typeof keyArb extends fc.Arbitrary<infer T> ? T : never;

function entry(g: KeyGen): KeyEntry {
  return {
    keyId: `key_${'x'.repeat(g.id % 7)}${g.id}`,
    keyHash: HASHES[g.v],
    projectId: g.project,
    orgId: g.org,
    allowedModels: g.models,
    rpmLimit: g.rpm,
    tpmLimit: g.tpm,
    maxParallelRequests: g.parallel,
    expiresAtMs: g.expires,
  };
}

const opArb = fc.oneof(
  { weight: 5, arbitrary: keyArb.map((k) => ({ kind: 'upsert' as const, k })) },
  { weight: 2, arbitrary: fc.nat(VALUES.length - 1).map((v) => ({ kind: 'remove' as const, v })) },
  { weight: 1, arbitrary: keyArb.map((k) => ({ kind: 'tombstone' as const, k })) },
  { weight: 2, arbitrary: fc.nat(VALUES.length - 1).map((v) => ({ kind: 'lookup' as const, v })) },
);

function check(st: GatewayState, m: Model, now: number): void {
  assert.equal(st.keysByHash.size, m.live.size);
  assert.deepEqual(new Set(st.keysByHash.keys()), new Set(m.live.keys()));
  for (let i = 0; i < VALUES.length; i++) {
    const hash = HASHES[i];
    const want = m.live.get(hash);
    const got = st.lookup(pepper, VALUES[i], now);
    const expired = want !== undefined && want.expiresAtMs > 0 && now >= want.expiresAtMs;
    if (!want || expired) assert.equal(got, undefined, `${VALUES[i]} must not authenticate`);
    else {
      assert.ok(got, `${VALUES[i]} must authenticate`);
      assert.equal(got.keyId, want.keyId);
      assert.equal(got.keyHash, hash);
      assert.equal(got.projectId, want.projectId);
      assert.equal(got.orgId, want.orgId);
      assert.equal(got.org, st.orgs.get(want.orgId), 'the shared org object');
      assert.deepEqual([...got.allowedModels].sort(), [...want.allowedModels].sort());
      assert.deepEqual(got.limits, { keyId: want.keyId, rpmLimit: want.rpmLimit, tpmLimit: want.tpmLimit, maxParallel: want.maxParallelRequests });
      assert.equal(got.expiresAtMs, want.expiresAtMs);
    }
    assert.equal(st.keysByHash.has(hash), want !== undefined);
    assert.equal(st.keysByHash.get(hash)?.keyId, want?.keyId);
    const names = st.tombstone(pepper, VALUES[i]);
    const wantNames = want ? { keyId: want.keyId, projectId: want.projectId, orgId: want.orgId } : m.revoked.get(hash);
    assert.deepEqual(names, wantNames);
  }
}

test('the packed key table behaves as a Map of keys with tombstones, under any sequence of changes', () => {
  fc.assert(
    fc.property(fc.array(keyArb, { maxLength: 40 }), fc.array(keyArb, { maxLength: 5 }), fc.array(opArb, { maxLength: 80 }), fc.constantFrom(0, 1_000, 5_000), (initial, stones, ops, now) => {
      const m = new Model();
      const keys = initial.map(entry);
      for (const k of keys) m.upsert(k);
      const tombstones = stones.map((g) => ({ keyHash: HASHES[g.v], keyId: `key_t${g.id}`, projectId: g.project, orgId: g.org }));
      for (const t of tombstones) m.tombstone(t);
      const st = GatewayState.fromSnapshot({ version: 1, config: undefined, keys, orgs: [{ orgId: 'org_1', tier: 'free', blocked: false, blockedReason: '', ownerAccountId: '' }], tombstones } as never);
      check(st, m, now);
      for (const op of ops) {
        if (op.kind === 'upsert') {
          const k = entry(op.k);
          m.upsert(k);
          st.upsertKey(k);
        } else if (op.kind === 'remove') {
          m.remove(HASHES[op.v]);
          st.removeKey(HASHES[op.v]);
        } else if (op.kind === 'tombstone') {
          const t = { keyHash: HASHES[op.k.v], keyId: `key_t${op.k.id}`, projectId: op.k.project, orgId: op.k.org };
          m.tombstone(t);
          st.addTombstone(t);
        } else {
          // A lookup materializes and caches a record: later changes must not leave it stale.
          st.lookup(pepper, VALUES[op.v], now);
        }
      }
      check(st, m, now);
    }),
    { numRuns: 300 },
  );
});

test('an org upsert reaches a key already looked up at once (one shared object)', () => {
  const st = GatewayState.fromSnapshot({ version: 1, config: undefined, keys: [entry({ v: 0, id: 1, project: 'proj_a', org: 'org_9', models: [], rpm: 20, tpm: 0, parallel: 1, expires: 0 })], orgs: [], tombstones: [] } as never);
  const rec = st.lookup(pepper, VALUES[0]);
  assert.equal(rec?.org.tier, '');
  st.upsertOrg({ orgId: 'org_9', tier: 'paid', blocked: true, blockedReason: 'cap', ownerAccountId: '' } as never);
  assert.equal(rec?.org.blocked, true);
  assert.equal(st.lookup(pepper, VALUES[0])?.org.tier, 'paid');
});

test('a hash that is not 64 hex digits is still stored and found as given', () => {
  const st = new GatewayState();
  st.upsertKey({ ...entry({ v: 0, id: 1, project: 'proj_a', org: 'org_1', models: [], rpm: 20, tpm: 0, parallel: 1, expires: 0 }), keyHash: 'hash-k1' });
  assert.equal(st.keysByHash.get('hash-k1')?.keyHash, 'hash-k1');
  assert.equal(st.keysByHash.has('hash-k2'), false);
  st.removeKey('hash-k1');
  assert.equal(st.keysByHash.has('hash-k1'), false);
});

test('a snapshot decoded off the wire builds the same state as the decoded message would, without a key array', () => {
  const keys = VALUES.slice(0, 30).map((_, i) => entry({ v: i, id: i, project: 'proj_a', org: i % 2 ? 'org_1' : 'org_2', models: i % 3 ? [] : ['chat'], rpm: 20, tpm: 60_000, parallel: 100, expires: i === 4 ? 500 : 0 }));
  const tombstones = [{ keyHash: HASHES[40], keyId: 'key_gone', projectId: 'proj_a', orgId: 'org_1' }, { keyHash: HASHES[0], keyId: 'key_stale', projectId: 'proj_x', orgId: 'org_1' }];
  const orgs = [{ orgId: 'org_1', tier: 'free', blocked: true, blockedReason: 'cap', ownerAccountId: 'acct_1' }];
  const snap = { version: 42, config: undefined, keys, orgs, tombstones } as never;
  const bytes = ControlMessage.encode(ControlMessage.fromPartial({ snapshot: snap })).finish();
  const msg = decodeControlMessage(bytes);
  assert.equal(msg.snapshot?.version, 42);
  assert.equal(msg.snapshot?.keys.length, 0, 'the keys went straight into the table');
  assert.deepEqual(msg.snapshot?.orgs.map((o) => o.orgId), ['org_1']);
  const holder = new StateHolder();
  holder.applySnapshot(msg.snapshot!);
  const m = new Model();
  for (const k of keys) m.upsert(k);
  for (const t of tombstones) m.tombstone(t);
  const st = holder.current;
  assert.equal(st.version, 42);
  assert.equal(st.lookup(pepper, VALUES[1])?.org.blocked, true);
  check(st, m, 1_000);
  // Any other message decodes as before.
  const ack = ControlMessage.encode(ControlMessage.fromPartial({ reportAck: { seq: 7, instanceId: 'i' } })).finish();
  assert.equal(decodeControlMessage(ack).reportAck?.seq, 7);
});
