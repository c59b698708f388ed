// What a node admitted of a key minute while its control plane was away (fail-static, docs/leases.md)
// is said in its Hello and on the new connection, so a control plane that took over (a failover, a
// restart) counts it before it leases the rest of the minute to anyone (issue 35, deliverable 4).
// Before, the node's key minutes ignored what was admitted while disconnected: a key of 5 rpm that
// two nodes used 2 each while the leader was gone had 3 more admitted after the rejoin, not 1.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KeyLeaseLedger } from '../../control-plane/leases/key-lease-ledger.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets } from '../../data-plane/limits/key-budgets.js';

const MINUTE = 100;
// No parallel limit: slots are not what this file is about.
const limits = { keyId: 'k', rpmLimit: 5, tpmLimit: 60_000, maxParallel: 0 };
const pool = { rpm: 5, tpm: 60_000 };

function node() {
  const clock = new ManualClock(60_000 * MINUTE + 2_000);
  const sent: LeaseRequestOut[] = [];
  const lc = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  lc.setConnected(true, 3);
  return { lc, sent, budgets: new KeyBudgets(clock, { allowance: lc }) };
}

/** Admits one request of the key, granting what the node asks for from `ledger` as connection `conn`. */
function admitLeased(n: ReturnType<typeof node>, ledger: KeyLeaseLedger, conn: string): boolean {
  for (let i = 0; i < 3; i++) {
    const a = n.budgets.admit(limits, 10);
    if (a.ok) return true;
    if (!a.leaseShort) return false;
    if (!n.lc.waitForKey('k', MINUTE, limits, a.leaseShort.requests, a.leaseShort.tokens, () => undefined)) return false;
    deliver(n, ledger, conn);
  }
  return false;
}

/** What the control plane does with what the node sent (lease-service.ts onLeaseRequest's order), grants included. */
function deliver(n: ReturnType<typeof node>, ledger: KeyLeaseLedger, conn: string): void {
  for (const req of n.sent.splice(0)) {
    for (const r of req.keyReturns) ledger.applyReturn(conn, r);
    for (const u of req.used) ledger.recordUsed(conn, u);
    for (const t of req.taken) ledger.applyTaken(conn, t);
    for (const w of req.keys) {
      const g = ledger.grant(conn, w, pool, [], true);
      if (g.kind === 'grant') n.lc.applyKeyGrant({ keyId: w.keyId, minute: w.minute, ...g.grant });
    }
  }
}

/** The connection ends: what was sent on it went to the old control plane. */
function away(n: ReturnType<typeof node>): void {
  n.lc.setConnected(false);
  n.sent.length = 0;
}

/** The new control plane registers the Hello's key minutes as sync-service.ts hello() does. */
function hello(n: ReturnType<typeof node>, ledger: KeyLeaseLedger, conn: string): void {
  for (const r of n.lc.held().heldKeyMinutes) ledger.applyReturn(conn, r);
}

test('requests admitted while the control plane is away are in the Hello, for a key touched before and for one first used then', () => {
  const n = node();
  const old = new KeyLeaseLedger();
  assert.equal(admitLeased(n, old, 'a#1'), true);
  away(n);
  // Fail-static: the key's own limit counted here.
  for (let i = 0; i < 2; i++) assert.equal(n.budgets.admit(limits, 10).ok, true);
  const fresh = { ...limits, keyId: 'f' };
  for (let i = 0; i < 2; i++) assert.equal(n.budgets.admit(fresh, 10).ok, true);
  const said = Object.fromEntries(n.lc.held().heldKeyMinutes.map((h) => [h.keyId, [h.minute, h.heldRequests, h.heldTokens]]));
  assert.deepEqual(said, { k: [MINUTE, 3, 30], f: [MINUTE, 2, 20] });
});

test('a control plane that took over counts what each node admitted while it was away, and leases only the rest of the minute', () => {
  const a = node();
  const b = node();
  const c = node();
  const old = new KeyLeaseLedger();
  // One request on a while the old leader leads.
  assert.equal(admitLeased(a, old, 'a#1'), true);
  for (const n of [a, b, c]) away(n);
  // While no control plane leads: a admits 1 more, b 2 (each within the key's own limit).
  assert.equal(a.budgets.admit(limits, 10).ok, true);
  for (let i = 0; i < 2; i++) assert.equal(b.budgets.admit(limits, 10).ok, true);
  // The new leader: every node's Hello, then the stream accepted. b admits one more between its Hello
  // and the acceptance of its stream (still disconnected).
  const ledger = new KeyLeaseLedger();
  hello(a, ledger, 'a#2');
  hello(b, ledger, 'b#2');
  hello(c, ledger, 'c#2');
  assert.equal(b.budgets.admit(limits, 10).ok, true);
  for (const [n, conn] of [[a, 'a#2'], [b, 'b#2'], [c, 'c#2']] as const) {
    n.lc.setConnected(true, 3);
    deliver(n, ledger, conn);
  }
  // 5 admitted: nothing is left of the minute, and nothing was counted twice.
  assert.equal(ledger.freeOf('k', MINUTE, pool).requests, 0, 'the new leader counts all five');
  assert.equal(admitLeased(c, ledger, 'c#2'), false, 'c is refused: the minute is spent across the cluster');
  assert.equal(admitLeased(a, ledger, 'a#2'), false);
});

test('what a node admitted while away is counted once: a node that used 2 of 5 then is leased exactly 3 more', () => {
  const n = node();
  away(n);
  for (let i = 0; i < 2; i++) assert.equal(n.budgets.admit(limits, 10).ok, true);
  const ledger = new KeyLeaseLedger();
  hello(n, ledger, 'n#2');
  n.lc.setConnected(true, 3);
  deliver(n, ledger, 'n#2');
  let admitted = 0;
  for (let i = 0; i < 5; i++) if (admitLeased(n, ledger, 'n#2')) admitted++;
  assert.equal(admitted, 3);
  assert.equal(ledger.heldBy('n#2', 'k', MINUTE)?.requests, 5, 'the ledger and the node agree');
});
