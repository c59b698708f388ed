// Admission in advance of a late lease answer (issue 19, docs/leases.md): the node and the control
// plane's ledgers agree on what the node holds, whatever order the answer and the node's word arrive in.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KeyLeaseLedger } from '../../control-plane/leases/key-lease-ledger.js';
import { SlotLedger } from '../../control-plane/leases/slot-ledger.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets, type Admission } from '../../data-plane/limits/key-budgets.js';

const limits = { keyId: 'k', rpmLimit: 20, tpmLimit: 60_000, maxParallel: 100 };
const pool = { rpm: 20, tpm: 60_000 };

function node(nodes = 2) {
  const clock = new ManualClock(60_000 * 100 + 2_000);
  const sent: LeaseRequestOut[] = [];
  const lc = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  lc.setConnected(true, nodes);
  return { lc, sent, budgets: new KeyBudgets(clock, { allowance: lc }) };
}

/** What admission.ts does: admit; when short, take in advance (`timedOut`: the wait ran out). */
function admit(n: ReturnType<typeof node>, timedOut: boolean): Admission {
  let a = n.budgets.admit(limits, 10);
  for (let i = 0; i < 3 && !a.ok && a.leaseShort; i++) {
    const s = a.leaseShort;
    const took = s.slot ? n.lc.advanceSlot('k', limits, timedOut) : n.lc.advanceKey('k', 100, limits, s.requests, s.tokens, timedOut);
    if (!took) break;
    a = n.budgets.admit(limits, 10);
  }
  return a;
}

/** Delivers what the node sent to the ledgers, in order, as connection `conn`; returns the grants. */
function deliver(sent: LeaseRequestOut[], keys: KeyLeaseLedger, slots: SlotLedger, conn = 'a#1') {
  const grants = [];
  for (const req of sent.splice(0)) {
    for (const r of req.keyReturns) keys.applyReturn(conn, r);
    for (const u of req.used) keys.recordUsed(conn, u);
    for (const t of req.taken) keys.applyTaken(conn, t);
    for (const r of req.slotReturns) slots.applyHeld(conn, r);
    for (const w of req.keys) {
      const g = keys.grant(conn, w, pool);
      assert.equal(g.kind, 'grant');
      if (g.kind === 'grant') grants.push({ keyId: w.keyId, minute: w.minute, ...g.grant });
    }
  }
  return grants;
}

test('no answer within the bound: the request is admitted in advance, not refused; later ones of the key minute do not wait', () => {
  const n = node();
  const first = n.budgets.admit(limits, 10);
  assert.equal(first.ok, false);
  assert.deepEqual((first as Extract<Admission, { ok: false }>).leaseShort, { requests: 1, tokens: 10 });
  // Before the bound runs out the node waits (nothing is taken).
  assert.equal(n.lc.advanceKey('k', 100, limits, 1, 10, false), false);
  assert.equal(n.lc.waitForKey('k', 100, limits, 1, 10, () => undefined), true);
  // Out of time: admitted in advance.
  assert.equal(admit(n, true).ok, true);
  // Until the answer comes the next requests do not wait for it.
  assert.equal(n.lc.waitForKey('k', 100, limits, 1, 10, () => undefined), false);
  for (let i = 0; i < 4; i++) assert.equal(admit(n, false).ok, true, `request ${i + 2}`);
  const taken = n.sent.flatMap((r) => r.taken);
  assert.equal(taken.reduce((s, t) => s + t.requests, 0), 5, 'the control plane is told all five');
});

test('the node and the ledger agree on what the node holds whether the late grant or the node\'s word comes first', () => {
  for (const grantFirst of [true, false]) {
    const n = node();
    const keys = new KeyLeaseLedger();
    const slots = new SlotLedger();
    n.budgets.admit(limits, 10);
    // The want (the prefetch of the first touch) reaches the control plane before anything else.
    const wantOnly = n.sent.splice(0);
    for (let i = 0; i < 8; i++) assert.equal(admit(n, i === 0).ok, true);
    let grants;
    if (grantFirst) {
      grants = deliver(wantOnly, keys, slots);
      for (const g of grants) n.lc.applyKeyGrant(g);
      deliver(n.sent, keys, slots);
    } else {
      const later = n.sent.splice(0);
      grants = deliver([...wantOnly, ...later], keys, slots);
      for (const g of grants) n.lc.applyKeyGrant(g);
    }
    deliver(n.sent, keys, slots);
    const a = n.lc.allowanceFor('k', 100, limits);
    assert.equal(keys.heldBy('a#1', 'k', 100)!.requests, a.requests, `grant first: ${grantFirst}`);
    assert.ok(a.requests >= 8);
    assert.equal(slots.heldBy('a#1', 'k') >= 1, true, 'the slot taken in advance is counted');
  }
});

test('a key minute the control plane said is spent is not taken in advance', () => {
  const n = node();
  n.budgets.admit(limits, 10);
  n.lc.applyKeyGrant({ keyId: 'k', minute: 100, requests: 0, tokens: 0, finalRequests: true, finalTokens: false, freeRequests: 0, freeTokens: 0 });
  assert.equal(n.lc.advanceKey('k', 100, limits, 1, 0, true), false);
});

test('key ledger: what a node took in advance counts as held by it; a slot taken in advance raises its count', () => {
  const keys = new KeyLeaseLedger();
  keys.grant('b#1', { keyId: 'k', minute: 5, heldRequests: 0, heldTokens: 0, requests: 15, tokens: 0, needRequests: 0, needTokens: 0 }, pool);
  keys.applyTaken('a#1', { keyId: 'k', minute: 5, requests: 7, tokens: 100 });
  assert.deepEqual(keys.freeOf('k', 5, pool), { requests: 0, tokens: 59_900 }, 'past the limit by 2: nothing free');
  const slots = new SlotLedger();
  slots.grant('a#1', { keyId: 'k', held: 0, want: 2, need: 2 }, 10);
  slots.applyHeld('a#1', { keyId: 'k', held: 2, returned: -1 });
  assert.equal(slots.heldBy('a#1', 'k'), 3);
});
