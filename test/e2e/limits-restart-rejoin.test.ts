// A control plane that restarts has an empty lease ledger while the nodes still have requests in
// flight (docs/leases.md, "A control plane that restarts"). The nodes that were connected to it come
// back one by one; until each is back, or the rejoin grace passed, the control plane leases nothing
// and counts the missing ones in the roster, and each node says what it holds in its Hello. Before,
// a node back early was leased slots that a node not yet back was using (the restart test in
// limits-parallel-cluster admitted an eleventh on a loaded machine). Fake nodes play the nodes here,
// so the order in which they come back is the test's, not the scheduler's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startControlPlane, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { consoleClient } from '../helpers/console.js';
import { bearer, chatBody, minuteStart, request, setClock } from '../helpers/http.js';
import { launchGateway, type Gateway } from '../helpers/gateway-fixture.js';
import { configYaml } from '../helpers/config.js';
import { startFakeNode, type FakeNode } from '../helpers/fake-node.js';
import { eventually } from '../helpers/data-plane.js';
import type { ControlMessage, SlotLease } from '../../proto/gen/tollgate/v1/sync.js';

const LIMIT = 10;
const fleet: FakeNode[] = [];

interface RosterSeen {
  nodes: number;
  rejoining: boolean;
}

/** A fake node that keeps every roster and slot grant it is sent. */
async function node(cp: ControlPlane, nodeId: string, heldSlots: Array<{ keyId: string; held: number }> = []) {
  const rosters: RosterSeen[] = [];
  const slots: SlotLease[] = [];
  const n = await startFakeNode(cp, {
    nodeId,
    holdAcks: false,
    held: { heldSlots: heldSlots.map((h) => ({ ...h, returned: 0 })), heldKeyMinutes: [] },
    onMessage: (m: ControlMessage) => {
      if (m.roster) rosters.push({ nodes: m.roster.connectedNodes, rejoining: m.roster.rejoining === true });
      if (m.leaseGrant) slots.push(...m.leaseGrant.slots);
    },
  });
  fleet.push(n);
  return { n, rosters, slots };
}

/**
 * A gateway with a key on the paid tier (and a real node `node-r` when asked); the fake nodes
 * `fakes` connect too, then the control plane is killed and started again on its database and
 * address with `extraArgs`.
 */
async function restartUnder(t: { after(fn: () => unknown): void }, fakes: string[], extraArgs: string[], realNode = false) {
  const gw: Gateway = await launchGateway({
    controlPlane: { configYaml: configYaml((cfg) => (cfg.tiers.paid.max_parallel_requests = LIMIT)) },
    nodes: realNode ? [{ nodeId: 'node-r', adminListen: true }] : 0,
  });
  t.after(() => gw.close());
  const key = await gw.fundedKey({ tier: 'paid', creditMicros: 100_000_000 });
  const admin = gw.console;
  for (const id of fakes) await node(gw.cp, id);
  const all = fakes.length + (realNode ? 1 : 0);
  await eventually(async () => (await admin.listNodes()).nodes.filter((x) => x.connected).length === all, `${all} nodes connected`);
  await gw.cp.proc.kill('SIGKILL');
  for (const n of fleet.splice(0)) n.close();
  const cp = await startControlPlane({ dir: gw.cp.dir, secrets: gw.cp.secrets, configPath: gw.cp.configPath, listen: gw.cp.address, extraArgs });
  t.after(() => cp.proc.kill('SIGKILL'));
  t.after(() => {
    for (const n of fleet.splice(0)) n.close();
  });
  const console2 = consoleClient(cp.address, cp.secrets.operatorToken);
  t.after(() => console2.close());
  return { cp, keyId: key.keyId, key: key.key, real: gw.nodes[0], admin: console2 };
}

test('after a restart a node back early is leased nothing until the node using the other slots is back: the eleventh is refused', async (t) => {
  const { cp, keyId, admin } = await restartUnder(t, ['node-a', 'node-b', 'node-c'], ['--rejoin-grace-ms', '60000']);
  // node-c holds nothing; node-b has 5 of the key's requests in flight; node-a (5 more) is not back yet.
  const c = await node(cp, 'node-c');
  await node(cp, 'node-b', [{ keyId, held: 5 }]);
  c.n.write({ leaseRequest: { keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: 1, leaving: false, used: [], usedSeq: 0, slotWants: [{ keyId, held: 0, want: 1, need: 1 }], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: true, wantOrgSlices: false } });
  // The node not yet back counts, and every node is told the control plane waits: node-c is never
  // told it is one of two.
  await eventually(async () => c.rosters.length >= 2, 'node-c told the roster twice');
  assert.deepEqual(c.rosters, c.rosters.map(() => ({ nodes: 3, rejoining: true })), 'the roster counts the node not yet back');
  await node(cp, 'node-a', [{ keyId, held: 5 }]);
  await eventually(async () => c.slots.some((s) => s.keyId === keyId), 'node-c answered');
  assert.deepEqual(c.slots.filter((s) => s.keyId === keyId), [{ keyId, slots: 0, final: true }], 'every slot is in use on the two other nodes');
  assert.deepEqual(c.rosters.at(-1), { nodes: 3, rejoining: false }, 'the wait is over');
  assert.equal((await admin.listNodes()).nodes.filter((x) => x.connected).length, 3);
});

