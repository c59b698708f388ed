// Lease ledgers (control plane) and the lease client (node), as pure modules: cold shares, key minutes
// and the lease link (helpers in test/helpers/leases.ts). Money is in proto-lib-leases.money.test.ts,
// parallel slots in proto-lib-leases.slots.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { coldShare, leaseChunk } from '../../proto/lib/leases.js';
import { KeyLeaseLedger } from '../../control-plane/leases/key-lease-ledger.js';
import { client, granted, lease, limits, want } from '../helpers/leases.js';

test('cold share: a lone node holds the whole budget, several nodes hold nothing unasked', () => {
  const rows: Array<[number, number, number]> = [
    [20, 1, 20],
    [20, 0, 20],
    [20, 2, 0],
    [300, 3, 0],
    [0, 1, 0],
  ];
  for (const [limit, n, want] of rows) assert.equal(coldShare(limit, n), want, `coldShare(${limit}, ${n})`);
  const chunks: Array<[number, number, number]> = [
    [300, 3, 25],
    [20, 3, 2],
    [1, 5, 1],
    [60_000, 2, 7500],
  ];
  for (const [limit, n, want] of chunks) assert.equal(leaseChunk(limit, n), want, `leaseChunk(${limit}, ${n})`);
});

test('key ledger: grants never pass the limit; a need that does not fit reclaims first, then is final', () => {
  const l = new KeyLeaseLedger();
  const limits = { rpm: 20, tpm: 60_000 };
  // Rows: [conn, want, expected result]
  const g1 = granted(l.grant('a', want({ requests: 8 }), limits));
  assert.deepEqual([g1.requests, g1.freeRequests, g1.finalRequests], [8, 12, false]);
  const g2 = granted(l.grant('b', want({ requests: 8 }), limits));
  assert.deepEqual([g2.requests, g2.freeRequests], [8, 4]);
  // c asks 8 and needs 1: 4 are free, so it gets 4 without a reclaim.
  const g3 = granted(l.grant('c', want({ requests: 8, needRequests: 1 }), limits));
  assert.deepEqual([g3.requests, g3.freeRequests], [4, 0]);
  // c needs 1 more: nothing free, a and b hold some: reclaim from them.
  assert.deepEqual(l.grant('c', want({ requests: 8, needRequests: 1 }), limits), { kind: 'reclaim', from: ['a', 'b'] });
  // a had used 6 of its 8 and gives 2 back; b used all 8 and gives 0.
  l.applyReturn('a', { keyId: 'k', minute: 5, requests: 2, tokens: 0, heldRequests: 6, heldTokens: 0 });
  l.applyReturn('b', { keyId: 'k', minute: 5, requests: 0, tokens: 0, heldRequests: 8, heldTokens: 0 });
  const g4 = granted(l.grant('c', want({ requests: 8, needRequests: 1 }), limits, [], true));
  assert.deepEqual([g4.requests, g4.finalRequests, g4.freeRequests], [2, false, 0]);
  // Now everything is used or held by c: the next need is final.
  const g5 = granted(l.grant('c', want({ requests: 8, needRequests: 1 }), limits, [], true));
  assert.deepEqual([g5.requests, g5.finalRequests], [0, true]);
  assert.equal(6 + 8 + 4 + 2, 20, 'held in total: exactly the limit');
});

test('key ledger: a 50,000-token need on a 60,000 tpm key is served whole once others give back', () => {
  const l = new KeyLeaseLedger();
  const limits = { rpm: 300, tpm: 60_000 };
  granted(l.grant('a', want({ tokens: 7500 }), limits));
  granted(l.grant('b', want({ tokens: 7500 }), limits));
  // 45,000 free: b needs 50,000 more. a holds 7,500 it has not used.
  assert.deepEqual(l.grant('b', want({ tokens: 7500, needTokens: 50_000 }), limits), { kind: 'reclaim', from: ['a'] });
  l.applyReturn('a', { keyId: 'k', minute: 5, requests: 0, tokens: 7400, heldRequests: 0, heldTokens: 100 });
  const g = granted(l.grant('b', want({ tokens: 7500, needTokens: 50_000 }), limits, [], true));
  assert.deepEqual([g.tokens, g.finalTokens, g.freeTokens], [50_000, false, 2400]);
  // A need that the key's limit could never hold is final without a reclaim when nobody else holds any.
  const l2 = new KeyLeaseLedger();
  const big = granted(l2.grant('a', want({ needTokens: 70_000 }), limits));
  assert.deepEqual([big.tokens, big.finalTokens], [0, true]);
});

