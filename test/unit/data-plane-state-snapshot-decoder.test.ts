// A snapshot in parts (proto/lib/snapshot-parts.ts → data-plane/state/snapshot-decoder.ts,
// docs/design.md#snapshots-in-parts): the control plane splits, the node's stream decoder builds one state from
// the parts, and the state is the one the whole snapshot gives, whatever the part size.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { hashKey } from '../../proto/lib/keys.js';
import { ControlMessage, type KeyEntry, type Snapshot } from '../../proto/gen/tollgate/v1/sync.js';
import { splitSnapshot } from '../../proto/lib/snapshot-parts.js';
import { GatewayState, StateHolder } from '../../data-plane/state/key-table.js';
import { SnapshotDecoder } from '../../data-plane/state/snapshot-decoder.js';

const pepper = Buffer.alloc(32, 5);
const VALUES = Array.from({ length: 40 }, (_, i) => `sk-tollgate-part${i}`);

function key(i: number): KeyEntry {
  return { keyId: `key_${i}`, keyHash: hashKey(pepper, VALUES[i]), projectId: `proj_${i % 3}`, orgId: `org_${i % 2}`, allowedModels: [], rpmLimit: 20 + i, tpmLimit: 60_000, maxParallelRequests: 10, expiresAtMs: 0 };
}

/** 30 keys, 4 tombstones (one naming a live key's hash: it must not hide it), 2 organisations, a capped project. */
function snapshot(): Snapshot {
  return {
    version: 77,
    config: undefined,
    keys: Array.from({ length: 30 }, (_, i) => key(i)),
    orgs: [
      { orgId: 'org_0', tier: 'free', blocked: false, blockedReason: '', ownerAccountId: 'acct_0' },
      { orgId: 'org_1', tier: 'paid', blocked: true, blockedReason: 'cap', ownerAccountId: 'acct_1' },
    ],
    tombstones: [30, 31, 32, 3].map((i) => ({ keyHash: hashKey(pepper, VALUES[i]), keyId: `key_gone${i}`, projectId: 'proj_0', orgId: 'org_0' })),
    projectCaps: { projects: [{ projectId: 'proj_1', capMicros: 5_000_000 }] },
  } as Snapshot;
}

const encode = (s: Snapshot) => ControlMessage.encode(ControlMessage.fromPartial({ snapshot: s })).finish();

/** What a node sees of a state: every value's key (or tombstone), its organisation and limits. */
function view(st: GatewayState) {
  return VALUES.map((v) => {
    const k = st.lookup(pepper, v);
    return k ? { keyId: k.keyId, org: k.orgId, blocked: k.org.blocked, rpm: k.limits.rpmLimit, cap: k.project?.capMicros ?? 0 } : { tombstone: st.tombstone(pepper, v)?.keyId ?? null };
  });
}

test('splitSnapshot: small snapshots go whole; large ones in parts that carry everything once, keys before tombstones', () => {
  const s = snapshot();
  assert.deepEqual(splitSnapshot(s, 34), [s], 'all 34 entries fit in one message');
  const parts = splitSnapshot(s, 8);
  assert.equal(parts.length, 5);
  assert.deepEqual(parts.map((p) => p.part), [0, 1, 2, 3, 4].map((index) => ({ index, count: 5, entries: index === 0 ? 34 : 0 })));
  assert.deepEqual(parts.flatMap((p) => p.keys), s.keys);
  assert.deepEqual(parts.flatMap((p) => p.tombstones), s.tombstones);
  assert.deepEqual(parts.map((p) => p.keys.length + p.tombstones.length), [8, 8, 8, 8, 2]);
  assert.deepEqual(parts.map((p) => p.orgs.length), [2, 0, 0, 0, 0], 'organisations and caps in the first part only');
  assert.equal(parts[3].keys.length, 6, 'the part where keys end holds the first tombstones too');
  assert.ok(parts.every((p) => p.version === 77));
  // Every part is far smaller than the whole.
  assert.ok(Math.max(...parts.map((p) => encode(p).length)) < encode(s).length / 3);
});

test('the decoder builds from the parts the state the whole snapshot gives, for any part size (property)', () => {
  const whole = new SnapshotDecoder().decode(encode(snapshot()));
  const expected = new StateHolder();
  expected.applySnapshot(whole.snapshot!);
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 40 }), (size) => {
      const decoder = new SnapshotDecoder();
      const messages = splitSnapshot(snapshot(), size).map((p) => decoder.decode(encode(p)));
      // Every part but the last decodes to nothing to apply.
      for (const m of messages.slice(0, -1)) assert.equal(m.snapshot, undefined);
      const last = messages.at(-1)!.snapshot!;
      assert.equal(last.version, 77);
      assert.deepEqual(last.orgs.map((o) => o.orgId), ['org_0', 'org_1']);
      assert.deepEqual(last.projectCaps?.projects, [{ projectId: 'proj_1', capMicros: 5_000_000 }]);
      const holder = new StateHolder();
      holder.applySnapshot(last);
      assert.equal(holder.current.version, 77);
      assert.deepEqual(view(holder.current), view(expected.current));
    }),
    { seed: 19, numRuns: 40 },
  );
  // The whole snapshot's view, spelled out once: a tombstone never hides a live key.
  assert.equal(view(expected.current)[3].keyId, 'key_3');
  assert.deepEqual(view(expected.current)[30], { tombstone: 'key_gone30' });
});

test('a part out of order fails the stream; a first part starts afresh; other messages decode as before', () => {
  const parts = splitSnapshot(snapshot(), 10).map(encode);
  const decoder = new SnapshotDecoder();
  decoder.decode(parts[0]);
  assert.throws(() => decoder.decode(parts[2]), /snapshot part 2 of 4 came out of order/);
  assert.throws(() => new SnapshotDecoder().decode(parts[1]), /snapshot part 1 of 4 came out of order/);
  // A broken stream's parts are dropped: a new first part starts a new snapshot.
  const again = new SnapshotDecoder();
  again.decode(parts[0]);
  again.decode(parts[1]);
  again.decode(parts[0]);
  for (const p of parts.slice(1, -1)) again.decode(p);
  const last = again.decode(parts.at(-1)!).snapshot!;
  const holder = new StateHolder();
  holder.applySnapshot(last);
  assert.equal(holder.current.lookup(pepper, VALUES[29])?.keyId, 'key_29');
  const ack = ControlMessage.encode(ControlMessage.fromPartial({ reportAck: { seq: 7, instanceId: 'i' } })).finish();
  assert.equal(again.decode(ack).reportAck?.seq, 7);
});
