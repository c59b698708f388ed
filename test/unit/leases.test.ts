// Lease ledgers (control plane) and the lease client (node), as pure modules.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { coldShare, leaseChunk } from '../../proto/lib/leases.js';
import { KeyLeaseLedger, MoneyLeaseLedger } from '../../control-plane/sync/lease-ledger.js';
import { LeaseClient, type LeaseRequestOut } from '../../data-plane/limits/lease-client.js';
import { ManualClock } from '../../data-plane/limits/clock.js';

test('cold share: a lone node holds the whole budget, n nodes a quarter-to-half share each', () => {
  const rows: Array<[number, number, number]> = [
    [20, 1, 20],
    [20, 0, 20],
    [20, 2, 5],
    [20, 3, 3],
    [300, 3, 50],
    [1, 2, 0],
    [0, 3, 0],
  ];
  for (const [limit, n, want] of rows) assert.equal(coldShare(limit, n), want, `coldShare(${limit}, ${n})`);
  assert.equal(leaseChunk(20, 3), 2);
  assert.equal(leaseChunk(1, 5), 1);
});

test('key pools never grant past the limit, reserving unregistered nodes\' cold shares', () => {
  const ledger = new KeyLeaseLedger();
  const limits = { rpm: 20, tpm: 60_000 };
  const cold = coldShare(20, 3);
  // Node a registers its cold share and asks for 100: it gets 20 - 3 (its own) - 2*3 (b and c reserved).
  const a = ledger.grant('a', { keyId: 'k', minute: 5, heldRequests: cold, heldTokens: 0, requests: 100, tokens: 0 }, limits, 3);
  assert.equal(a.requests, 20 - cold - 2 * cold);
  // b registers its cold share: nothing more is left.
  const b = ledger.grant('b', { keyId: 'k', minute: 5, heldRequests: cold, heldTokens: 0, requests: 5, tokens: 0 }, limits, 3);
  assert.equal(b.requests, 0);
  // c too; the total held is exactly the limit.
  const c = ledger.grant('c', { keyId: 'k', minute: 5, heldRequests: cold, heldTokens: 0, requests: 5, tokens: 0 }, limits, 3);
  assert.equal(c.requests, 0);
  assert.equal(cold * 3 + a.requests + b.requests + c.requests, 20);
  // Another minute is another pool.
  const next = ledger.grant('a', { keyId: 'k', minute: 6, heldRequests: cold, heldTokens: 0, requests: 2, tokens: 0 }, limits, 3);
  assert.equal(next.requests, 2);
  // Old minutes are pruned as time moves on.
  ledger.grant('a', { keyId: 'k', minute: 9, heldRequests: 0, heldTokens: 0, requests: 1, tokens: 0 }, limits, 3);
  assert.equal(ledger.size, 1);
});

test('after a control-plane restart the pools are rebuilt from what nodes say they hold', () => {
  const ledger = new KeyLeaseLedger();
  const limits = { rpm: 20, tpm: 60_000 };
  const g = ledger.grant('a2', { keyId: 'k', minute: 1, heldRequests: 15, heldTokens: 0, requests: 10, tokens: 0 }, limits, 1);
  assert.equal(g.requests, 5);
});

test('money slices: never more than what is spendable minus outstanding slices; usage and disconnects release', () => {
  const m = new MoneyLeaseLedger();
  assert.equal(new MoneyLeaseLedger().grant('x', 'org', 5_000_000, 1), 5_000_000, 'a lone node gets everything');
  const first = m.grant('a', 'org', 5_000_000, 2);
  assert.equal(first, 1_250_000);
  const second = m.grant('b', 'org', 5_000_000, 2);
  assert.equal(second, Math.floor((5_000_000 - 1_250_000) / 4));
  assert.equal(m.outstandingFor('org'), first + second);
  // a reports 1.0 USD of usage; the ledger's spend goes up by the same amount at the same time.
  m.consume('a', 'org', 1_000_000);
  assert.equal(m.outstandingFor('org'), first + second - 1_000_000);
  // Nothing left: 0.
  assert.equal(m.grant('a', 'org', first + second - 1_000_000, 2), 0);
  // Small remainders go whole.
  m.dropConnection('a');
  m.dropConnection('b');
  assert.equal(m.outstandingFor('org'), 0);
  assert.equal(m.grant('c', 'org', 8_000, 3), 8_000);
});

