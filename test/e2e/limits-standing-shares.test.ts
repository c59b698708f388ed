// Standing shares (issue 19, docs/leases.md): with several nodes, a key's and an organisation's first
// requests on a node in a minute do not wait for the control plane, so waiting is the exception.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startControlPlane, startDataPlane, stopAll, type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, minuteStart, request, setClock, type HttpResult } from '../helpers/http.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';

after(stopAll);

const chat = (node: DataPlane, key: string, content = 'Hello'): Promise<HttpResult> =>
  request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(content) });

const standing = async (node: DataPlane) => ((await request(`${node.adminUrl}/stats/leases`)).body as { standing: { minutes: number[]; slots: boolean } }).standing;
const waits = async (node: DataPlane) => (await request(`${node.adminUrl}/stats/lease-waits?reset=1`)).body as { waited: number };

test('a key\'s first request on each of three nodes, in a new minute, does not wait even when the control plane does not answer', async () => {
  // Before: every key's first request on a node in a minute, and every organisation's first request
  // on a node, waited for a round trip to the control plane (and was refused when it took 250 ms).
  const cp = await startControlPlane();
  const clock = minuteStart() + 2_000;
  const nodes: DataPlane[] = [];
  for (let i = 0; i < 3; i++) {
    const node = await startDataPlane(cp, { nodeId: `node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    await setClock(node.adminUrl!, { now_ms: clock });
    nodes.push(node);
  }
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  await eventually(async () => (await admin.listNodes()).nodes.filter((x) => x.connected).length === 3, 'three nodes connected');
  const warm = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: warm.orgId, amountMicros: 10_000_000, note: 'test' });
  const fresh = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: fresh.orgId, amountMicros: 10_000_000, note: 'test' });
  admin.close();
  const minute = Math.floor(clock / 60_000);
  for (const n of nodes) {
    await waitUntilKnown(n.url, fresh.key);
    // Another key's request on the injected minute: the node holds that minute's shares from then on.
    assert.equal((await chat(n, warm.key)).status, 200);
    await eventually(async () => {
      const s = await standing(n);
      return s.slots && s.minutes.includes(minute);
    }, 'the node holds the minute\'s standing shares');
  }
  // Shortly before the next minute each node asks for that minute's shares.
  for (const n of nodes) await setClock(n.adminUrl!, { now_ms: clock + 56_500 });
  for (const n of nodes) await eventually(async () => (await standing(n)).minutes.includes(minute + 1), 'the next minute\'s shares');
  for (const n of nodes) {
    await setClock(n.adminUrl!, { now_ms: clock + 60_000 });
    await waits(n);
  }
  cp.proc.child.kill('SIGSTOP');
  try {
    for (const [i, n] of nodes.entries()) {
      const r = await chat(n, fresh.key, `first on node ${i}`);
      assert.equal(r.status, 200, r.text);
      assert.equal((await waits(n)).waited, 0, `node ${i}: the key's first request of the minute did not wait`);
    }
  } finally {
    cp.proc.child.kill('SIGCONT');
  }
});
