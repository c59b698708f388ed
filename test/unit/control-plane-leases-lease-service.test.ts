// The lease service's bulk money slices (docs/leases.md, "Standing shares"): a node asks once per
// connection for a slice of every organisation with money left, and the control plane reads that money
// with one statement however many organisations there are. Before: one statement per organisation
// (10,000 statements per connecting node with 10,000 organisations; issue 19). Statements are counted,
// not timed.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { readGatewayConfig } from '../../control-plane/config.js';
import { ControlState } from '../../control-plane/state/control-state.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { LeaseService } from '../../control-plane/leases/lease-service.js';
import type { NodeSession } from '../../control-plane/sync/node-session.js';
import { LeaseRequest, type ControlMessage } from '../../proto/gen/tollgate/v1/sync.js';
import { ROOT } from '../helpers/processes.js';

const NOW = Date.UTC(2026, 10, 26, 12, 0, 0);

/** `orgs` organisations on the free tier (a 5.00 USD grant each), and a lease service over them. */
async function setUp(t: { after(fn: () => unknown): void }, orgs: number) {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-lease-service-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  await db.tx(async (tx) => {
    const at = new Date(NOW).toISOString();
    for (let j = 0; j < orgs; j++) await tx.run('INSERT INTO orgs (id, name, tier, created_at) VALUES (?, ?, ?, ?)', [`org_${j}`, `org ${j}`, 'free', at]);
  });
  const configPath = join(ROOT, 'control-plane', 'demo-config.yaml');
  const state = await ControlState.open(db, readGatewayConfig(configPath), { configPath, now: () => NOW, log: () => {} });
  const sessions = new Set<NodeSession>();
  return { db, service: new LeaseService(state, sessions, () => {}), sessions };
}

/** A node's session as the lease service sees it: what it is sent is kept. */
function fakeSession(sessions: Set<NodeSession>, connId = 'inst#1'): { s: NodeSession; slices: Promise<ControlMessage> } {
  let answered!: (m: ControlMessage) => void;
  const slices = new Promise<ControlMessage>((resolve) => (answered = resolve));
  const enqueue = (m: ControlMessage) => {
    if (m.leaseGrant?.orgSlices) answered(m);
  };
  const s = { connId, nodeId: `node-${connId}`, closed: false, leaving: false, leaseEpoch: 0, mayHoldWhole: false, reclaims: new Map(), enqueue } as unknown as NodeSession;
  sessions.add(s);
  return { s, slices };
}

async function orgSlices(t: { after(fn: () => unknown): void }, orgs: number): Promise<{ statements: number; slices: number }> {
  const { db, service, sessions } = await setUp(t, orgs);
  const { s, slices } = fakeSession(sessions);
  const before = db.statementsIssued;
  service.onLeaseRequest(s, LeaseRequest.fromPartial({ wantOrgSlices: true, leaseEpoch: 1 }));
  const answer = await slices;
  // A share for two nodes even for a lone node: a quarter of each organisation's grant.
  for (const o of answer.leaseGrant!.orgs) assert.equal(o.micros, 1_250_000, o.orgId);
  return { statements: db.statementsIssued - before, slices: answer.leaseGrant!.orgs.length };
}

test('bulk money slices read every organisation with one statement: as many for 500 organisations as for 1', async (t) => {
  const one = await orgSlices(t, 1);
  const many = await orgSlices(t, 500);
  assert.equal(one.slices, 1);
  assert.equal(many.slices, 500);
  assert.equal(many.statements, one.statements, `1 organisation: ${one.statements} statements; 500: ${many.statements}`);
});

test('bulk money slices: a node that connects after another still gets a slice of every organisation', async (t) => {
  // Before, the first node, alone for a moment, was given everything: the next node's bulk slices were
  // empty, and each organisation's first request on it waited for a reclaim (issue 19).
  const { service, sessions } = await setUp(t, 3);
  const first = fakeSession(sessions, 'inst-a#1');
  service.onLeaseRequest(first.s, LeaseRequest.fromPartial({ wantOrgSlices: true, leaseEpoch: 1 }));
  await first.slices;
  const second = fakeSession(sessions, 'inst-b#2');
  service.onLeaseRequest(second.s, LeaseRequest.fromPartial({ wantOrgSlices: true, leaseEpoch: 1 }));
  const answer = await second.slices;
  assert.equal(answer.leaseGrant!.orgs.length, 3);
  // What the first left (3.75 USD), shared for two nodes: 0.9375 each.
  for (const o of answer.leaseGrant!.orgs) assert.equal(o.micros, 937_500, o.orgId);
});

test('a money grant tells the node what it may take in advance of a late answer: what nobody holds, shared by the connected nodes', async (t) => {
  // Before, a node took every request that waited 250 ms in advance of the answer, whatever was left
  // (docs/leases.md, "When the control plane answers late"): a $0.01 limit passed 3-5 times over.
  const { service, sessions } = await setUp(t, 1);
  const messages: ControlMessage[] = [];
  let check = (): void => {};
  const enqueue = (m: ControlMessage) => {
    messages.push(m);
    check();
  };
  const s = { connId: 'inst-a#1', nodeId: 'node-a', closed: false, leaving: false, leaseEpoch: 0, mayHoldWhole: false, reclaims: new Map(), enqueue } as unknown as NodeSession;
  sessions.add(s);
  fakeSession(sessions, 'inst-b#2');
  const next = (pred: (m: ControlMessage) => boolean) =>
    new Promise<ControlMessage>((resolve) => {
      check = () => {
        const m = messages.find(pred);
        if (m) resolve(m);
      };
      check();
    });
  service.onLeaseRequest(s, LeaseRequest.fromPartial({ wantOrgSlices: true, leaseEpoch: 1 }));
  const bulk = await next((m) => m.leaseGrant?.orgSlices === true);
  // The free tier's 5,000,000 µ$: a quarter leased (a share for two nodes), the rest halved.
  assert.deepEqual(bulk.leaseGrant!.orgs, [{ orgId: 'org_0', micros: 1_250_000, exhausted: false, advanceMicros: 1_875_000 }]);
  service.onLeaseRequest(s, LeaseRequest.fromPartial({ leaseEpoch: 1, orgs: [{ orgId: 'org_0', micros: 100_000, needMicros: 1 }] }));
  const answer = await next((m) => m.leaseGrant?.orgSlices === false && m.leaseGrant.orgs.length > 0);
  // A share of the 3,750,000 left (937,500), then half of what nobody holds after it (2,812,500).
  assert.deepEqual(answer.leaseGrant!.orgs, [{ orgId: 'org_0', micros: 937_500, exhausted: false, advanceMicros: 1_406_250 }]);
});
