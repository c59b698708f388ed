// A money reclaim that another node does not answer in time is not a refusal. Before the fix, the
// control plane answered the asking node "exhausted" once the reclaim's 150 ms had passed, although
// the silent node still held the organisation's money unused: the node then refused requests with
// 401 insufficient_quota while money was left (seen under load in money-limits and bench:tenants).
// Here the silent node is a fake that takes all of an organisation's money and never answers a reclaim,
// so the late answer is certain, not a race.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { NodeMessage, type ControlMessage } from '../../proto/gen/tollgate/v1/sync.js';
import { configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { startFakeNode } from '../helpers/fake-node.js';
import { startGateway } from '../helpers/gateway-fixture.js';
import { bearer, chatBody, request } from '../helpers/http.js';

test('a node that does not answer a money reclaim: the other node keeps serving the organisation, never 401 while money is left', async (t) => {
  const gw = await startGateway(t, { nodes: 0, controlPlane: { configYaml: configYaml(() => {}) } });
  const { key, orgId } = await gw.fundedKey({ tier: 'paid', creditMicros: 50_000_000 });

  // The silent node connects alone, so it is given all of the organisation's money, and then never
  // answers the control plane's reclaims.
  const messages: ControlMessage[] = [];
  const silent = await startFakeNode(gw.cp, { holdAcks: false, onMessage: (m) => messages.push(m) });
  t.after(() => silent.close());
  silent.write(NodeMessage.fromPartial({ leaseRequest: { orgs: [{ orgId, micros: 1 }], leaseEpoch: 1 } }));
  await eventually(async () => messages.some((m) => m.leaseGrant?.orgs.some((o) => o.orgId === orgId && o.micros > 0)), 'the silent node holds the money');
  const held = messages.flatMap((m) => m.leaseGrant?.orgs ?? []).find((o) => o.orgId === orgId)!;
  assert.equal(held.micros, 50_000_000, 'a lone node is given all that is leasable');

  const node = await gw.addNode();
  for (let i = 0; i < 3; i++) {
    const r = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`request ${i}`) });
    assert.equal(r.status, 200, `request ${i}: ${r.status} ${r.text}`);
  }
  // The node's requests did ask for the money the silent node holds (the path under test ran).
  assert.ok(messages.some((m) => m.leaseReclaim?.orgIds.includes(orgId)), 'the control plane asked the silent node to give the money back');
});