test('key ledger: a former lone node is asked what it holds before its key minutes are leased to others', () => {
  const l = new KeyLeaseLedger();
  const limits = { rpm: 300, tpm: 1_000_000 };
  // b joins while a (which was alone and holds whole budgets unasked) has not answered its reclaim.
  assert.deepEqual(l.grant('b', want({ requests: 25, needRequests: 1 }), limits, ['a']), { kind: 'reclaim', from: ['a'] });
  // a answers: it used 200 of the 300 it held and gives 100 back. Unregistered, so it registers at 200.
  l.applyReturn('a', { keyId: 'k', minute: 5, requests: 100, tokens: 0, heldRequests: 200, heldTokens: 0 });
  const g = granted(l.grant('b', want({ requests: 25, needRequests: 1 }), limits, ['a']));
  assert.deepEqual([g.requests, g.freeRequests], [25, 75]);
  // Pools of other minutes are separate and pruned as time moves on.
  granted(l.grant('a', want({ minute: 9, requests: 1 }), limits));
  assert.equal(l.size, 1);
});

test('key ledger: after a control-plane restart the pools are rebuilt from what nodes say they hold', () => {
  const l = new KeyLeaseLedger();
  const g = granted(l.grant('a2', want({ minute: 1, heldRequests: 15, requests: 10 }), { rpm: 20, tpm: 60_000 }));
  assert.equal(g.requests, 5);
});

test('lease client: a lone node holds whole minutes from the minute after it became alone, and asks nothing', () => {
  const { lc, sent } = client(1);
  const a = lc.allowanceFor('k', 101, limits);
  assert.deepEqual([a.requests, a.tokens], [20, 60_000]);
  lc.noteUsage('k', 101, 19, 100);
  assert.equal(sent.length, 0);
});

test('lease client: a node left alone mid-minute leases that minute (others may have used it)', () => {
  // Before: a survivor of a killed node took the whole budget of the current minute unasked and
  // admitted past the limit what the dead node had already used.
  const { lc, sent } = client(3);
  lc.setConnectedNodes(1);
  const a = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([a.requests, a.tokens], [0, 0]);
  assert.equal(sent.length, 1, 'it asks the control plane, which knows what the others held');
  assert.equal(lc.allowanceFor('other', 101, { ...limits, keyId: 'other' }).requests, 20, 'the next minute is whole');
  // Alone with nobody else connected lately (the control plane says so): the current minute is whole.
  const quiet = client(2).lc;
  quiet.setConnected(false);
  quiet.setConnected(true);
  quiet.setConnectedNodes(1, true);
  assert.equal(quiet.allowanceFor('k', 100, limits).requests, 20);
});

