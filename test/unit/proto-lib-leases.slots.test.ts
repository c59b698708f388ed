// Parallel slots, as pure modules: the control plane's slot ledger and the lease client's slots of a
// key (helpers in test/helpers/leases.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SlotLedger } from '../../control-plane/leases/slot-ledger.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets } from '../../data-plane/limits/key-budgets.js';
import { client, lease, limits } from '../helpers/leases.js';

test('slot ledger: wants are totals; slots never pass the limit; a need that does not fit takes idle slots back first', () => {
  const l = new SlotLedger();
  const w = (held: number, want: number, need: number) => ({ keyId: 'k', held, want, need });
  // Rows: [conn, want, result]
  assert.deepEqual(l.grant('a', w(0, 4, 4), 10), { kind: 'grant', slots: 4, final: false });
  // The same total asked twice (a second want sent before the first grant came back) adds nothing.
  assert.deepEqual(l.grant('a', w(0, 4, 4), 10), { kind: 'grant', slots: 0, final: false });
  assert.deepEqual(l.grant('b', w(0, 5, 5), 10), { kind: 'grant', slots: 5, final: false });
  assert.deepEqual(l.grant('c', w(0, 3, 0), 10), { kind: 'grant', slots: 1, final: false }, 'a prefetch gets what is free');
  assert.deepEqual(l.grant('c', w(1, 3, 2), 10), { kind: 'reclaim', from: ['a', 'b'] });
  // a uses 2 of its 4 and gives 2 back; b uses all 5.
  l.applyHeld('a', { keyId: 'k', held: 2, returned: 2 });
  l.applyHeld('b', { keyId: 'k', held: 5, returned: 0 });
  assert.deepEqual(l.grant('c', w(1, 3, 2), 10, [], true), { kind: 'grant', slots: 2, final: false });
  assert.equal(l.heldBy('c', 'k'), 3);
  assert.deepEqual(l.grant('c', w(3, 4, 4), 10, [], true), { kind: 'grant', slots: 0, final: true }, 'all 10 held: final');
  // A closed connection's slots are free again.
  l.dropConnection('b');
  assert.deepEqual(l.grant('c', w(3, 4, 4), 10), { kind: 'grant', slots: 1, final: false });
  // A node that was alone is asked what it holds before anything is granted.
  assert.deepEqual(l.grant('d', w(0, 1, 1), 10, ['lone']), { kind: 'reclaim', from: ['lone'] });
});

test('lease client: with several nodes a key\'s requests in flight need leased slots; waiting requests ask for a total; a slot freed here lets a waiter in', () => {
  const { lc, sent } = client(2);
  const lim = { ...limits, maxParallel: 4 };
  const t0 = performance.now();
  assert.deepEqual(lc.slotsFor('k', lim, t0), { slots: 0, final: false });
  let woken = 0;
  assert.equal(lc.waitForSlot('k', lim, () => woken++, t0), true);
  assert.equal(lc.waitForSlot('k', lim, () => woken++, t0), true);
  const wants = sent.flatMap((r) => r.slotWants);
  assert.deepEqual(wants[wants.length - 1], { keyId: 'k', held: 0, want: 2, need: 2 }, 'two requests wait: a total of two');
  lc.applySlotGrant({ keyId: 'k', slots: 2, final: false });
  assert.equal(woken, 2);
  lc.noteInFlight('k', 1, 4);
  lc.noteInFlight('k', 2, 4);
  assert.deepEqual(lc.slotState('k'), { held: 2, inUse: 2, leased: true });
  // Every slot in use across the cluster: the requests waiting then are refused; a later one asks again.
  const t1 = performance.now();
  assert.equal(lc.waitForSlot('k', lim, () => woken++, t1), true);
  lc.applySlotGrant({ keyId: 'k', slots: 0, final: true });
  assert.equal(lc.slotsFor('k', lim, t1)!.final, true);
  assert.equal(lc.waitForSlot('k', lim, () => woken++, t1), false);
  assert.equal(lc.slotsFor('k', lim, performance.now() + 1)!.final, false);
  // A reclaim is answered with what is in use; idle slots go back.
  lc.noteInFlight('k', 1, 4);
  lc.onReclaim({ id: 5, keys: [], allKeys: false, orgIds: [], slotKeyIds: ['k'] });
  assert.deepEqual(sent[sent.length - 1].slotReturns, [{ keyId: 'k', held: 1, returned: 1 }]);
  assert.equal(sent[sent.length - 1].reclaimId, 5);
  // A lone node counts the key's own limit.
  const lone = client(1).lc;
  assert.equal(lone.slotsFor('k', lim), undefined);
});

