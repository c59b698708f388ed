// A key's parallel-request limit across nodes (issue 8): the limit holds for the cluster, not per node,
// and a node is refused only when every slot of the key is in use somewhere. Nodes lease slots from the
// control plane, which takes idle ones back from other nodes before it says all are in use.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { startControlPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, listenLocal, minuteStart, request, setClock, type HttpResult } from '../helpers/http.js';
import { consoleClient, type Console } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';

const LIMIT = 10;
let cp: ControlPlane;
let nodes: DataPlane[];
let admin: Console;

// An upstream that holds every chat completion until the test releases some.
const held: ServerResponse[] = [];
const upstream = createServer((req: IncomingMessage, res: ServerResponse) => {
  req.resume();
  req.on('end', () => held.push(res));
});
function release(n = held.length): void {
  for (const res of held.splice(0, n)) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'done' }, finish_reason: 'stop' }], usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 } }));
  }
}

const gw = gatewayFixture(
  async () => {
    const port = await listenLocal(upstream);
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          addUpstreamModel(cfg, 'slow-chat', `http://127.0.0.1:${port}/v1`, ['paid']);
          cfg.tiers.paid.max_parallel_requests = LIMIT;
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
      },
      nodes: 0,
    };
  },
  async (g) => {
    ({ cp, console: admin } = g);
    // One clock value for every node, read once: the nodes' key minutes are the same minute however
    // long the nodes take to start.
    const clock = minuteStart() + 5_000;
    for (let i = 0; i < 3; i++) {
      const n = await g.addNode({ nodeId: `node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
      await setClock(n.adminUrl!, { now_ms: clock });
    }
    nodes = g.nodes;
    await eventually(async () => (await admin.listNodes()).nodes.filter((x) => x.connected).length === 3, 'three nodes connected');
  },
);

after(async () => {
  release();
  admin?.close();
  upstream.close();
  // The control plane restarted by the last test is not the fixture's.
  await stopAll();
});

const slow = (node: DataPlane, key: string): Promise<HttpResult> =>
  request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('wait', 'slow-chat') });

async function heldAtUpstream(n: number): Promise<void> {
  await eventually(async () => held.length === n, `${n} requests held at the upstream`);
}

async function paidKey(): Promise<string> {
  return (await gw.fundedKey({ tier: 'paid', creditMicros: 100_000_000 })).key;
}

test('the parallel limit holds across three nodes: 6 + 4 in flight, the eleventh is refused on the third node', async () => {
  const key = await paidKey();
  const inflight: Promise<HttpResult>[] = [];
  for (let i = 0; i < 6; i++) inflight.push(slow(nodes[0], key));
  await heldAtUpstream(6);
  for (let i = 0; i < 4; i++) inflight.push(slow(nodes[1], key));
  await heldAtUpstream(10);
  // Before: each node counted only its own requests in flight and admitted up to 10 each.
  const refused = await slow(nodes[2], key);
  assert.equal(refused.status, 429, refused.text);
  assert.equal(refused.body.error.type, 'max_parallel_requests');
  assert.equal(refused.body.error.code, '429');
  assert.match(refused.body.error.message, new RegExp(`max parallel requests: ${LIMIT}/${LIMIT}`));
  assert.equal(refused.headers.get('retry-after'), '55', 'a gateway 429 counts to the top of the next clock minute');
  // One request ends on the first node: its slot serves the third node (taken back from the first).
  release(1);
  await eventually(async () => held.length === 9, 'one released');
  const third = slow(nodes[2], key);
  await heldAtUpstream(10);
  release();
  const done = await Promise.all([...inflight, third]);
  assert.ok(done.every((r) => r.status === 200), done.map((r) => r.status).join(','));
});

test('no false refusal: all ten slots can be used on one node after the others used the key', async () => {
  const key = await paidKey();
  // Every node uses the key once, so each holds some of its slots.
  for (const n of nodes) {
    const r = slow(n, key);
    await heldAtUpstream(1);
    release();
    assert.equal((await r).status, 200);
  }
  const inflight = Array.from({ length: LIMIT }, () => slow(nodes[1], key));
  await heldAtUpstream(LIMIT);
  const extra = await slow(nodes[1], key);
  assert.equal(extra.status, 429, 'the eleventh is refused');
  assert.equal(extra.body.error.type, 'max_parallel_requests');
  release();
  const done = await Promise.all(inflight);
  assert.ok(done.every((r) => r.status === 200), done.map((r) => r.status).join(','));
});

test('after a control-plane restart the slots in use on every node still count: the eleventh is refused', async () => {
  const key = await paidKey();
  const inflight: Promise<HttpResult>[] = [];
  for (let i = 0; i < 5; i++) inflight.push(slow(nodes[0], key));
  await heldAtUpstream(5);
  for (let i = 0; i < 5; i++) inflight.push(slow(nodes[2], key));
  await heldAtUpstream(10);
  // Kill the control plane and bring it back on the same address and database: its ledger is empty.
  // Whichever node reconnects first is asked what it holds when the next joins; before, the other's
  // 5 slots in use were counted nowhere (it had no reason to ask) and the key got 15 in flight.
  await cp.proc.kill('SIGKILL');
  admin.close();
  cp = await startControlPlane({ dir: cp.dir, secrets: cp.secrets, configPath: cp.configPath, listen: cp.address, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } });
  admin = consoleClient(cp.address, cp.secrets.operatorToken);
  await eventually(async () => (await admin.listNodes()).nodes.filter((x) => x.connected).length === 3, 'three nodes reconnected', 20_000);
  const extra = slow(nodes[1], key);
  // `decided` ends the other wait: left polling, it held this file's process open for its 10 s.
  let decided = false;
  const outcome = await Promise.race([extra, eventually(async () => decided || held.length > LIMIT, 'an eleventh at the upstream').then(() => (decided ? 'refused' : 'admitted') as 'admitted' | 'refused')]);
  decided = true;
  assert.notEqual(outcome, 'admitted', 'an eleventh request was admitted across the cluster');
  const refused = outcome as HttpResult;
  assert.equal(refused.status, 429, refused.text);
  assert.equal(refused.body.error.type, 'max_parallel_requests');
  release();
  const done = await Promise.all(inflight);
  assert.ok(done.every((r) => r.status === 200), done.map((r) => r.status).join(','));
});
