// Standing shares (issue 19, docs/leases.md): with several nodes each node holds a share of every
// key's minute budget and parallel slots, granted in bulk, so a key's first requests on a node do not
// wait for the control plane; the control plane counts the shares and takes unused ones back before it
// says a key is spent. A small in-memory cluster: the ledgers and three lease clients, with the
// messages delivered in order as the sync stream does.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KeyLeaseLedger } from '../../control-plane/leases/key-lease-ledger.js';
import { SlotLedger } from '../../control-plane/leases/slot-ledger.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock, minuteOf } from '../../data-plane/limits/clock.js';
import { KeyBudgets, type KeyLimits } from '../../data-plane/limits/key-budgets.js';
import { standingShare } from '../../proto/lib/leases.js';

const paid: KeyLimits = { keyId: 'k', rpmLimit: 300, tpmLimit: 1_000_000, maxParallel: 100 };

class Cluster {
  readonly clock = new ManualClock(60_000 * 100 + 1_000);
  readonly keys: KeyLeaseLedger;
  readonly slots: SlotLedger;
  readonly nodes: Array<{ id: string; lc: LeaseClient; budgets: KeyBudgets; out: LeaseRequestOut[] }> = [];
  /** Key wants answered (each one a round trip a request may have waited for). */
  wants = 0;

  constructor(
    n: number,
    readonly limits: KeyLimits[],
  ) {
    const byId = new Map(limits.map((l) => [l.keyId, l]));
    this.keys = new KeyLeaseLedger((id) => byId.get(id) && { rpm: byId.get(id)!.rpmLimit, tpm: byId.get(id)!.tpmLimit });
    this.slots = new SlotLedger((id) => byId.get(id)?.maxParallel);
    for (let i = 0; i < n; i++) {
      const out: LeaseRequestOut[] = [];
      const lc = new LeaseClient(this.clock, (r) => (out.push(r), true), (fn) => fn(), true);
      this.nodes.push({ id: `n${i}#${i}`, lc, budgets: new KeyBudgets(this.clock, { allowance: lc }), out });
    }
    for (const x of this.nodes) x.lc.setConnected(true, n);
    this.settle();
  }

  /** Delivers every message until nothing is left (a reclaim is answered before its grant goes on). */
  settle(): void {
    for (let round = 0; round < 100; round++) {
      let any = false;
      for (const x of this.nodes) {
        for (const req of x.out.splice(0)) {
          any = true;
          this.onRequest(x, req);
        }
      }
      if (!any) return;
    }
    throw new Error('messages did not settle');
  }

  private onRequest(x: Cluster['nodes'][number], req: LeaseRequestOut): void {
    for (const r of req.keyReturns) this.keys.applyReturn(x.id, r);
    for (const u of req.used) this.keys.recordUsed(x.id, u);
    for (const t of req.taken) this.keys.applyTaken(x.id, t);
    for (const r of req.slotReturns) this.slots.applyHeld(x.id, r);
    if (req.bulkMinute) {
      const ex = this.keys.grantBulk(x.id, req.bulkMinute, this.nodes.length);
      x.lc.applyBulk({ minute: req.bulkMinute, granted: ex !== null, nodes: this.nodes.length, exceptions: ex ?? [] });
    }
    if (req.wantSlotShare) {
      const ex = this.slots.grantShare(x.id, this.nodes.length);
      x.lc.applySlotShare({ granted: ex !== null, nodes: this.nodes.length, exceptions: ex ?? [] });
    }
    for (const w of req.keys) {
      this.wants++;
      const l = this.limits.find((k) => k.keyId === w.keyId)!;
      const lim = { rpm: l.rpmLimit, tpm: l.tpmLimit };
      let g = this.keys.grant(x.id, w, lim);
      if (g.kind === 'reclaim') {
        for (const c of g.from) this.reclaim(c, { keys: [{ keyId: w.keyId, minute: w.minute }], slotKeyIds: [] });
        g = this.keys.grant(x.id, w, lim, [], true);
      }
      assert.equal(g.kind, 'grant');
      if (g.kind === 'grant') x.lc.applyKeyGrant({ keyId: w.keyId, minute: w.minute, ...g.grant });
    }
    for (const w of req.slotWants) {
      const l = this.limits.find((k) => k.keyId === w.keyId)!;
      let g = this.slots.grant(x.id, w, l.maxParallel);
      if (g.kind === 'reclaim') {
        for (const c of g.from) this.reclaim(c, { keys: [], slotKeyIds: [w.keyId] });
        g = this.slots.grant(x.id, w, l.maxParallel, [], true);
      }
      if (g.kind === 'grant') x.lc.applySlotGrant({ keyId: w.keyId, slots: g.slots, final: g.final });
    }
  }

