// A control plane that restarts has an empty lease ledger while the nodes still have requests in
// flight (docs/leases.md, "A control plane that restarts"). The nodes that were connected to it come
// back one by one; until each is back, or the rejoin grace passed, the control plane leases nothing
// and counts the missing ones in the roster, and each node says what it holds in its Hello. Before,
// a node back early was leased slots that a node not yet back was using (the restart test in
// limits-parallel-cluster admitted an eleventh on a loaded machine). Fake nodes play the nodes here,
// so the order in which they come back is the test's, not the scheduler's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startControlPlane, type ControlPlane } from '../helpers/processes.js';
import { consoleClient } from '../helpers/console.js';
import { launchGateway, type Gateway } from '../helpers/gateway-fixture.js';
import { configYaml } from '../helpers/config.js';
import { startFakeNode, type FakeNode } from '../helpers/fake-node.js';
import { eventually } from '../helpers/data-plane.js';
import type { ControlMessage, SlotLease } from '../../proto/gen/tollgate/v1/sync.js';

const LIMIT = 10;
const fleet: FakeNode[] = [];


/** A fake node that keeps every roster and slot grant it is sent. */
async function node(cp: ControlPlane, nodeId: string, heldSlots: Array<{ keyId: string; held: number }> = []) {
  const rosters: number[] = [];
  const slots: SlotLease[] = [];
  const n = await startFakeNode(cp, {
    nodeId,
    holdAcks: false,
    held: { heldSlots: heldSlots.map((h) => ({ ...h, returned: 0 })), heldKeyMinutes: [] },
    onMessage: (m: ControlMessage) => {
      if (m.roster) rosters.push(m.roster.connectedNodes);
      if (m.leaseGrant) slots.push(...m.leaseGrant.slots);
    },
  });
  fleet.push(n);
  return { n, rosters, slots };
}

/**
 * A gateway with a key on the paid tier; three nodes connect, then the control plane is killed and
 * started again on its database with `extraArgs`.
 */
async function restartUnderThreeNodes(t: { after(fn: () => unknown): void }, extraArgs: string[]): Promise<{ cp: ControlPlane; keyId: string }> {
  const gw: Gateway = await launchGateway({ controlPlane: { configYaml: configYaml((cfg) => (cfg.tiers.paid.max_parallel_requests = LIMIT)) }, nodes: 0 });
  t.after(() => gw.close());
  const { keyId } = await gw.fundedKey({ tier: 'paid', creditMicros: 100_000_000 });
  const admin = gw.console;
  for (const id of ['node-a', 'node-b', 'node-c']) await node(gw.cp, id);
  await eventually(async () => (await admin.listNodes()).nodes.filter((x) => x.connected).length === 3, 'three nodes connected');
  await gw.cp.proc.kill('SIGKILL');
  for (const n of fleet.splice(0)) n.close();
  const cp = await startControlPlane({ dir: gw.cp.dir, secrets: gw.cp.secrets, configPath: gw.cp.configPath, extraArgs });
  t.after(() => cp.proc.kill('SIGKILL'));
  t.after(() => {
    for (const n of fleet.splice(0)) n.close();
  });
  return { cp, keyId };
}

test('after a restart a node back early is leased nothing until the node using the other slots is back: the eleventh is refused', async (t) => {
  const { cp, keyId } = await restartUnderThreeNodes(t, ['--rejoin-grace-ms', '60000']);
  // node-c holds nothing; node-b has 5 of the key's requests in flight; node-a (5 more) is not back yet.
  const c = await node(cp, 'node-c');
  await node(cp, 'node-b', [{ keyId: keyId, held: 5 }]);
  c.n.write({ leaseRequest: { keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: 1, leaving: false, used: [], usedSeq: 0, slotWants: [{ keyId: keyId, held: 0, want: 1, need: 1 }], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: true, wantOrgSlices: false } });
  // The node not yet back counts: node-c is never told it is one of two.
  await eventually(async () => c.rosters.length >= 2, 'node-c told the roster twice');
  assert.deepEqual([...new Set(c.rosters)], [3], 'the roster counts the node not yet back');
  await node(cp, 'node-a', [{ keyId: keyId, held: 5 }]);
  await eventually(async () => c.slots.some((s) => s.keyId === keyId), 'node-c answered');
  assert.deepEqual(c.slots.filter((s) => s.keyId === keyId), [{ keyId: keyId, slots: 0, final: true }], 'every slot is in use on the two other nodes');
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  t.after(() => admin.close());
  assert.equal((await admin.listNodes()).nodes.filter((x) => x.connected).length, 3);
});

test('a node that does not come back within the grace no longer counts: the others are leased its share', async (t) => {
  const { cp, keyId } = await restartUnderThreeNodes(t, ['--rejoin-grace-ms', '300']);
  const c = await node(cp, 'node-c');
  await node(cp, 'node-b', [{ keyId: keyId, held: 5 }]);
  c.n.write({ leaseRequest: { keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: 1, leaving: false, used: [], usedSeq: 0, slotWants: [{ keyId: keyId, held: 0, want: 2, need: 1 }], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: false, wantOrgSlices: false } });
  // node-a never comes back: after the grace the roster says two, and node-c gets the slots it asked for.
  await eventually(async () => c.rosters.at(-1) === 2, 'the roster without node-a');
  await eventually(async () => c.slots.some((s) => s.keyId === keyId), 'node-c answered');
  assert.deepEqual(c.slots.filter((s) => s.keyId === keyId), [{ keyId: keyId, slots: 2, final: false }]);
  await cp.proc.waitFor(/sync: 1 node did not come back within 300 ms of the start: node-a/);
});
