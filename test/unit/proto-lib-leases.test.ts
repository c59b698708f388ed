// Lease ledgers (control plane) and the lease client (node), as pure modules.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { coldShare, leaseChunk } from '../../proto/lib/leases.js';
import { KeyLeaseLedger, MoneyLeaseLedger, SlotLedger, type KeyGrantResult } from '../../control-plane/sync/lease-ledger.js';
import { LeaseClient, type LeaseRequestOut } from '../../data-plane/limits/lease-client.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets } from '../../data-plane/limits/key-budgets.js';
import type { KeyLease, KeyLeaseWant } from '../../proto/gen/tollgate/v1/sync.js';

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

function want(w: Partial<KeyLeaseWant>): KeyLeaseWant {
  return { keyId: 'k', minute: 5, heldRequests: 0, heldTokens: 0, requests: 0, tokens: 0, needRequests: 0, needTokens: 0, ...w };
}

function granted(r: KeyGrantResult) {
  assert.equal(r.kind, 'grant', JSON.stringify(r));
  return (r as Extract<KeyGrantResult, { kind: 'grant' }>).grant;
}

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

test('money ledger: slices never pass what is spendable; debts count once; nothing left reclaims first', () => {
  const m = new MoneyLeaseLedger();
  const grant = (conn: string, spendable: number, n: number, wantMicros = 0, after = false) => m.grant(conn, 'org', spendable, n, wantMicros, after);
  assert.deepEqual(new MoneyLeaseLedger().grant('x', 'org', 5_000_000, 1), { kind: 'grant', micros: 5_000_000 }, 'a lone node gets everything');
  assert.deepEqual(grant('a', 5_000_000, 2), { kind: 'grant', micros: 1_250_000 });
  assert.deepEqual(grant('b', 5_000_000, 2), { kind: 'grant', micros: Math.floor(3_750_000 / 4) });
  // a reports 1.5 USD: 0.25 past its slice (requests in flight cost more than their estimate).
  m.consume('a', 'org', 1_500_000);
  assert.equal(m.balanceOf('a', 'org'), -250_000);
  assert.equal(m.outstandingFor('org'), 937_500, 'a debt is already in the spend: only positive balances are outstanding');
  // The next grant to a covers its debt first, exactly as the node's slice does.
  const g = grant('a', 3_500_000, 2, 250_000);
  assert.equal(g.kind, 'grant');
  assert.equal(m.balanceOf('a', 'org'), (g as { micros: number }).micros - 250_000);
  // When nothing is leasable but another node holds an unused slice, it is reclaimed first.
  const m2 = new MoneyLeaseLedger();
  m2.grant('lone', 'org', 1_000_000, 1);
  assert.deepEqual(m2.grant('joiner', 'org', 1_000_000, 2), { kind: 'reclaim', from: ['lone'] });
  m2.giveBack('lone', 'org', 900_000);
  assert.deepEqual(m2.grant('joiner', 'org', 1_000_000, 2, 0, true), { kind: 'grant', micros: 225_000 });
  // Nothing spendable at all: 0, no reclaim.
  assert.deepEqual(m2.grant('joiner', 'org', 0, 2), { kind: 'grant', micros: 0 });
  // A closed connection's balances are released.
  m2.dropConnection('lone');
  m2.dropConnection('joiner');
  assert.equal(m2.outstandingFor('org'), 0);
});

function client(nodes: number) {
  const clock = new ManualClock(60_000 * 100);
  const sent: LeaseRequestOut[] = [];
  const lc = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  lc.setConnected(true, nodes);
  return { lc, sent, clock };
}

const limits = { keyId: 'k', rpmLimit: 20, tpmLimit: 60_000, maxParallel: 100 };

function lease(g: Partial<KeyLease>): KeyLease {
  return { keyId: 'k', minute: 100, requests: 0, tokens: 0, finalRequests: false, finalTokens: false, freeRequests: 0, freeTokens: 0, ...g };
}

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
  lc.applyKeyGrant(lease({ requests: 2, tokens: 5000, freeRequests: 18, freeTokens: 55_000 }));
  assert.equal(woken, 1);
  const b = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([b.requests, b.tokens, b.freeRequests], [2, 5000, 18]);
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