  private reclaim(connId: string, what: { keys: Array<{ keyId: string; minute: number }>; slotKeyIds: string[] }): void {
    const target = this.nodes.find((x) => x.id === connId)!;
    target.lc.onReclaim({ id: 1, keys: what.keys, allKeys: false, orgIds: [], slotKeyIds: what.slotKeyIds });
    // The answer is the last message the target sent.
    const answer = target.out.pop()!;
    for (const r of answer.keyReturns) this.keys.applyReturn(connId, r);
    for (const r of answer.slotReturns) this.slots.applyHeld(connId, r);
  }

  /**
   * One request of `limits` on node i, as admission.ts does it: admitted at once, or after waiting
   * for answers (counted), or refused. Ends at once (its slot is free again).
   */
  request(i: number, limits: KeyLimits): { ok: boolean; waited: boolean } {
    const x = this.nodes[i];
    let waited = false;
    for (let attempt = 0; attempt < 5; attempt++) {
      const a = x.budgets.admit(limits, 10);
      if (a.ok) {
        a.ticket.settle(10);
        this.settle();
        return { ok: true, waited };
      }
      if (!a.leaseShort) return { ok: false, waited };
      const s = a.leaseShort;
      const parked = s.slot ? x.lc.waitForSlot(limits.keyId, limits, () => undefined) : x.lc.waitForKey(limits.keyId, minuteOf(this.clock.now()), limits, s.requests, s.tokens, () => undefined);
      if (!parked) return { ok: false, waited };
      waited = true;
      this.settle();
    }
    return { ok: false, waited };
  }
}

test('standing shares: a key\'s first request of a minute on each of three nodes does not wait, and nothing is asked per key', () => {
  // Before: every key's first request on each node in each minute waited for a lease round trip.
  const keys = Array.from({ length: 50 }, (_, i) => ({ ...paid, keyId: `k${i}` }));
  const c = new Cluster(3, keys);
  for (const k of keys) {
    for (let i = 0; i < 3; i++) {
      const r = c.request(i, k);
      assert.deepEqual(r, { ok: true, waited: false }, `${k.keyId} on node ${i}`);
    }
  }
  assert.equal(c.wants, 0, 'no key want: the shares cover a key\'s first requests');
  assert.equal(standingShare(300, 3), 25);
});

test('standing shares: sticky 90/10/0 traffic admits exactly the 300 requests of a 300 rpm key, then every node refuses', () => {
  const c = new Cluster(3, [paid]);
  let admitted = 0;
  for (let i = 0; i < 300; i++) if (c.request(i % 10 === 9 ? 1 : 0, paid).ok) admitted++;
  assert.equal(admitted, 300, 'the shares of the idle nodes are taken back before anyone is refused');
  for (let i = 0; i < 3; i++) assert.equal(c.request(i, paid).ok, false, `node ${i} refuses the 301st`);
});

test('standing shares: a flood over three nodes admits exactly the key\'s minute', () => {
  const c = new Cluster(3, [paid]);
  let admitted = 0;
  for (let i = 0; i < 1000; i++) if (c.request(i % 3, paid).ok) admitted++;
  assert.equal(admitted, 300);
});

test('standing shares: a node that stops frees its untouched shares; a share given back by a reclaim is never used', () => {
  const free = { ...paid, keyId: 'f', rpmLimit: 20, tpmLimit: 60_000, maxParallel: 10 };
  const c = new Cluster(2, [free]);
  // Node 1 never sees the key; node 0 uses all 20: node 1's share (2) is taken back on the way.
  let admitted = 0;
  for (let i = 0; i < 25; i++) if (c.request(0, free).ok) admitted++;
  assert.equal(admitted, 20);
  assert.equal(c.request(1, free).ok, false, 'node 1 gave its share back: refused, the minute is spent');
  // Shortly before the next minute every node asks for that minute's shares: node 1 holds one again.
  c.clock.advance(58_000);
  for (const x of c.nodes) x.lc.prefetchNextMinute();
  c.settle();
  c.clock.advance(2_000);
  assert.deepEqual(c.request(1, free), { ok: true, waited: false });
  // Node 0 stops: it says what it used of what it touched; its untouched share of the minute is free.
  c.nodes[0].lc.giveBackAll();
  const leaving = c.nodes[0].out.splice(0);
  for (const req of leaving) {
    for (const r of req.keyReturns) c.keys.applyReturn(c.nodes[0].id, r);
    if (req.leaving) c.keys.leave(c.nodes[0].id);
  }
  c.keys.release(c.nodes[0].id);
  let rest = 1;
  for (let i = 0; i < 25; i++) if (c.request(1, free).ok) rest++;
  assert.equal(rest, 20, 'node 1 serves the whole minute');
});
