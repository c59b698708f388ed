// Money leases, as pure modules: the control plane's money ledger and the lease client's slices of an
// organisation's money (helpers in test/helpers/leases.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MoneyLeaseLedger } from '../../control-plane/leases/money-lease-ledger.js';
import { client } from '../helpers/leases.js';

test('money ledger: slices never pass what is spendable; debts count once; nothing left reclaims first', () => {
  const m = new MoneyLeaseLedger();
  const grant = (conn: string, spendable: number, n: number, micros = 0, after = false) => m.grant(conn, 'org', spendable, n, { micros }, after);
  assert.deepEqual(new MoneyLeaseLedger().grant('x', 'org', 5_000_000, 1), { kind: 'grant', micros: 5_000_000, exhausted: false }, 'a lone node gets everything');
  assert.deepEqual(grant('a', 5_000_000, 2), { kind: 'grant', micros: 1_250_000, exhausted: false });
  assert.deepEqual(grant('b', 5_000_000, 2), { kind: 'grant', micros: Math.floor(3_750_000 / 4), exhausted: false });
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
  assert.deepEqual(m2.grant('joiner', 'org', 1_000_000, 2, { micros: 0 }, true), { kind: 'grant', micros: 225_000, exhausted: false });
  // Nothing spendable at all: nothing, "exhausted", no reclaim.
  assert.deepEqual(m2.grant('joiner', 'org', 0, 2), { kind: 'grant', micros: 0, exhausted: true });
  // A closed connection's balances are released.
  m2.dropConnection('lone');
  m2.dropConnection('joiner');
  assert.equal(m2.outstandingFor('org'), 0);
});

test('money ledger: a want made ahead of need takes only what is free: never a reclaim, never "exhausted"', () => {
  // Before: a node refilling its slice ahead of need made the control plane reclaim the other
  // node's money; the two took a pool's last dollars from each other, and one was told "exhausted"
  // while the other held money (a false refusal).
  const m = new MoneyLeaseLedger();
  m.grant('a', 'org', 1_000_000, 1);
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 50_000, ahead: true }), { kind: 'grant', micros: 0, exhausted: false });
  m.giveBack('a', 'org', 100_000);
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 50_000, ahead: true }), { kind: 'grant', micros: 50_000, exhausted: false });
  assert.deepEqual(m.grant('b', 'org', 0, 2, { micros: 50_000, ahead: true }), { kind: 'grant', micros: 0, exhausted: false });
});

test('money ledger: a request that needs more than is free reclaims first; what is left after that is the last of the pool', () => {
  const m = new MoneyLeaseLedger();
  m.grant('a', 'org', 1_000_000, 2, { micros: 900_000 });
  // 100,000 free, b needs 300,000: the others' unused money is asked back before anything is decided.
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 1_000_000, needMicros: 300_000 }), { kind: 'reclaim', from: ['a'] });
  m.giveBack('a', 'org', 150_000);
  // After the reclaim, money is short: the need (and a share), not the whole want; less than the
  // need is the last of it ("exhausted": the node may spend it, then refuses).
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 1_000_000, needMicros: 300_000 }, true), { kind: 'grant', micros: 250_000, exhausted: true });
  // With enough free, the need is met and the want given as asked.
  const m2 = new MoneyLeaseLedger();
  assert.deepEqual(m2.grant('b', 'org', 1_000_000, 2, { micros: 400_000, needMicros: 300_000 }), { kind: 'grant', micros: 400_000, exhausted: false });
});

test('money ledger: money a reclaim freed is kept for the want it was made for', () => {
  // Before: node b answered a's reclaim and, in the same message, asked ahead for more; the control
  // plane granted b the money it had just given back, and a was told "exhausted" (refused with
  // 3.5 USD of 12.5 left, money-limits.test.ts).
  const m = new MoneyLeaseLedger();
  m.grant('a', 'org', 1_000_000, 2, { micros: 500_000 });
  m.grant('b', 'org', 1_000_000, 2, { micros: 500_000 });
  assert.deepEqual(m.grant('a', 'org', 1_000_000, 2, { micros: 100_000, needMicros: 100_000 }), { kind: 'reclaim', from: ['b'] });
  m.giveBack('b', 'org', 300_000, 0, 'a');
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 300_000, ahead: true }), { kind: 'grant', micros: 0, exhausted: false }, 'kept for a');
  assert.deepEqual(m.grant('c', 'org', 1_000_000, 3, { micros: 300_000, needMicros: 1 }, true), { kind: 'grant', micros: 0, exhausted: true }, 'kept for a');
  const g = m.grant('a', 'org', 1_000_000, 2, { micros: 100_000, needMicros: 100_000 }, true);
  assert.deepEqual(g, { kind: 'grant', micros: 100_000, exhausted: false });
  // Answered: what a did not take is free for anyone again.
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 300_000, ahead: true }), { kind: 'grant', micros: 200_000, exhausted: false });
});