test('a node that does not come back within the grace no longer counts: the others are answered, and the roster drops it', async (t) => {
  const { cp, keyId } = await restartUnder(t, ['node-a', 'node-c'], ['--rejoin-grace-ms', '300']);
  // node-a never comes back. Whether node-c is back before the grace ends or after, it is answered
  // once the grace is over, and the roster it is last told counts it alone.
  const c = await node(cp, 'node-c');
  c.n.write({ leaseRequest: { keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: 1, leaving: false, used: [], usedSeq: 0, slotWants: [{ keyId, held: 0, want: 2, need: 1 }], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: false, wantOrgSlices: false } });
  await cp.proc.waitFor(/did not come back within 300 ms of the start: node-a/);
  await eventually(async () => c.slots.some((s) => s.keyId === keyId), 'node-c answered');
  assert.deepEqual(c.slots.filter((s) => s.keyId === keyId), [{ keyId, slots: 2, final: false }]);
  await eventually(async () => c.rosters.at(-1)?.rejoining === false, 'node-c told the wait is over');
  assert.deepEqual(c.rosters.at(-1), { nodes: 1, rejoining: false });
});

test('a real node back early keeps its request waiting past the lease wait while the control plane waits, and refuses it once the node holding every slot is back', async (t) => {
  // Before: the node waited its 250 ms for the slot, took one in advance (the control plane was late)
  // and admitted the eleventh while node-a, not yet back, had all ten in flight.
  const { cp, keyId, key, real, admin } = await restartUnder(t, ['node-a'], ['--rejoin-grace-ms', '60000'], true);
  // node-r knows it is back, and that the control plane waits for node-a (its admin listener says).
  const roster = async () => ((await (await fetch(`${real.adminUrl}/stats/leases`)).json()) as { roster: { connected: boolean; rejoining: boolean } }).roster;
  await eventually(async () => (await roster()).rejoining, 'node-r back and told the control plane waits', 20_000);
  assert.equal((await admin.listNodes()).nodes.find((x) => x.id === 'node-r')?.connected, true);
  const answer = request(`${real.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('hi') });
  // A second is four times the node's lease wait: the request must still be waiting.
  const early = await Promise.race([answer.then(() => 'answered'), new Promise((resolve) => setTimeout(resolve, 1000, 'waiting'))]);
  assert.equal(early, 'waiting', 'the request was answered while the control plane still waited for node-a');
  await node(cp, 'node-a', [{ keyId, held: LIMIT }]);
  const refused = await answer;
  assert.equal(refused.status, 429, refused.text);
  assert.equal(refused.body.error.type, 'max_parallel_requests');
});

test('what nodes admitted while the control plane was away is counted once they rejoined: a 5 rpm key used 4 times meanwhile gets exactly 1 more', async (t) => {
  // Before: the nodes' Hellos said nothing of requests admitted while disconnected (fail-static), so
  // the control plane that came back counted none of them and leased the key's whole minute again:
  // 3 more were admitted over the three nodes, 7 in the minute.
  const gw = await launchGateway({
    controlPlane: { configYaml: configYaml((cfg) => (cfg.tiers.tight = { ...cfg.tiers.paid, rpm: 5 })) },
    nodes: [0, 1, 2].map((i) => ({ nodeId: `node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } })),
  });
  t.after(() => gw.close());
  // One minute on every node's clock for the whole test.
  const t0 = minuteStart();
  for (const n of gw.nodes) await setClock(n.adminUrl!, { now_ms: t0 + 1000 });
  const key = await gw.fundedKey({ tier: 'tight', creditMicros: 100_000_000 });
  const roster = async (n: DataPlane) => ((await (await fetch(`${n.adminUrl}/stats/leases`)).json()) as { roster: { connected: boolean; rejoining: boolean } }).roster;
  const send = (n: DataPlane) => request(`${n.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key.key), json: chatBody('hi') });
  await gw.cp.proc.kill('SIGKILL');
  for (const n of gw.nodes) await eventually(async () => !(await roster(n)).connected, 'the node knows the control plane is gone');
  // While it is away each node counts the key's own limit: node-0 and node-1 admit 2 each.
  for (const n of [gw.nodes[0], gw.nodes[0], gw.nodes[1], gw.nodes[1]]) assert.equal((await send(n)).status, 200);
  const cp = await startControlPlane({ dir: gw.cp.dir, secrets: gw.cp.secrets, configPath: gw.cp.configPath, listen: gw.cp.address, extraArgs: ['--rejoin-grace-ms', '60000'] });
  t.after(() => cp.proc.kill('SIGKILL'));
  for (const n of gw.nodes) await eventually(async () => {
    const r = await roster(n);
    return r.connected && !r.rejoining;
  }, 'every node rejoined', 20_000);
  const statuses: number[] = [];
  for (let i = 0; i < 15; i++) statuses.push((await send(gw.nodes[2 - (i % 3)])).status);
  assert.equal(statuses.filter((s) => s === 200).length, 1, `the rest of the minute after the rejoin: ${statuses.join(',')}`);
  assert.deepEqual([...new Set(statuses)].sort(), [200, 429]);
});
