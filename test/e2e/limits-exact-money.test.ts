// Money across nodes, exact both ways (issue 8; docs/design.md#money-and-limits-across-nodes): a 401
// insufficient_quota only when the organisation has no money left under its balance and cap; a node
// that joins, a credit or a cap change takes effect on every node within a second; spend passes a cap
// by at most the cost of the requests in flight.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { startDataPlane, stopAll, runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { launchGateway } from '../helpers/gateway-fixture.js';
import { bearer, chatBody, request, type HttpResult } from '../helpers/http.js';
import { createKey, type Console } from '../helpers/console.js';
import { configYaml, type GatewayYaml } from '../helpers/config.js';
import { allNodesCurrent, chat, costOf, pricey } from '../helpers/priced-demo.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';

after(stopAll);


/** A control plane and `n` nodes started one after another (stopped by stopAll after the file). */
async function cluster(n: number): Promise<{ cp: ControlPlane; nodes: DataPlane[]; admin: Console }> {
  const gw = await launchGateway({ controlPlane: { configYaml: configYaml(pricey) }, nodes: 0 });
  for (let i = 0; i < n; i++) await gw.addNode({ nodeId: `node-${i}` });
  return { cp: gw.cp, nodes: gw.nodes, admin: gw.console };
}

test('a node started after a lone node leased the organisation\'s whole money slice serves the organisation', async () => {
  // Before: the joining node answered 401 insufficient_quota: the lone node held all that was leasable.
  const { cp, nodes, admin } = await cluster(1);
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 50_000_000, note: 'budget' });
  await allNodesCurrent(admin, 1);
  assert.equal((await chat(nodes[0], key)).status, 200);
  const late = await startDataPlane(cp, { nodeId: 'late' });
  await waitUntilKnown(late.url, key);
  const r = await chat(late, key);
  assert.equal(r.status, 200, r.text);
  admin.close();
});

test('two nodes refuse an organisation whose money is spent; a credit unblocks both within a second', async () => {
  // Before: one node kept refusing after the credit: its slice carried a debt the control plane had
  // already counted in the spend, so it needed more than the credit to serve again.
  const { nodes, admin } = await cluster(2);
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 3_000_000, note: 'a little' });
  await allNodesCurrent(admin, 2);
  for (const n of nodes) await waitUntilKnown(n.url, key);
  // Spend it from both nodes, in parallel, until both refuse.
  const refusedBy = new Set<number>();
  for (let round = 0; round < 20 && refusedBy.size < 2; round++) {
    const res = await Promise.all(nodes.map((n) => chat(n, key, `spend ${round}`)));
    res.forEach((r, i) => {
      if (r.status === 401) {
        assert.equal(r.body.error.type, 'insufficient_quota');
        refusedBy.add(i);
      } else assert.equal(r.status, 200, r.text);
    });
  }
  assert.equal(refusedBy.size, 2, 'both nodes refuse once the money is spent');
  await eventually(async () => (await admin.getOrg({ orgId })).blocked, 'the organisation blocked');
  await admin.creditOrg({ orgId, amountMicros: 10_000_000, note: 'top-up' });
  const t0 = Date.now();
  for (const [i, n] of nodes.entries()) {
    let ok = false;
    while (!ok && Date.now() - t0 < 1000) ok = (await chat(n, key, 'after the credit')).status === 200;
    assert.ok(ok, `node ${i} still refuses ${Date.now() - t0} ms after the credit`);
  }
  admin.close();
});

