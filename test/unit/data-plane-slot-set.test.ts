// SlotSet (data-plane/slot-set.ts): the sets of things in flight per request. Its semantics against a
// Set, and the reason it exists: under per-request churn, what left the node's registries must not be
// kept alive into the old generation (a long-lived `Set` rehashed under churn kept every member of
// each replaced table until the next full collection: 1.4 MB survived each young collection on the
// JSON chat path, and the node's CPU per request rose by half).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setFlagsFromString, getHeapSpaceStatistics } from 'node:v8';
import { runInNewContext } from 'node:vm';
import fc from 'fast-check';
import { SlotSet, type Slotted } from '../../data-plane/slot-set.js';
import { OpenStreams, type OpenEntry } from '../../data-plane/state/open-streams.js';
import { BodyWatch, type PacedBody } from '../../data-plane/request/request-body.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as (opts?: { type: 'minor' | 'major' }) => void;

test('a SlotSet holds what a Set would, through any sequence of adds and removes', () => {
  fc.assert(
    fc.property(fc.array(fc.tuple(fc.boolean(), fc.nat(15)), { maxLength: 200 }), (ops) => {
      const members = Array.from({ length: 16 }, (): Slotted & { id: number } => ({ slot: -1, id: 0 }));
      members.forEach((m, i) => (m.id = i));
      const s = new SlotSet<Slotted & { id: number }>();
      const model = new Set<number>();
      for (const [add, i] of ops) {
        if (add) {
          s.add(members[i]);
          model.add(i);
        } else assert.equal(s.delete(members[i]), model.delete(i));
        assert.equal(s.size, model.size);
        for (const m of members) assert.equal(s.has(m), model.has(m.id));
        assert.deepEqual(s.values().map((m) => m.id).sort((a, b) => a - b), [...model].sort((a, b) => a - b));
      }
    }),
  );
});

const oldSpaceUsed = (): number => getHeapSpaceStatistics().find((s) => s.space_name === 'old_space')!.space_used_size;

/**
 * Passes `n` members of 8 KiB each through a registry, at most 40 in it at a time (requests in
 * flight), then two young collections: the bytes that reached the old generation.
 */
function promotedUnderChurn<T>(make: (payload: number[]) => T, add: (m: T) => void, remove: (m: T) => void, n = 2000): number {
  gc();
  gc();
  const before = oldSpaceUsed();
  const inFlight: T[] = [];
  for (let i = 0; i < n; i++) {
    const m = make(new Array<number>(1000).fill(i));
    add(m);
    inFlight.push(m);
    if (inFlight.length > 40) remove(inFlight.shift()!);
  }
  for (const m of inFlight.splice(0)) remove(m);
  gc({ type: 'minor' });
  gc({ type: 'minor' });
  return oldSpaceUsed() - before;
}

// 2,000 members of 8 KiB: 16 MB pass through. A registry that keeps what left promotes megabytes of it
// (a Set did: ~4.5 MB); one that does not, what happened to be in flight at a collection.
const MAX_PROMOTED = 1.6 * 1024 * 1024;

test('what left the registry of open entries is not promoted: entries pass through it as requests do', () => {
  const streams = new OpenStreams();
  // A session of the same key open throughout (a realtime socket): the key's entries are long-lived.
  const session: OpenEntry = { keyHash: 'k', orgId: 'o', modelId: '', slot: -1, end: () => undefined };
  streams.add(session);
  const promoted = promotedUnderChurn(
    (payload): OpenEntry & { payload: number[] } => ({ keyHash: 'k', orgId: 'o', modelId: '', slot: -1, payload, end: () => undefined }),
    (e) => streams.add(e),
    (e) => streams.remove(e),
  );
  assert.equal(streams.count(), 1);
  streams.remove(session);
  assert.ok(promoted < MAX_PROMOTED, `promoted ${(promoted / 1024).toFixed(0)} KiB of 16,000 KiB passed through`);
});

test('what left the watch of bodies being read is not promoted', () => {
  const watch = new BodyWatch({ minBytesPerSec: 1, graceMs: 60_000 }, () => 0, 60_000);
  const upload: PacedBody = { startedAt: 0, received: 0, slot: -1, tooSlow: () => undefined };
  watch.add(upload);
  const promoted = promotedUnderChurn(
    (payload): PacedBody & { payload: number[] } => ({ startedAt: 0, received: 0, slot: -1, payload, tooSlow: () => undefined }),
    (b) => watch.add(b),
    (b) => watch.remove(b),
  );
  assert.equal(watch.watching, 1);
  watch.remove(upload);
  assert.ok(promoted < MAX_PROMOTED, `promoted ${(promoted / 1024).toFixed(0)} KiB of 16,000 KiB passed through`);
});