test('lease client: money waits for its first slice, reserves while in flight, refuses only when nothing is left', () => {
  const { lc, sent, clock } = client(2);
  assert.equal(lc.canSpend('org'), 'wait', 'no slice yet: the request waits for one');
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 0 }]);
  lc.applyOrgGrant('org', 1000, false);
  assert.equal(lc.canSpend('org'), 'yes');
  const first = lc.reserveSpend('org');
  lc.settleSpend('org', first, 300);
  const second = lc.reserveSpend('org');
  assert.deepEqual(second, { epoch: 1, micros: 300 });
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 1200 }], '400 left, at most twice the costliest: ask now');
  lc.applyOrgGrant('org', 0, true);
  lc.settleSpend('org', second, 500);
  assert.equal(lc.canSpend('org'), 'yes', '200 left');
  lc.settleSpend('org', lc.reserveSpend('org'), 500);
  assert.equal(lc.canSpend('org'), 'no', 'spent, and the control plane has nothing left');
  clock.advance(1000);
  assert.equal(lc.canSpend('org'), 'wait', 'after the back-off it asks again');
  lc.applyOrgGrant('org', 5000, false);
  assert.equal(lc.sliceOf('org'), 4700, 'the debt of 300 is paid from the new slice, as the ledger does');
});

test('lease client: a funds change gives the slice back and asks afresh, even with a grant on its way', () => {
  // Before: a node told "nothing left" kept its `pending` flag and old slice across a cap change, so
  // a lowered cap did not bind and a raised one did not unblock it.
  const { lc, sent } = client(2);
  lc.canSpend('org');
  lc.applyOrgGrant('org', 2_000_000, false);
  lc.canSpend('org');
  lc.orgChanged('org');
  const out = sent.at(-1)!;
  assert.deepEqual(out.orgReturns, [{ orgId: 'org', micros: 2_000_000 }]);
  assert.deepEqual(out.orgs, [{ orgId: 'org', micros: 0 }]);
  assert.equal(lc.canSpend('org'), 'wait');
  // A reclaim of money returns the unused slice.
  lc.applyOrgGrant('org', 100_000, false);
  lc.onReclaim({ id: 9, keys: [], allKeys: false, orgIds: ['org'], slotKeyIds: [] });
  assert.deepEqual(sent.at(-1)!.orgReturns, [{ orgId: 'org', micros: 100_000 }]);
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

test('lease client: budget given back to a spent pool lifts "spent" and the headers\' view of what is free', () => {
  const { lc } = client(2);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ finalRequests: true, freeRequests: 0, freeTokens: 0 }));
  assert.equal(lc.allowanceFor('k', 100, limits).requestsFinal, true);
  lc.applyPoolFree('k', 100, 4, 1000);
  const a = lc.allowanceFor('k', 100, limits);
  assert.deepEqual([a.requestsFinal, a.freeRequests, a.freeTokens], [false, 4, 1000]);
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

test('lease client: on a new connection it says at once what it holds (slots in use, key minutes used), so a restarted control plane counts them', () => {
  // Before: a node whose slots were all in use never asked again, so after a control-plane restart
  // nobody counted them and the other nodes were leased the key's whole limit again.
  const { lc, sent } = client(3);
  const lim = { ...limits, maxParallel: 10 };
  lc.slotsFor('k', lim);
  lc.applySlotGrant({ keyId: 'k', slots: 5, final: false });
  for (let i = 1; i <= 5; i++) lc.noteInFlight('k', i, 10);
  lc.allowanceFor('k', 100, limits);
  lc.applyKeyGrant(lease({ requests: 4, tokens: 5000, freeRequests: 16, freeTokens: 55_000 }));
  lc.noteUsage('k', 100, 3, 900);
  lc.setConnected(false);
  const before = sent.length;
  lc.setConnected(true);
  assert.equal(sent.length, before + 1);
  assert.deepEqual(sent.at(-1)!.slotReturns, [{ keyId: 'k', held: 5, returned: 0 }]);
  assert.deepEqual(sent.at(-1)!.keyReturns, [{ keyId: 'k', minute: 100, requests: 0, tokens: 0, heldRequests: 3, heldTokens: 900 }]);
  // The fresh ledger registers them: another node gets only what is left.
  const l = new SlotLedger();
  for (const r of sent.at(-1)!.slotReturns) l.applyHeld('n1#1', r);
  assert.deepEqual(l.grant('n2#2', { keyId: 'k', held: 0, want: 10, need: 10 }, 10, [], true), { kind: 'grant', slots: 5, final: true });
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