test('lease client: with several nodes it holds nothing unasked, prefetches chunks, and wakes waiters on a grant', () => {
  const { lc, sent } = client(3);
  const a = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([a.requests, a.tokens], [0, 0]);
  assert.equal(sent.length, 1, 'the first touch of a minute asks for a chunk');
  assert.deepEqual(sent[0].keys[0], { keyId: 'k', minute: 100, heldRequests: 0, heldTokens: 0, requests: 2, tokens: 5000, needRequests: 0, needTokens: 0 });
  // A request waits while the chunk is on its way; asking again is not needed.
  let woken = 0;
  assert.equal(lc.waitForKey('k', 100, limits, 1, 0, () => woken++), true);
  assert.equal(sent.length, 1);
  lc.applyKeyGrant(lease({ requests: 2, tokens: 5000, freeRequests: 18, freeTokens: 55_000, othersUsedRequests: 3, othersUsedTokens: 900 }));
  assert.equal(woken, 1);
  const b = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([b.requests, b.tokens, b.othersUsedRequests, b.othersUsedTokens], [2, 5000, 3, 900]);
  lc.noteUsage('k', 100, 2, 100);
  assert.equal(sent.length, 2, 'nothing left of the chunk: the next one is asked for');
  // The pool is spent after reclaiming: waiting is pointless, refusals count to the top of the minute.
  lc.applyKeyGrant(lease({ finalRequests: true }));
  assert.equal(lc.allowanceFor('k', 100, limits).requestsFinal, true);
  assert.equal(lc.waitForKey('k', 100, limits, 1, 0, () => woken++), false);
  // Disconnected: the key's own limits apply locally.
  lc.setConnected(false);
  assert.equal(lc.allowanceFor('k', 100, limits).requests, Infinity);
});

test('lease client: a reclaim is answered at once with what is held unused; stopping gives everything back', () => {
  const { lc, sent } = client(2);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ requests: 5, tokens: 15_000 }));
  lc.noteUsage('k', 100, 3, 1000);
  const before = sent.length;
  lc.onReclaim({ id: 7, keys: [{ keyId: 'k', minute: 100 }, { keyId: 'other', minute: 100 }], allKeys: false, orgIds: [], slotKeyIds: [] });
  const answer = sent[before];
  assert.equal(answer.reclaimId, 7);
  assert.deepEqual(answer.keyReturns, [
    { keyId: 'k', minute: 100, requests: 2, tokens: 14_000, heldRequests: 3, heldTokens: 1000 },
    { keyId: 'other', minute: 100, requests: 0, tokens: 0, heldRequests: 0, heldTokens: 0 },
  ]);
  const a = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([a.requests, a.tokens], [3, 1000]);
});

test('lease client: a former lone node answers the all-keys reclaim with what it used of whole budgets', () => {
  const { lc, sent } = client(1);
  lc.allowanceFor('k', 101, limits);
  lc.noteUsage('k', 101, 4, 400);
  lc.setConnectedNodes(2);
  lc.onReclaim({ id: 3, keys: [], allKeys: true, orgIds: [], slotKeyIds: [] });
  assert.deepEqual(sent.at(-1)!.keyReturns, [{ keyId: 'k', minute: 101, requests: 16, tokens: 59_600, heldRequests: 4, heldTokens: 400 }]);
});

test('lease client: a want the control plane never answered is asked again instead of blocking every later ask', () => {
  // Before: a `pending` flag whose grant never came stayed true, and the node never asked again.
  const { lc, sent, clock } = client(2);
  lc.canSpend('org');
  assert.equal(sent.length, 1);
  assert.equal(lc.canSpend('org'), 'wait');
  assert.equal(sent.length, 1, 'one want in flight at a time');
  clock.advance(2000);
  assert.equal(lc.canSpend('org'), 'wait');
  assert.equal(sent.length, 2, 'unanswered for 2 s: asked again');
  lc.allowanceFor('k', 100, limits);
  const asked = sent.length;
  assert.equal(lc.waitForKey('k', 100, limits, 1, 0, () => undefined), true);
  assert.equal(sent.length, asked);
  clock.advance(2000);
  lc.waitForKey('k', 100, limits, 1, 0, () => undefined);
  assert.equal(sent.length, asked + 1);
  // A failed answer (nothing granted, not exhausted) is no refusal.
  lc.applyOrgGrant('org', 0, false);
  assert.equal(lc.canSpend('org'), 'wait');
});

