// Exactness across nodes: three nodes serve one key and one organisation; admitted requests per
// minute never exceed the key's rpm, spend never passes the grant by more than the requests in
// flight, and with the control plane killed and restarted mid-run the database totals equal what
// the nodes admitted.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, minuteStart, request, setClock } from '../helpers/http.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { configYaml, type GatewayYaml } from '../helpers/config.js';

after(stopAll);

function pricey(cfg: GatewayYaml): void {
  // Its answers here are 17 tokens: the ceiling prices each request near the grant (without one, a
  // request is unpriced and at the grant's last dollars one runs at a time: docs/money-limits.md).
  cfg.models.push({ id: 'demo-pricey', provider: 'demo', kind: 'chat', input_usd_per_mtok: '2000', output_usd_per_mtok: '2000', max_output_tokens: 20 });
  cfg.tiers.free.models.push('demo-pricey');
  cfg.tiers.paid.models.push('demo-pricey');
}

async function cluster(cp: ControlPlane, n: number, clockMs?: number): Promise<DataPlane[]> {
  const nodes: DataPlane[] = [];
  for (let i = 0; i < n; i++) {
    const node = await startDataPlane(cp, { nodeId: `node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    if (clockMs !== undefined) await setClock(node.adminUrl!, { now_ms: clockMs });
    nodes.push(node);
  }
  return nodes;
}

async function waitNodesConnected(cp: ControlPlane, n: number): Promise<void> {
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  try {
    for (let i = 0; i < 200; i++) {
      const { nodes } = await admin.listNodes();
      if (nodes.filter((x) => x.connected).length >= n) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error('nodes did not connect');
  } finally {
    admin.close();
  }
}

test('three nodes, one free key, traffic spread over all three: exactly 20 admitted in one minute', async () => {
  const cp = await startControlPlane();
  const clock = minuteStart() + 2_000;
  const nodes = await cluster(cp, 3, clock);
  await waitNodesConnected(cp, 3);
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const { key } = await createKey(admin, { tier: 'free' });
  admin.close();
  const statuses: number[] = [];
  let lastWave: Awaited<ReturnType<typeof request>>[] = [];
  // Waves of parallel requests, one to each node per slot, for the same clock minute.
  for (let wave = 0; wave < 10; wave++) {
    const res = await Promise.all(
      nodes.flatMap((node) =>
        [0, 1].map(() => request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`w${wave}`) })),
      ),
    );
    for (const r of res) {
      statuses.push(r.status);
      if (r.status === 429) {
        assert.equal(r.body.error.type, 'requests');
        // Refused only when the key's minute is spent across the cluster: wait for the next minute.
        assert.equal(r.headers.get('retry-after'), '58');
      } else assert.equal(r.status, 200, r.text);
    }
    lastWave = res;
  }
  // By the last wave every node knows the minute's budget is all leased: wait for the next minute.
  assert.ok(lastWave.every((r) => r.status === 429 && r.headers.get('retry-after') === '58'), lastWave.map((r) => `${r.status}/${r.headers.get('retry-after')}`).join(' '));
  const admitted = statuses.filter((s) => s === 200).length;
  assert.equal(admitted, 20, 'exactly the key\'s minute: never over, and no refusal while budget is left');
  // The next minute opens a fresh budget on every node.
  for (const node of nodes) await setClock(node.adminUrl!, { now_ms: clock + 60_000 });
  const fresh = await request(`${nodes[1].url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(fresh.status, 200, fresh.text);
});

test('three nodes spend one grant: never past it by more than the requests in flight, even across a control-plane restart', async () => {
  const cp = await startControlPlane({ configYaml: configYaml(pricey) });
  const nodes = await cluster(cp, 3);
  await waitNodesConnected(cp, 3);
  let admin = consoleClient(cp.address, cp.secrets.operatorToken);
  // Paid tier (300 rpm) so the rate limit stays out of the way; 5.00 USD of credit to spend.
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 5_000_000, note: 'budget' });
  admin.close();
  let admitted = 0;
  let admittedCost = 0;
  let maxCost = 0;
  const concurrency = 3;
  let restarted = false;
  let cpNow = cp;
  for (let wave = 0; wave < 60; wave++) {
    if (wave === 5 && !restarted) {
      // Kill the control plane mid-run and bring it back on the same address and database.
      await cpNow.proc.kill('SIGKILL');
      cpNow = await startControlPlane({ dir: cp.dir, secrets: cp.secrets, configPath: cp.configPath, listen: cp.address });
      restarted = true;
      await waitNodesConnected(cpNow, 3);
    }
    const res = await Promise.all(
      nodes.map((node, i) =>
        request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`spend ${wave} ${i}`, 'demo-pricey') }),
      ),
    );
    let refusedAll = true;
    for (const r of res) {
      if (r.status === 200) {
        refusedAll = false;
        admitted++;
        const cost = Math.ceil((r.body.usage.prompt_tokens + r.body.usage.completion_tokens) * 2000);
        admittedCost += cost;
        maxCost = Math.max(maxCost, cost);
      } else {
        assert.equal(r.status, 401, r.text);
        assert.equal(r.body.error.type, 'insufficient_quota');
      }
    }
    // All refused with less than a request's worst case left: the grant is spent.
    if (refusedAll && admittedCost >= 5_000_000 - maxCost * concurrency) break;
  }
  assert.ok(admittedCost >= 5_000_000 - maxCost * concurrency, `the grant was spent: ${admittedCost}`);
  assert.ok(admittedCost <= 5_000_000 + maxCost * concurrency, `spent ${admittedCost}: past the grant by more than ${concurrency} requests in flight`);
  // Every admitted request reaches the database exactly once.
  admin = consoleClient(cpNow.address, cpNow.secrets.operatorToken);
  let usage = await admin.getUsage({ orgId, projectId: '', month: '' });
  for (let i = 0; i < 200 && usage.totalRequests < admitted; i++) {
    await new Promise((r) => setTimeout(r, 25));
    usage = await admin.getUsage({ orgId, projectId: '', month: '' });
  }
  assert.equal(usage.totalRequests, admitted, 'requests in the database = requests the nodes admitted');
  assert.equal(usage.totalCostMicros, admittedCost, 'cost in the database = cost of what was admitted');
  admin.close();
});