function client(nodes: number) {
  const clock = new ManualClock(60_000 * 100);
  const sent: LeaseRequestOut[] = [];
  const lc = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  lc.setConnected(true, nodes);
  return { lc, sent, clock };
}

const limits = { keyId: 'k', rpmLimit: 20, tpmLimit: 60_000, maxParallel: 100 };

test('lease client: a lone node holds the whole minute and asks nothing', () => {
  const { lc, sent } = client(1);
  assert.deepEqual(lc.allowanceFor('k', 100, limits), { requests: 20, tokens: 60_000, requestsFinal: false, tokensFinal: false });
  lc.noteUsage('k', 100, 19, 100);
  assert.equal(sent.length, 0);
});

test('lease client: with three nodes it starts on its cold share, asks at once, and tops up when low', () => {
  const { lc, sent } = client(3);
  assert.deepEqual(lc.allowanceFor('k', 100, limits), { requests: 3, tokens: 10_000, requestsFinal: false, tokensFinal: false });
  assert.equal(sent.length, 1);
  assert.deepEqual(sent[0].keys[0], { keyId: 'k', minute: 100, heldRequests: 3, heldTokens: 10_000, requests: 2, tokens: 5000 });
  lc.applyKeyGrant('k', 100, 2, 5000);
  assert.deepEqual(lc.allowanceFor('k', 100, limits), { requests: 5, tokens: 15_000, requestsFinal: false, tokensFinal: false });
  lc.noteUsage('k', 100, 4, 100);
  assert.equal(sent.length, 2, 'one request left of 5: ask for the next chunk');
  lc.applyKeyGrant('k', 100, 0, 0);
  lc.noteUsage('k', 100, 5, 100);
  assert.equal(sent.length, 2, 'an exhausted pool is not asked again this minute');
  assert.equal(lc.allowanceFor('k', 100, limits).requestsFinal, true, 'refusals now wait for the top of the minute');
  // Disconnected: the key's own limits apply locally.
  lc.setConnected(false);
  assert.equal(lc.allowanceFor('k', 100, limits).requests, Infinity);
});

test('lease client: money is admitted on slices, reserved while in flight, refused when nothing is left', () => {
  const { lc, sent, clock } = client(2);
  assert.equal(lc.canSpend('org'), true, 'the first request goes while the first slice is on its way');
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 0 }]);
  const first = lc.reserveSpend('org');
  lc.applyOrgGrant('org', 1000, false);
  lc.settleSpend('org', first, 300);
  assert.equal(sent.length, 1, '700 left of 1000: more than half the grant and twice the costliest request');
  // The next request reserves the costliest seen (300): 400 left, at most 2 x 300: ask now, while it runs.
  const second = lc.reserveSpend('org');
  assert.deepEqual(second, { epoch: 1, micros: 300 });
  assert.equal(sent.length, 2);
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 1200 }], 'asks for a few of its costliest requests');
  lc.applyOrgGrant('org', 0, true);
  lc.settleSpend('org', second, 500);
  assert.equal(lc.canSpend('org'), true, '200 left');
  lc.settleSpend('org', lc.reserveSpend('org'), 500);
  assert.equal(lc.canSpend('org'), false, 'spent and the control plane has nothing left');
  clock.advance(1000);
  assert.equal(lc.canSpend('org'), false, 'asks again after the back-off, still refusing until a slice arrives');
  assert.equal(sent.length, 3);
  lc.applyOrgGrant('org', 5000, false);
  assert.equal(lc.canSpend('org'), true);
  // A reservation made on an earlier connection is not given back to the new slice.
  const old = lc.reserveSpend('org');
  lc.setConnected(false);
  lc.setConnected(true, 2);
  assert.equal(lc.canSpend('org'), true);
  lc.applyOrgGrant('org', 1000, false);
  lc.settleSpend('org', old, 400);
  assert.equal(lc.canSpend('org'), true, '600 left of the new slice');
});