test('lease client: shortly before the top of a minute it leases the next minute\'s first chunk for keys it used', () => {
  const { lc, sent, clock } = client(3);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ requests: 2, tokens: 5000, freeRequests: 18, freeTokens: 55_000 }));
  lc.noteUsage('k', 100, 1, 10);
  lc.allowanceFor('idle', 100, { ...limits, keyId: 'idle' });
  const before = sent.length;
  clock.advance(58_000);
  lc.prefetchNextMinute();
  assert.equal(sent.length, before + 1);
  assert.deepEqual(sent.at(-1)!.keys.map((w) => [w.keyId, w.minute, w.requests]), [['k', 101, 2]], 'only keys used this minute');
  lc.applyKeyGrant(lease({ minute: 101, requests: 2, tokens: 5000, freeRequests: 16, freeTokens: 50_000 }));
  clock.advance(2_000);
  const a = lc.allowanceFor('k', 101, limits);
  assert.deepEqual([a.requests, a.tokens], [2, 5000], 'the new minute starts with the prefetched chunk');
});

test('lease client: a stopping node gives everything back, says so, asks for nothing more and returns late grants', () => {
  // Before: a prefetch granted after the node gave its leases back was lost with its connection.
  const { lc, sent } = client(2);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ requests: 3, tokens: 5000, freeRequests: 17, freeTokens: 55_000 }));
  lc.noteUsage('k', 100, 1, 10);
  lc.giveBackAll();
  const bye = sent.at(-1)!;
  assert.equal(bye.leaving, true);
  assert.deepEqual(bye.keyReturns, [{ keyId: 'k', minute: 100, requests: 2, tokens: 4990, heldRequests: 1, heldTokens: 10 }]);
  const count = sent.length;
  lc.noteUsage('k', 100, 1, 10);
  lc.applyKeyGrant(lease({ requests: 2, tokens: 0 }));
  assert.equal(sent.length, count + 1);
  assert.deepEqual(sent.at(-1)!.keyReturns, [{ keyId: 'k', minute: 100, requests: 2, tokens: 0, heldRequests: 0, heldTokens: 0 }]);
  assert.deepEqual(sent.at(-1)!.keys, [], 'asks for nothing');
});

test('lease client: budget given back to a spent pool lifts "spent"; the pool\'s news says what the others used', () => {
  const { lc } = client(2);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ finalRequests: true, freeRequests: 0, freeTokens: 0, othersUsedRequests: 16, othersUsedTokens: 5000 }));
  assert.equal(lc.allowanceFor('k', 100, limits).requestsFinal, true);
  lc.applyPoolFree({ keyId: 'k', minute: 100, freeRequests: 4, freeTokens: 1000, othersUsedRequests: 12, othersUsedTokens: 4000 });
  const a = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([a.requestsFinal, a.othersUsedRequests, a.othersUsedTokens], [false, 12, 4000]);
  // A message that does not say (an answer that failed) leaves what was heard.
  lc.applyPoolFree({ keyId: 'k', minute: 100, freeRequests: 4, freeTokens: 1000 });
  assert.equal(lc.allowanceFor('k', 100, limits).othersUsedRequests, 12);
  assert.equal(lc.waitForKey('k', 100, limits, 1, 0, () => undefined), true, 'a request may wait for it again');
});

test('key ledger: what a pool has left, and who is in it', () => {
  const l = new KeyLeaseLedger();
  const limits = { rpm: 20, tpm: 60_000 };
  granted(l.grant('a', want({ requests: 5, tokens: 100 }), limits));
  granted(l.grant('b', want({ needRequests: 1 }), limits));
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 14, tokens: 59_900 });
  assert.deepEqual(l.members('k', 5, 'a'), ['b']);
  l.applyReturn('a', { keyId: 'k', minute: 5, requests: 3, tokens: 100, heldRequests: 2, heldTokens: 0 });
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 17, tokens: 60_000 });
});

