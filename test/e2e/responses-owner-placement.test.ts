// Owner records placed by traffic (issue 34, deliverable 3): a node holds the owner records of the
// projects it serves, not every project's. Before, the control plane sent every project's records to
// every node, so each node's memory (and a node's catch-up on connect) grew with every project's
// stored responses, whoever it served. Now a node asks the control plane for a project's records the
// first time a request of it misses one (waiting for them, bounded), and is sent that project's new
// records from then on; a foreign id still answers 404, after the asking project's records arrived.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import type { DemoKey } from '../helpers/console.js';
import { eventually } from '../helpers/data-plane.js';
import { startFakeResponsesUpstream, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { assertShapeA, gatewayFixture } from '../helpers/gateway-fixture.js';
import { bearer, request } from '../helpers/http.js';
import type { DataPlane } from '../helpers/processes.js';
import { scrapeMetrics } from '../helpers/prometheus.js';

let upstream: FakeResponsesUpstream;
let n1: DataPlane;
let n2: DataPlane;
after(() => upstream?.close());

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    return {
      controlPlane: { configYaml: configYaml((cfg) => addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid'])), env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' } },
      nodes: 2,
      node: { adminListen: true, extraArgs: ['--report-every-ms', '0'] },
    };
  },
  (g) => {
    [n1, n2] = g.nodes;
  },
);

const create = async (node: DataPlane, k: DemoKey): Promise<string> => {
  const r = await request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: 'Hello' } });
  assert.equal(r.status, 200, r.text);
  return r.body.id as string;
};
const read = (node: DataPlane, k: DemoKey, id: string) => request(`${node.url}/v1/responses/${id}`, { headers: bearer(k.key) });

async function held(node: DataPlane): Promise<[number, number]> {
  const m = await scrapeMetrics(`${node.adminUrl}/metrics`);
  return [m.value('tollgate_node_owner_records') ?? -1, m.value('tollgate_node_owner_record_projects') ?? -1];
}

test("a node holds the owner records of the projects it serves only; a project's come when one of its requests first needs them", async () => {
  const p = await gw.fundedKey();
  const q = await gw.fundedKey();
  // P's first response, on node 1. Node 2 has not served P: its first read there asks for P's records
  // and waits for them (within the fan-out window after a create, a read elsewhere may still miss).
  const r1 = await create(n1, p);
  await eventually(async () => (await read(n2, p, r1)).status === 200, `${r1} readable on node 2`);
  // Q works on node 1 only: three responses (each a record, and one for its output item).
  for (let i = 0; i < 3; i++) await create(n1, q);
  // P's next response, made after Q's: it reaches node 2 (which serves P now) after Q's would have.
  const r5 = await create(n1, p);
  await eventually(async () => (await read(n2, p, r5)).status === 200, `${r5} known on node 2`);
  // Node 2 holds P's two responses and their two items, none of Q's six records.
  assert.deepEqual(await held(n2), [4, 1]);
  // Node 1, which served both, holds both.
  assert.deepEqual(await held(n1), [10, 2]);
});

test("a foreign id is still a 404 on a node that did not hold the asking project's records", async () => {
  const p = await gw.fundedKey();
  const q = await gw.fundedKey();
  const mine = await create(n1, p);
  const before = upstream.requests.length;
  // Q on node 2 for the first time: its records are asked for and waited for, then P's id is not Q's.
  const foreign = await read(n2, q, mine);
  assertShapeA(foreign, 404, { type: 'invalid_request_error', param: null, message: new RegExp(`No response found with id '${mine}'`) });
  const chained = await request(`${n2.url}/v1/responses`, { method: 'POST', headers: bearer(q.key), json: { model: 'up-chat', input: 'More', previous_response_id: mine } });
  assertShapeA(chained, 404, { param: 'previous_response_id' });
  assert.equal(upstream.requests.length, before, 'the upstream was never asked');
});
