// What a node may take of a money pool in advance of a late answer (docs/leases.md, "When the control
// plane answers late"): the control plane tells it with each money grant (OrgLease.advance_micros),
// and the node takes that much, then one request more, and the others wait for the answer. Before,
// every request that waited 250 ms was taken in advance: a burst while the control plane was slow
// passed a $0.01 key limit 3-5 times over (32,300 µ$ in a CI run). The first fix (one request per pool,
// 0b22d56, reverted) held a pool far from any limit to one request too, so requests waited 5 s.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MoneyLeaseLedger } from '../../control-plane/leases/money-lease-ledger.js';
import { client } from '../helpers/leases.js';

test('money ledger: the advance allowance is what nobody holds or owes of the pool, shared by the connected nodes', () => {
  const m = new MoneyLeaseLedger();
  // A pool of 1,000,000 µ$ left, two nodes: a takes 300,000, 700,000 is unleased, half each.
  assert.deepEqual(m.grant('a', 'key:k@0', 1_000_000, 2, { micros: 300_000 }), { kind: 'grant', micros: 300_000, exhausted: false });
  assert.equal(m.advanceFor('a', 'key:k@0', 1_000_000, 2), 350_000);
  // b takes a share (175,000 of the 700,000): 525,000 unleased.
  assert.deepEqual(m.grant('b', 'key:k@0', 1_000_000, 2, { micros: 100_000 }), { kind: 'grant', micros: 175_000, exhausted: false });
  assert.equal(m.advanceFor('b', 'key:k@0', 1_000_000, 2), 262_500);
  // Spent and reported: it moves from what a holds to what is spent; nothing changes.
  m.consume('a', 'key:k@0', 200_000);
  assert.equal(m.advanceFor('a', 'key:k@0', 800_000, 2), 262_500);
  // A debt b declares (spent past its slice, not reported yet) is not leasable either.
  m.giveBack('b', 'key:k@0', 0, 40_000);
  assert.equal(m.advanceFor('a', 'key:k@0', 800_000, 2), 242_500);
  // Three nodes connected: a third each.
  assert.equal(m.advanceFor('a', 'key:k@0', 800_000, 3), 161_666);
  // Nothing unleased (spent past it, or all held): nothing.
  assert.equal(m.advanceFor('a', 'key:k@0', 300_000, 2), 0);
  // A lone node is granted all that is left: nothing more may be taken in advance.
  const lone = new MoneyLeaseLedger();
  lone.grant('x', 'org', 5_000_000, 1);
  assert.equal(lone.advanceFor('x', 'org', 5_000_000, 1), 0);
});

test('lease client: out of time, a pool is taken in advance within what the control plane said, then one request more, then requests wait', () => {
  const { lc, sent } = client(2);
  lc.canSpend('pool');
  lc.applyOrgGrant('pool', 1000, false, 6000);
  const a = lc.reserveSpend('pool')!;
  assert.equal(lc.raiseSpend('pool', a, 3000, false, false).verdict, 'wait', 'short: asks');
  // Out of time: 2,000 past the slice, within the 6,000.
  assert.deepEqual(lc.raiseSpend('pool', a, 3000, false, true), { verdict: 'yes' });
  const b = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', b, 3000, false, true), { verdict: 'yes' }, '5,000 taken in advance: within');
  assert.equal(lc.sliceOf('pool'), -5000);
  // Past the allowance: one request more.
  const c = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', c, 3000, false, true), { verdict: 'yes' }, 'the one request past it');
  assert.equal(lc.sliceOf('pool'), -8000);
  // The next waits for the answer, and its need is asked for.
  const d = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', d, 3000, false, true), { verdict: 'wait' });
  assert.equal(lc.sliceOf('pool'), -8000, 'nothing taken');
  assert.equal(sent.at(-1)!.orgs[0].orgId, 'pool');
  // A control plane silent as long as a reclaim may take (5 s) is, for that request, unreachable: taken.
  assert.deepEqual(lc.raiseSpend('pool', d, 3000, false, true, true), { verdict: 'yes' });
  assert.equal(lc.sliceOf('pool'), -11_000);
  // The answer: its slice covers the debt; what is taken in advance of the next answer counts afresh.
  lc.applyOrgGrant('pool', 13_000, false, 2000);
  assert.equal(lc.sliceOf('pool'), 2000);
  const e = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', e, 3000, false, false), { verdict: 'wait' });
  assert.deepEqual(lc.raiseSpend('pool', e, 3000, false, true), { verdict: 'yes' }, '1,000 past the slice: within the new 2,000');
  const f = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', f, 3000, false, true), { verdict: 'yes' }, 'past it: the one request more');
  const g = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', g, 3000, false, true), { verdict: 'wait' });
  // An answer whose grant does not cover what was taken: what is still owed (3,000) counts against
  // the new allowance (the control plane decided it before it heard of it).
  lc.applyOrgGrant('pool', 1000, false, 7000);
  assert.equal(lc.sliceOf('pool'), -3000);
  assert.deepEqual(lc.raiseSpend('pool', g, 3000, false, true), { verdict: 'yes' }, '6,000: within the 7,000');
  const h = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', h, 3000, false, true), { verdict: 'yes' }, 'the one request more');
  const i = lc.reserveSpend('pool')!;
  assert.deepEqual(lc.raiseSpend('pool', i, 3000, false, true), { verdict: 'wait' });
});