test('key ledger: a connection that closes frees what it did not say it used; its instance coming back replaces the ghost', () => {
  const l = new KeyLeaseLedger();
  const limits = { rpm: 20, tpm: 60_000 };
  granted(l.grant('n1#1', want({ requests: 10, tokens: 1000 }), limits));
  granted(l.grant('n2#2', want({ requests: 6 }), limits));
  granted(l.grant('n3#3', want({ requests: 4 }), limits));
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 0, tokens: 59_000 });
  // Rows: [what the closing connection said it used, what is freed]. Never said: nothing is freed.
  l.recordUsed('n1#1', { keyId: 'k', minute: 5, requests: 7, tokens: 300 });
  assert.deepEqual(l.release('n1#1'), [{ keyId: 'k', minute: 5 }]);
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 3, tokens: 59_700 });
  assert.deepEqual(l.release('n2#2'), [], 'n2 never said what it used: all it held stays counted');
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 3, tokens: 59_700 });
  // A return says what is still held, which is what was used: newer than the last KeyMinuteUsed.
  l.recordUsed('n3#3', { keyId: 'k', minute: 5, requests: 1, tokens: 0 });
  l.applyReturn('n3#3', { keyId: 'k', minute: 5, requests: 1, tokens: 0, heldRequests: 3, heldTokens: 0 });
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 4, tokens: 59_700 });
  assert.deepEqual(l.release('n3#3'), [], 'nothing more to free: it used all it still held');
  // Node 1's instance reconnects and says it holds 8 (it used one more after it last said).
  granted(l.grant('n1#4', want({ heldRequests: 8, heldTokens: 300, requests: 1 }), limits));
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 2, tokens: 59_700 }, 'the ghost of 7 was replaced by the 8 it holds, plus 1 granted');
  // KeyMinuteUsed for a pool the connection is not in is ignored (a lone node holds whole budgets).
  l.recordUsed('n9#9', { keyId: 'k', minute: 5, requests: 1, tokens: 1 });
  assert.deepEqual(l.release('n9#9'), []);
});

test('lease client: it says what it used of leased key minutes (only those that changed), and not as a lone node', () => {
  const { lc, sent } = client(2);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ requests: 4, tokens: 5000, freeRequests: 16, freeTokens: 55_000 }));
  const before = sent.length;
  lc.sendUsed();
  assert.equal(sent.length, before, 'nothing used yet: nothing to say');
  lc.noteUsage('k', 100, 1, 40);
  lc.noteUsage('k', 100, 2, 90);
  assert.deepEqual(lc.usedState(), { pending: 1, sent: 0, acked: 0 });
  lc.sendUsed();
  const last = sent[sent.length - 1];
  assert.deepEqual([last.used, last.usedSeq], [[{ keyId: 'k', minute: 100, requests: 2, tokens: 90 }], 1]);
  lc.sendUsed();
  assert.equal(sent[sent.length - 1], last, 'unchanged: not said again');
  lc.applyUsedAck(1);
  assert.deepEqual(lc.usedState(), { pending: 0, sent: 1, acked: 1 });
  const lone = client(1).lc;
  lone.allowanceFor('k', 101, limits);
  lone.noteUsage('k', 101, 1, 40);
  assert.equal(lone.usedState().pending, 0, 'a lone node holds whole minutes: nothing to say');
});

test('key ledger: an instance back on a new connection before its old one was seen closing leaves no ghost', () => {
  // Before: the new connection said it holds the 6 it used, then the old one closed and left a ghost
  // of the same 6: counted twice for the rest of the minute (refusals with budget free).
  const l = new KeyLeaseLedger();
  const limits = { rpm: 20, tpm: 60_000 };
  granted(l.grant('n1#1', want({ requests: 10, tokens: 1000 }), limits));
  l.recordUsed('n1#1', { keyId: 'k', minute: 5, requests: 6, tokens: 600 });
  assert.equal(granted(l.grant('n1#2', want({ heldRequests: 6, heldTokens: 600, requests: 2 }), limits)).requests, 2);
  l.release('n1#1');
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 12, tokens: 59_400 }, 'only what the new connection holds (6 used + 2) is counted');
  // The new connection closing later leaves its own ghost, as usual.
  l.recordUsed('n1#2', { keyId: 'k', minute: 5, requests: 7, tokens: 500 });
  l.release('n1#2');
  assert.deepEqual(l.freeOf('k', 5, limits), { requests: 13, tokens: 59_500 });
});