test('slot ledger: when fewer slots are free than requests wait, the free ones are granted (final), not none', () => {
  // Before: 5 requests waiting on c with 3 slots free across the cluster got 0 slots and `final`:
  // all 5 were refused while 3 slots stood free.
  const l = new SlotLedger();
  const w = (held: number, want: number, need: number) => ({ keyId: 'k', held, want, need });
  assert.deepEqual(l.grant('a', w(0, 7, 7), 10), { kind: 'grant', slots: 7, final: false });
  assert.deepEqual(l.grant('c', w(0, 5, 5), 10), { kind: 'reclaim', from: ['a'] });
  l.applyHeld('a', { keyId: 'k', held: 7, returned: 0 });
  assert.deepEqual(l.grant('c', w(0, 5, 5), 10, [], true), { kind: 'grant', slots: 3, final: true });
  assert.equal(l.heldBy('c', 'k'), 3);
  // On the node: 3 of the 5 waiting requests are admitted, the other 2 refused as the cluster is full.
  const { lc } = client(2);
  const budgets = new KeyBudgets(new ManualClock(60_000 * 100), { allowance: lc });
  const lim = { keyId: 'k', rpmLimit: 0, tpmLimit: 0, maxParallel: 10 };
  const t0 = performance.now();
  for (let i = 0; i < 5; i++) {
    const a = budgets.admit(lim, 0, t0);
    assert.equal(a.ok, false);
    assert.equal(lc.waitForSlot('k', lim, () => undefined, t0), true);
  }
  lc.applySlotGrant({ keyId: 'k', slots: 3, final: true });
  const results = Array.from({ length: 5 }, () => budgets.admit(lim, 0, t0));
  assert.deepEqual(results.map((r) => r.ok), [true, true, true, false, false]);
  const refused = results[4] as Extract<typeof results[number], { ok: false }>;
  assert.equal(refused.dimension, 'max_parallel_requests');
  assert.equal(refused.leaseShort, undefined, 'final: refused at once, no more waiting');
});

test('slot ledger: a grant on its way to a node when it answered a reclaim stays counted (returns are what was given back)', () => {
  // Before: the answer's absolute `held` replaced the ledger's count, so slots granted to the node
  // after the reclaim left (and received after it answered) were counted nowhere: leased twice.
  const l = new SlotLedger();
  const w = (held: number, want: number, need: number) => ({ keyId: 'k', held, want, need });
  assert.deepEqual(l.grant('a', w(0, 4, 4), 10), { kind: 'grant', slots: 4, final: false });
  assert.deepEqual(l.grant('b', w(0, 6, 6), 10), { kind: 'grant', slots: 6, final: false });
  // c needs 3: reclaim from a and b. b answers first: 4 in use, 2 given back.
  assert.deepEqual(l.grant('c', w(0, 3, 3), 10), { kind: 'reclaim', from: ['a', 'b'] });
  l.applyHeld('b', { keyId: 'k', held: 4, returned: 2 });
  // a's prefetch, sent before the reclaim reached it, takes the 2 free slots.
  assert.deepEqual(l.grant('a', w(4, 6, 0), 10), { kind: 'grant', slots: 2, final: false });
  // a's answer, written before that grant reached it: 2 of its 4 in use, 2 given back. Then it receives
  // the grant of 2 and holds 4.
  l.applyHeld('a', { keyId: 'k', held: 2, returned: 2 });
  assert.equal(l.heldBy('a', 'k'), 4, 'a holds its 2 in use plus the 2 granted after the reclaim');
  const g = l.grant('c', w(0, 3, 3), 10, [], true);
  assert.equal(g.kind, 'grant');
  assert.ok(l.heldBy('a', 'k') + l.heldBy('b', 'k') + l.heldBy('c', 'k') <= 10, 'never more than the limit across nodes');
  // A node that was alone and admitted past what it had leased says so: the ledger takes the larger.
  l.applyHeld('b', { keyId: 'k', held: 6, returned: 0 });
  assert.equal(l.heldBy('b', 'k'), 6);
  // The node side: answers say what was given back.
  const { lc, sent } = client(2);
  const lim = { ...limits, maxParallel: 10 };
  lc.slotsFor('k', lim);
  lc.applySlotGrant({ keyId: 'k', slots: 4, final: false });
  lc.noteInFlight('k', 1, 10);
  lc.onReclaim({ id: 2, keys: [], allKeys: false, orgIds: [], slotKeyIds: ['k'] });
  assert.deepEqual(sent.at(-1)!.slotReturns, [{ keyId: 'k', held: 1, returned: 3 }]);
});

test('slot ledger: keys whose slots were all given back are forgotten (no pool per key ever used)', () => {
  // Before: a connection holding 0 stayed in the pool, so every key ever used kept a pool as long as
  // its nodes stayed connected.
  const l = new SlotLedger();
  for (let i = 0; i < 1000; i++) {
    const keyId = `k${i}`;
    assert.deepEqual(l.grant('a', { keyId, held: 0, want: 2, need: 1 }, 10), { kind: 'grant', slots: 2, final: false });
    l.applyHeld('a', { keyId, held: 0, returned: 2 });
  }
  l.grant('b', { keyId: 'z', held: 0, want: 0, need: 0 }, 10);
  assert.equal(l.size, 0);
});