test('lease client: admitted out of time (the slice on its way) counts as taken in advance; the request past the allowance raises its own reservation', () => {
  const { lc } = client(2);
  lc.canSpend('pool');
  lc.applyOrgGrant('pool', 1000, false, 2500);
  // A request that cost 2,000: the estimate each next one reserves.
  lc.settleSpend('pool', lc.reserveSpend('pool'), 2000);
  assert.equal(lc.sliceOf('pool'), -1000);
  assert.equal(lc.canSpend('pool'), 'wait');
  // Out of time: 2,000 within the 2,500.
  assert.equal(lc.mayAdvance('pool'), true);
  const a = lc.reserveSpend('pool', true)!;
  assert.equal(lc.sliceOf('pool'), -3000);
  // Past it: one request more, whose own raise to its worst case goes through.
  assert.equal(lc.mayAdvance('pool'), true);
  const b = lc.reserveSpend('pool', true)!;
  assert.deepEqual(lc.raiseSpend('pool', b, 3000, false, true), { verdict: 'yes' });
  assert.equal(lc.mayAdvance('pool'), false, 'the next one waits');
  assert.deepEqual(lc.raiseSpend('pool', a, 3000, false, true), { verdict: 'wait' }, 'a request within the allowance does not pass it at its raise');
});

test('lease client: a pool the control plane told nothing of (no grant yet, or an older control plane) is taken in advance as before', () => {
  const { lc } = client(2);
  lc.canSpend('pool');
  lc.applyOrgGrant('pool', 1000, false);
  for (let i = 0; i < 5; i++) assert.deepEqual(lc.raiseSpend('pool', lc.reserveSpend('pool')!, 3000, false, true), { verdict: 'yes' });
  assert.equal(lc.sliceOf('pool'), -14_000);
  assert.equal(lc.mayAdvance('pool'), true);
  // Told with the bulk slices of a connection: bounded from then on.
  const { lc: other } = client(2);
  other.applyOrgSlices([{ orgId: 'org', micros: 1000, advanceMicros: 0 }]);
  other.reserveSpend('org');
  assert.deepEqual(other.raiseSpend('org', other.reserveSpend('org')!, 3000, false, true), { verdict: 'yes' }, 'one request more');
  assert.deepEqual(other.raiseSpend('org', other.reserveSpend('org')!, 3000, false, true), { verdict: 'wait' });
});

test('lease client: a key\'s limit or a project\'s cap with no grant yet is taken in advance for one request until its first answer; an organisation\'s balance as before', () => {
  // Before: a fresh key limited to $0.01, a burst while the control plane was slow: every request out
  // of time taken in advance of the pool's first answer (32,300 µ$ in a CI run with two nodes).
  for (const pool of ['key:k@0', 'project:p@0']) {
    const { lc, sent } = client(2);
    assert.equal(lc.canSpend(pool), 'wait', 'no slice yet: asked');
    // Out of time: the first request is admitted (nothing past the slice yet: its estimate is 0)...
    assert.equal(lc.mayAdvance(pool), true);
    const a = lc.reserveSpend(pool, true)!;
    // ...and its worst case is the one request taken in advance.
    assert.deepEqual(lc.raiseSpend(pool, a, 3000, false, true), { verdict: 'yes' }, `${pool}: the one request`);
    assert.deepEqual(lc.raiseSpend(pool, a, 3500, false, true), { verdict: 'yes' }, `${pool}: its own raise again`);
    // The next waits for the answer, and its need is asked for.
    const b = lc.reserveSpend(pool, true)!;
    assert.deepEqual(lc.raiseSpend(pool, b, 3000, false, true), { verdict: 'wait' }, `${pool}: the next waits`);
    assert.equal(lc.sliceOf(pool), -3500, 'nothing more taken');
    assert.equal(sent.at(-1)!.orgs.at(-1)!.orgId, pool);
    // A request that already cost something makes the estimate: the next is not even admitted.
    lc.settleSpend(pool, a, 3000);
    assert.equal(lc.mayAdvance(pool), false, `${pool}: admission waits too`);
    // An answer of nothing without an allowance (e.g. the control plane's read failed) starts the count
    // afresh, as any answer does, but leaves the pool bounded: one request more, then waiting.
    lc.applyOrgGrant(pool, 0, false);
    assert.equal(lc.mayAdvance(pool), true, `${pool}: one more after the answer`);
    const n = lc.reserveSpend(pool, true)!;
    assert.deepEqual(lc.raiseSpend(pool, n, 4000, false, true), { verdict: 'yes' }, `${pool}: its raise too`);
    assert.equal(lc.mayAdvance(pool), false, `${pool}: still bounded`);
    // Silent as long as a reclaim may take: taken, as when the connection is down.
    assert.deepEqual(lc.raiseSpend(pool, b, 3000, false, true, true), { verdict: 'yes' });
    // The first grant says what may be taken from then on.
    lc.applyOrgGrant(pool, 20_000, false, 4000);
    const c = lc.reserveSpend(pool)!;
    assert.deepEqual(lc.raiseSpend(pool, c, 3000, false, false), { verdict: 'yes' }, 'within the slice');
  }
  // An older control plane (no allowance with its answers): as before, once it answered.
  const { lc: old } = client(2);
  old.canSpend('key:k@0');
  old.applyOrgGrant('key:k@0', 1000, false);
  for (let i = 0; i < 3; i++) assert.deepEqual(old.raiseSpend('key:k@0', old.reserveSpend('key:k@0')!, 3000, false, true), { verdict: 'yes' });
  // An organisation's balance with no grant yet: every request out of time taken in advance, as before
  // (its first request on a connection is admitted before its first slice: docs/leases.md).
  const { lc } = client(2);
  lc.canSpend('org');
  for (let i = 0; i < 3; i++) {
    assert.equal(lc.mayAdvance('org'), true);
    assert.deepEqual(lc.raiseSpend('org', lc.reserveSpend('org', true)!, 3000, false, true), { verdict: 'yes' });
  }
});