test('a cap lowered to 10 cents above the month\'s spend: of five sequential requests over three nodes at most one is admitted', async () => {
  // Before: each node kept the slice it held before the cap change; three 0.90 USD requests on one
  // node were admitted one after another, 2.60 USD over the cap.
  const { nodes, admin } = await cluster(3);
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 100_000_000, note: 'plenty' });
  await allNodesCurrent(admin, 3);
  let spent = 0;
  let maxCost = 0;
  for (const n of nodes) {
    await waitUntilKnown(n.url, key);
    const r = await chat(n, key);
    assert.equal(r.status, 200, r.text);
    spent += costOf(r);
    maxCost = Math.max(maxCost, costOf(r));
  }
  await eventually(async () => (await admin.getOrg({ orgId })).monthSpendMicros === spent, 'the spend reported');
  const cap = spent + 100_000;
  await admin.setOrgCap({ orgId, capMicros: cap });
  await allNodesCurrent(admin, 3);
  let admitted = 0;
  for (const n of [nodes[0], nodes[0], nodes[0], nodes[1], nodes[2]]) {
    const r = await chat(n, key);
    if (r.status === 200) {
      admitted++;
      maxCost = Math.max(maxCost, costOf(r));
    } else {
      assert.equal(r.status, 401, r.text);
      assert.equal(r.body.error.type, 'insufficient_quota');
    }
  }
  assert.equal(admitted, 1, 'the 10 cents left admit the first request; the cap then binds everywhere');
  await eventually(async () => (await admin.getOrg({ orgId })).blocked, 'the organisation blocked');
  const org = await admin.getOrg({ orgId });
  assert.ok(org.monthSpendMicros <= cap + maxCost, `spent ${org.monthSpendMicros}: past the cap ${cap} by more than one request`);
  // Raising the cap unblocks every node within a second.
  await admin.setOrgCap({ orgId, capMicros: cap + 50_000_000 });
  const t0 = Date.now();
  for (const [i, n] of nodes.entries()) {
    let ok = false;
    while (!ok && Date.now() - t0 < 1000) ok = (await chat(n, key, 'raised')).status === 200;
    assert.ok(ok, `node ${i} still refuses ${Date.now() - t0} ms after the cap was raised`);
  }
  admin.close();
});

/** Within `ms`, every node answers the key's chat request with `status`. */
async function everyNodeAnswers(nodes: DataPlane[], key: string, status: number, ms: number, what: string): Promise<void> {
  const t0 = Date.now();
  for (const [i, n] of nodes.entries()) {
    let seen = 0;
    while (Date.now() - t0 < ms && (seen = (await chat(n, key, what)).status) !== status);
    assert.equal(seen, status, `node ${i}: ${what} after ${Date.now() - t0} ms`);
  }
}

test('a config reload that lowers the tier\'s cap blocks both nodes within a second; raising it unblocks both', async () => {
  const { cp, nodes, admin } = await cluster(2);
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 100_000_000, note: 'plenty' });
  await allNodesCurrent(admin, 2);
  for (const n of nodes) {
    await waitUntilKnown(n.url, key);
    assert.equal((await chat(n, key)).status, 200);
  }
  await eventually(async () => (await admin.getOrg({ orgId })).monthSpendMicros > 1_000_000, 'the spend reported');
  writeFileSync(cp.configPath!, configYaml((cfg) => {
    pricey(cfg);
    cfg.tiers.paid.monthly_cap_usd = '1.00';
  }));
  const reload = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'config', 'reload']);
  assert.equal(reload.code, 0, reload.stderr);
  await everyNodeAnswers(nodes, key, 401, 1000, 'the lowered cap');
  writeFileSync(cp.configPath!, configYaml(pricey));
  assert.equal((await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'config', 'reload'])).code, 0);
  await everyNodeAnswers(nodes, key, 200, 1000, 'the cap raised again');
  admin.close();
});

test('a node killed while holding an organisation\'s money slice: the survivor can spend all that is left', async () => {
  const { nodes, admin } = await cluster(2);
  const [a, b] = nodes;
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 20_000_000, note: 'twenty dollars' });
  await allNodesCurrent(admin, 2);
  await waitUntilKnown(a.url, key);
  await waitUntilKnown(b.url, key);
  // Node a spends a little and holds a slice of what is left.
  let spent = 0;
  for (let i = 0; i < 3; i++) {
    const r = await chat(a, key);
    assert.equal(r.status, 200, r.text);
    spent += costOf(r);
  }
  await eventually(async () => (await admin.getOrg({ orgId })).monthSpendMicros === spent, 'the spend reported');
  await a.proc.kill('SIGKILL');
  await eventually(async () => (await admin.listNodes()).nodes.filter((x) => x.connected).length === 1, 'one node left');
  // Node b spends the rest of the twenty dollars: nothing stays stuck in the dead node's slice.
  for (let i = 0; i < 40; i++) {
    const r = await chat(b, key);
    if (r.status !== 200) {
      assert.equal(r.status, 401, r.text);
      assert.equal(r.body.error.type, 'insufficient_quota');
      break;
    }
    spent += costOf(r);
  }
  await eventually(async () => (await admin.getOrg({ orgId })).blocked, 'the organisation blocked');
  const org = await admin.getOrg({ orgId });
  assert.ok(org.monthSpendMicros >= 20_000_000, `refused at ${org.monthSpendMicros} spent of 20,000,000: money was lost with the dead node`);
  admin.close();
});