/** The node leased `n` of the key's slots (its limit 10) and has `n` requests of it in flight. */
function inFlight(lc: ReturnType<typeof client>['lc'], keyId: string, n: number): void {
  lc.slotsFor(keyId, { ...limits, maxParallel: 10 });
  lc.applySlotGrant({ keyId, slots: n, final: false });
  for (let i = 1; i <= n; i++) lc.noteInFlight(keyId, i, 10);
}

test('lease client: on a new connection it says at once what it holds (slots in use, key minutes used), so a restarted control plane counts them', () => {
  // Before: a node whose slots were all in use never asked again, so after a control-plane restart
  // nobody counted them and the other nodes were leased the key's whole limit again.
  const { lc, sent } = client(3);
  inFlight(lc, 'k', 5);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ requests: 4, tokens: 5000, freeRequests: 16, freeTokens: 55_000 }));
  lc.noteUsage('k', 100, 3, 900);
  lc.setConnected(false);
  const before = sent.length;
  lc.setConnected(true);
  assert.equal(sent.length, before + 1);
  assert.deepEqual(sent.at(-1)!.slotReturns, [{ keyId: 'k', held: 5, returned: 0 }]);
  // Key minutes as taken (added to what a Hello registered; no Hello said them here, so all of it).
  assert.deepEqual(sent.at(-1)!.keyReturns, []);
  assert.deepEqual(sent.at(-1)!.taken, [{ keyId: 'k', minute: 100, requests: 3, tokens: 900 }]);
  // The fresh ledger registers them: another node gets only what is left.
  const l = new SlotLedger();
  for (const r of sent.at(-1)!.slotReturns) l.applyHeld('n1#1', r);
  assert.deepEqual(l.grant('n2#2', { keyId: 'k', held: 0, want: 10, need: 10 }, 10, [], true), { kind: 'grant', slots: 5, final: true });
});

test('lease client: what the Hello said is corrected on the new connection, never counted twice: requests that ended in between free their slots', () => {
  // Before: the Hello said 5 in use, 1 request ended before the stream was accepted, and the node
  // then said "held 4, returned 0": the ledger kept max(5 - 0, 4) = 5, a phantom slot that made
  // another node's need of 6 final at 5 until the key sat idle for a minute.
  const { lc, sent } = client(3);
  inFlight(lc, 'k', 5);
  inFlight(lc, 'gone', 1);
  lc.setConnected(false);
  const hello = lc.held();
  assert.deepEqual(hello.heldSlots, [{ keyId: 'k', held: 5, returned: 0 }, { keyId: 'gone', held: 1, returned: 0 }]);
  const l = new SlotLedger();
  for (const r of hello.heldSlots) l.applyHeld('n1#1', r);
  // Between the Hello and the stream's acceptance one request of k ends, and the one of `gone`.
  lc.noteInFlight('k', 4, 10);
  lc.noteInFlight('gone', 0, 10);
  lc.setConnected(true);
  for (const r of sent.at(-1)!.slotReturns) l.applyHeld('n1#1', r);
  assert.equal(l.heldBy('n1#1', 'k'), 4);
  assert.equal(l.heldBy('n1#1', 'gone'), 0);
  assert.deepEqual(l.grant('n2#2', { keyId: 'k', held: 0, want: 6, need: 6 }, 10, [], true), { kind: 'grant', slots: 6, final: false });
});

test('lease client: while the control plane waits for the nodes connected before its start, a request keeps waiting (within its bound)', () => {
  const { lc } = client(3);
  const started = performance.now();
  assert.equal(lc.answerDeferred(started), false);
  lc.setConnectedNodes(3, false, true);
  assert.equal(lc.answerDeferred(started), true, 'rejoining: not late');
  lc.setConnectedNodes(3, false, false);
  assert.equal(lc.answerDeferred(started), true, 'the answers held back follow the roster that ends the wait');
  assert.equal(lc.answerDeferred(performance.now() + 1), false, 'a request that starts later is not told so');
  lc.setConnectedNodes(3, false, true);
  lc.setConnected(false);
  assert.equal(lc.answerDeferred(started), false, 'cut off: the local limits apply at once');
});

test('lease client: a slot prefetch that came back empty is not sent again on every request (waiting requests still ask)', () => {
  // Before: with every slot of the key leased somewhere, each admission and each end sent a want
  // that came back empty: a control-plane round trip per request.
  const { lc, sent } = client(3);
  const lim = { ...limits, maxParallel: 100 };
  lc.slotsFor('k', lim);
  lc.applySlotGrant({ keyId: 'k', slots: 10, final: false });
  const wants = () => sent.flatMap((r) => r.slotWants).length;
  const before = wants();
  for (let i = 0; i < 50; i++) {
    lc.noteInFlight('k', 7, 100);
    lc.applySlotGrant({ keyId: 'k', slots: 0, final: false });
    lc.noteInFlight('k', 6, 100);
  }
  assert.ok(wants() - before <= 1, `${wants() - before} prefetches for 100 request events`);
  // A request that finds no free slot still asks at once.
  lc.noteInFlight('k', 10, 100);
  const asked = wants();
  assert.equal(lc.waitForSlot('k', lim, () => undefined), true);
  assert.equal(wants(), asked + 1);
});