test('money ledger: another node\'s debt counts until it says otherwise, and a pool spent past its limit takes back what the asker holds', () => {
  const m = new MoneyLeaseLedger();
  m.grant('a', 'org', 1_000_000, 2, { micros: 600_000 });
  m.grant('b', 'org', 1_000_000, 2, { micros: 400_000 });
  // b spent 150,000 past its slice (not reported yet) and says so with its want: it is outstanding
  // for a's want too, not only for b's.
  assert.deepEqual(m.grant('b', 'org', 1_000_000, 2, { micros: 0, debtMicros: 150_000, ahead: true }), { kind: 'grant', micros: 0, exhausted: false });
  assert.equal(m.outstandingFor('org'), 1_150_000);
  // a holds 200,000 and needs 100,000 more: the pool is 150,000 past its limit, so 150,000 of
  // what a holds is not there: taken back, and the rest (50,000) is the last of it.
  assert.deepEqual(m.grant('a', 'org', 1_000_000, 2, { micros: 0, needMicros: 100_000, heldMicros: 200_000 }, true), { kind: 'grant', micros: -150_000, exhausted: true });
  assert.equal(m.outstandingFor('org'), 1_000_000);
  // A reclaim's answer says b owes nothing now (a cheaper request settled): its debt no longer counts.
  m.giveBack('b', 'org', 0, 0);
  assert.equal(m.outstandingFor('org'), 850_000);
});

test('lease client: money waits for its first slice, reserves while in flight, refuses only when nothing is left', () => {
  const { lc, sent, clock } = client(2);
  assert.equal(lc.canSpend('org'), 'wait', 'no slice yet: the request waits for one');
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 0, needMicros: 1 }], 'a request waits: asked as needed');
  lc.applyOrgGrant('org', 1000, false);
  assert.equal(lc.canSpend('org'), 'yes');
  const first = lc.reserveSpend('org');
  lc.settleSpend('org', first, 300);
  const second = lc.reserveSpend('org');
  assert.deepEqual(second, { epoch: 1, micros: 300 });
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 1200, ahead: true }], '400 left, at most twice the costliest: ask ahead of need');
  lc.applyOrgGrant('org', 0, false);
  lc.settleSpend('org', second, 500);
  assert.equal(lc.canSpend('org'), 'wait', '200 left, less than the costliest request: the request waits for what it needs');
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 2000, needMicros: 300, heldMicros: 200 }]);
  lc.applyOrgGrant('org', 0, true);
  assert.equal(lc.canSpend('org'), 'yes', 'the last of the pool (200): spent');
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
  assert.deepEqual(out.orgs, [{ orgId: 'org', micros: 0, ahead: true }]);
  assert.equal(lc.canSpend('org'), 'wait');
  // A reclaim of money returns the unused slice.
  lc.applyOrgGrant('org', 100_000, false);
  lc.onReclaim({ id: 9, keys: [], allKeys: false, orgIds: ['org'], slotKeyIds: [] });
  assert.deepEqual(sent.at(-1)!.orgReturns, [{ orgId: 'org', micros: 100_000, debtMicros: 0 }]);
});

test('lease client: refills ahead of need stop when nothing is free, a request still asks, and money taken back is refused', () => {
  const { lc, sent } = client(2);
  lc.canSpend('org');
  lc.applyOrgGrant('org', 1000, false);
  lc.settleSpend('org', lc.reserveSpend('org'), 400);
  const asks = () => sent.filter((r) => r.orgs.length > 0).length;
  const before = asks();
  lc.applyOrgGrant('org', 0, false);
  // Nothing free ahead of need: no new want for every request after it.
  lc.settleSpend('org', lc.reserveSpend('org'), 100);
  lc.settleSpend('org', lc.reserveSpend('org'), 100);
  assert.equal(asks(), before, 'dry: not asked again ahead of need');
  assert.equal(lc.sliceOf('org'), 400);
  lc.settleSpend('org', lc.reserveSpend('org'), 300);
  // 100 left, 400 the costliest: a request needs more, and asks though the refills were dry.
  assert.equal(lc.canSpend('org'), 'wait');
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 1600, needMicros: 300, heldMicros: 100 }]);
  // The pool was spent past its limit elsewhere: what this node held is taken back; refused.
  lc.applyOrgGrant('org', -100, true);
  assert.equal(lc.sliceOf('org'), 0);
  assert.equal(lc.canSpend('org'), 'no');
  // A reclaim's answer says what the node owes after it.
  lc.settleSpend('org', lc.reserveSpend('org'), 250);
  lc.onReclaim({ id: 3, keys: [], allKeys: false, orgIds: ['org'], slotKeyIds: [] });
  assert.deepEqual(sent.at(-1)!.orgReturns, [{ orgId: 'org', micros: 0, debtMicros: 250 }]);
});
