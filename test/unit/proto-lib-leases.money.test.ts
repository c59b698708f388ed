// Money leases, as pure modules: the control plane's money ledger and the lease client's slices of an
// organisation's money (helpers in test/helpers/leases.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MoneyLeaseLedger } from '../../control-plane/sync/lease-ledger.js';
import { client } from '../helpers/leases.js';

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
