// Money never passes a limit by more than one request per node (issue 32, finding 5;
// docs/money-limits.md#the-last-request). Before the fix a request reserved the costliest request
// seen before on its node, 0 at first: a key limited to $0.01 spent $2.265 (226×) in one burst of 30.
// Now a request's worst case (input estimate plus the most output it allows, named or the model's
// `max_output_tokens`, at the model's prices) must fit in what is left of every pool it touches, the
// key's limit, the project's cap and the organisation's money alike; one whose output has no bound
// takes all that is left. Spend is read back through the CLI.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { stopAll, runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { launchGateway } from '../helpers/gateway-fixture.js';
import { bearer, request, type HttpResult } from '../helpers/http.js';
import { createKey, type Console } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { allNodesCurrent } from '../helpers/priced-demo.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { formatUsd } from '../../proto/lib/money.js';

after(stopAll);

/** Every model here costs 100 µ$ a token in and out. */
const PER_TOKEN = 100;
/** The gateway's estimate of a one-message "Hi" chat (4 a message, 3 for the reply, 1 for the text). */
const INPUT_ESTIMATE = 8;
/** A "Hi" request with max_tokens 10: its worst case. */
const WORST = (INPUT_ESTIMATE + 10) * PER_TOKEN;
/** `demo-metered-capped` (the demo provider, `max_output_tokens: 20`): "Hi" is 1 prompt token and a 15-token answer. */
const CAPPED_COST = (1 + 15) * PER_TOKEN;

/**
 * `n` nodes; `up-metered` is served by a fake upstream (11 + 6 tokens a request) that holds its
 * answers until released, so a burst is truly in flight at once; `demo-metered-capped` by the demo.
 */
async function cluster(n: number): Promise<{ cp: ControlPlane; nodes: DataPlane[]; admin: Console; up: FakeUpstream }> {
  const up = await startFakeUpstream();
  const yaml = configYaml((cfg) => {
    addUpstreamModel(cfg, 'up-metered', up.baseUrl, ['free', 'paid'], { input_usd_per_mtok: '100', output_usd_per_mtok: '100' });
    cfg.models.push({ id: 'demo-metered-capped', provider: 'demo', kind: 'chat', input_usd_per_mtok: '100', output_usd_per_mtok: '100', max_output_tokens: 20 });
    for (const t of ['free', 'paid']) cfg.tiers[t].models.push('demo-metered-capped');
  });
  const gw = await launchGateway({ controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'k' } }, nodes: 0 });
  for (let i = 0; i < n; i++) await gw.addNode({ nodeId: `node-${i}`, adminListen: true });
  await allNodesCurrent(gw.console, n);
  after(() => up.close());
  return { cp: gw.cp, nodes: gw.nodes, admin: gw.console, up };
}

async function cli(cp: ControlPlane, args: string[]): Promise<any> {
  const r = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', ...args]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

function hi(node: DataPlane, key: string, extra: Record<string, unknown> = { max_tokens: 10 }, model = 'up-metered'): Promise<HttpResult> {
  return request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model, messages: [{ role: 'user', content: 'Hi' }], ...extra } });
}

const costOf = (r: HttpResult): number => (r.body.usage.prompt_tokens + r.body.usage.completion_tokens) * PER_TOKEN;

/** A 401 Shape A insufficient_quota. */
function assertRefusal(r: HttpResult, says?: RegExp): void {
  assert.equal(r.status, 401, r.text);
  assert.deepEqual(Object.keys(r.body), ['error']);
  assert.equal(r.body.error.type, 'insufficient_quota');
  assert.equal(r.body.error.code, '401');
  if (says) assert.match(r.body.error.message, says);
}

/**
 * Sends `count` requests at once, spread over `nodes` in turn, all held at the upstream until every
 * one was either forwarded or refused; returns what they spent and the refusals.
 */
async function burst(up: FakeUpstream, nodes: DataPlane[], key: string, count: number, extra?: Record<string, unknown>): Promise<{ spent: number; admitted: number; refusals: HttpResult[] }> {
  up.setMode('hold-head');
  const before = up.requests.length;
  let answered = 0;
  const pending = Array.from({ length: count }, (_, i) => hi(nodes[i % nodes.length], key, extra).then((r) => (answered++, r)));
  await eventually(async () => up.requests.length - before + answered === count, 'every request forwarded or refused');
  up.release();
  const res = await Promise.all(pending);
  up.setMode('normal');
  let spent = 0;
  let admitted = 0;
  const refusals: HttpResult[] = [];
  for (const r of res) {
    if (r.status === 200) {
      spent += costOf(r);
      admitted++;
    } else {
      assertRefusal(r);
      refusals.push(r);
    }
  }
  return { spent, admitted, refusals };
}

async function limitedKey(cp: ControlPlane, admin: Console, nodes: DataPlane[], limitUsd: string): Promise<{ key: string; id: string }> {
  const { orgId, projectId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 1_000_000_000, note: 'plenty: the key limit binds first' });
  const created = await cli(cp, ['key', 'create', '--project', projectId, '--limit-usd', limitUsd]);
  for (const n of nodes) await waitUntilKnown(n.url, created.key);
  return { key: created.key, id: created.id };
}

/**
 * A burst of 30 on a fresh key limited to $0.01 over `nodeCount` nodes while the control plane is
 * stopped 1.5 s (under the 5 s a reclaim may take: the outcome does not depend on it). With `warm`, each
 * node's pool has had its grant first (one request each, before the stop). Returns what was spent,
 * the warm requests included, and how many of the burst were admitted.
 */
async function burstWithControlPlaneStopped(nodeCount: number, warm: boolean): Promise<{ total: number; admitted: number }> {
  const { cp, nodes, admin, up } = await cluster(nodeCount);
  const { key } = await limitedKey(cp, admin, nodes, '0.01');
  let before = 0;
  if (warm) {
    // The second node's grant comes after a reclaim from the first.
    for (const n of nodes) {
      const r = await hi(n, key);
      assert.equal(r.status, 200, r.text);
      before += costOf(r);
    }
  }
  const pid = cp.proc.child.pid!;
  process.kill(pid, 'SIGSTOP');
  const resume = setTimeout(() => process.kill(pid, 'SIGCONT'), 1500);
  try {
    const { spent, admitted } = await burst(up, nodes, key, 30);
    return { total: before + spent, admitted };
  } finally {
    clearTimeout(resume);
    process.kill(pid, 'SIGCONT');
    admin.close();
  }
}

test('a burst of 30 while the control plane answers late (stopped 1.5 s): spend stays within the limit plus one request\'s worst case', async () => {
  // Before: each request out of time (250 ms without an answer) was taken in advance of it, so a burst
  // during a slow control plane passed a $0.01 limit three times over (a CI run under load: 32,300 µ$).
  // The control plane stops before the key's first request: its pool has no grant yet on the node, so
  // one request is taken in advance and the others wait for the first answer (docs/leases.md).
  const { total, admitted } = await burstWithControlPlaneStopped(1, false);
  assert.ok(admitted >= 1, 'the first requests fit');
  assert.ok(total <= 10_000 + WORST, `spent ${total} of a 10,000 µ$ limit with one node: past it by more than one worst case (${WORST})`);
});

test('a burst of 30 over two nodes on a fresh key limited to $0.01 while the control plane is stopped 1.5 s: within the limit plus one worst case per node', async () => {
  // The CI failure that found the defect (money-limits.test.ts, under load): a fresh key, two nodes.
  const { total, admitted } = await burstWithControlPlaneStopped(2, false);
  assert.ok(admitted >= 1, 'the first requests fit');
  assert.ok(total <= 10_000 + 2 * WORST, `spent ${total} of a 10,000 µ$ limit with two nodes: past it by more than one worst case per node (${WORST})`);
});

test('a burst of 30 near a key limit while the control plane answers late (stopped 1.5 s): spend stays within the limit plus one request\'s worst case', async () => {
  // Before: each request out of time (250 ms without an answer) was taken in advance of it, so a burst
  // during a slow control plane passed a $0.01 limit three times over (a CI run under load: 32,300 µ$).
  // Now the control plane tells the node with each grant what it may take in advance of a late answer
  // (docs/leases.md): a lone node holds all that is left, so nothing; then one request more; the rest wait.
  const { total, admitted } = await burstWithControlPlaneStopped(1, true);
  assert.ok(admitted >= 1, 'the first requests fit');
  assert.ok(total <= 10_000 + WORST, `spent ${total} of a 10,000 µ$ limit with one node: past it by more than one worst case (${WORST})`);
});

test('a burst of 30 over two nodes near a key limit while the control plane is stopped 1.5 s: within the limit plus one worst case per node', async () => {
  const { total } = await burstWithControlPlaneStopped(2, true);
  assert.ok(total <= 10_000 + 2 * WORST, `spent ${total} of a 10,000 µ$ limit with two nodes: past it by more than one worst case per node (${WORST})`);
});

test('far from a key limit, a control plane that stops answering (SIGSTOP) still lets a burst in after about 250 ms: what it said may be taken in advance covers it', async () => {
  // The first fix of the overshoot above (one request per pool in advance of a late answer) held a pool
  // far from its limit to one request too: the others waited 5 s (limits-exact, a fresh-clone CI run).
  const { cp, nodes, admin, up } = await cluster(2);
  const [a] = nodes;
  // $10, and requests whose worst case is 100,800 µ$ (1,000 output tokens): the node's slice (a share
  // for two nodes, 2,500,000 µ$) covers about 24 in flight; the control plane said it may take half of
  // the 7,500,000 nobody holds in advance of a late answer.
  const { key } = await limitedKey(cp, admin, nodes, '10');
  const big = { max_tokens: 1000 };
  const first = await hi(a, key, big);
  assert.equal(first.status, 200, first.text);
  const waitedBefore = ((await request(`${a.adminUrl}/stats/lease-waits`)).body as { waited: number }).waited;
  const pid = cp.proc.child.pid!;
  process.kill(pid, 'SIGSTOP');
  try {
    up.setMode('hold-head');
    const before = up.requests.length;
    const t0 = Date.now();
    const pending = Array.from({ length: 40 }, () => hi(a, key, big));
    // Forwarded with the control plane still stopped: the ones past the slice waited about 250 ms, not
    // for an answer (that would be 5 s, the most a request waits for one).
    await eventually(async () => up.requests.length - before === 40, 'all 40 forwarded');
    const took = Date.now() - t0;
    assert.ok(took < 3000, `all 40 forwarded after ${took} ms`);
    up.release();
    for (const r of await Promise.all(pending)) assert.equal(r.status, 200, r.text);
  } finally {
    up.setMode('normal');
    process.kill(pid, 'SIGCONT');
  }
  const waits = (await request(`${a.adminUrl}/stats/lease-waits`)).body as { waited: number };
  assert.ok(waits.waited > waitedBefore, 'requests past the slice waited for the control plane, then were taken in advance');
  admin.close();
});

test('a burst of 30 on a key limited to $0.01: spend stays within the limit plus one request\'s worst case', async () => {
  const { cp, nodes, admin, up } = await cluster(1);
  const { key, id } = await limitedKey(cp, admin, nodes, '0.01');
  const { spent, admitted, refusals } = await burst(up, nodes, key, 30);
  assert.ok(admitted >= 1, 'the first requests fit');
  assert.ok(spent <= 10_000 + WORST, `spent ${spent} of a 10,000 µ$ limit with one node: past it by more than one worst case (${WORST})`);
  assert.ok(refusals.some((r) => /you requested up to 10 output tokens, but can only afford \d+\./.test(r.body.error.message)), `a refusal names the output tokens that fit: ${refusals.map((r) => r.body.error.message).join(' | ')}`);
  await eventually(async () => (await cli(cp, ['key', 'show', id])).spent_usd === formatUsd(spent), `key show says ${formatUsd(spent)} spent`);
  admin.close();
});

test('a burst of 30 on an organisation with $0.01 left: the same bound on its balance', async () => {
  const { cp, nodes, admin, up } = await cluster(1);
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 10_000, note: 'one cent' });
  await waitUntilKnown(nodes[0].url, key);
  const { spent, admitted, refusals } = await burst(up, nodes, key, 30);
  assert.ok(admitted >= 1, 'the first requests fit');
  assert.ok(spent <= 10_000 + WORST, `spent ${spent} of a 10,000 µ$ balance with one node: past it by more than one worst case (${WORST})`);
  assert.ok(refusals.length >= 1, 'the rest are refused');
  await eventually(async () => (await cli(cp, ['org', 'show', orgId])).month_spend_usd === formatUsd(spent), `org show says ${formatUsd(spent)} spent`);
  admin.close();
});

test('a burst of 30 over two nodes on a key limited to $0.01: within the limit plus one worst case per node', async () => {
  const { cp, nodes, admin, up } = await cluster(2);
  const { key, id } = await limitedKey(cp, admin, nodes, '0.01');
  const { spent, admitted } = await burst(up, nodes, key, 30);
  assert.ok(admitted >= 1, 'the first requests fit');
  assert.ok(spent <= 10_000 + 2 * WORST, `spent ${spent} of a 10,000 µ$ limit with two nodes: past it by more than one worst case per node (${WORST})`);
  await eventually(async () => (await cli(cp, ['key', 'show', id])).spent_usd === formatUsd(spent), `key show says ${formatUsd(spent)} spent`);
  admin.close();
});

test('refused near the limit with the output tokens that would fit; asking for that many is served', async () => {
  const { cp, nodes, admin } = await cluster(1);
  const { key, id } = await limitedKey(cp, admin, nodes, '0.01');
  const [node] = nodes;
  // The model's ceiling (20) prices requests that name no max: 2,800 µ$ each at worst, 1,600 spent.
  let spent = 0;
  for (let i = 0; i < 5; i++) {
    const r = await hi(node, key, {}, 'demo-metered-capped');
    assert.equal(r.status, 200, r.text);
    assert.equal(costOf(r), CAPPED_COST);
    spent += costOf(r);
  }
  // 2,000 µ$ left: the input (800) and 12 output tokens.
  const refused = await hi(node, key, {}, 'demo-metered-capped');
  assertRefusal(refused, /^This request requires more than is left of this API key's spend limit of \$0\.01, or fewer max_completion_tokens: you requested up to 20 output tokens, but can only afford 12\.$/);
  const named = await hi(node, key, { max_tokens: 13 }, 'demo-metered-capped');
  assertRefusal(named, /or fewer max_tokens: you requested up to 13 output tokens, but can only afford 12\./);
  const fits = await hi(node, key, { max_completion_tokens: 12 }, 'demo-metered-capped');
  assert.equal(fits.status, 200, fits.text);
  assert.equal(fits.body.usage.completion_tokens, 12);
  spent += costOf(fits);
  assert.ok(spent <= 10_000, `spent ${spent}: a request whose worst case fits never passes the limit`);
  await eventually(async () => (await cli(cp, ['key', 'show', id])).spent_usd === formatUsd(spent), `key show says ${formatUsd(spent)} spent`);
  admin.close();
});

test('a request with no max on a model with no ceiling takes all that is left: a second one at the same time is refused', async () => {
  const { cp, nodes, admin, up } = await cluster(1);
  const { key, id } = await limitedKey(cp, admin, nodes, '0.01');
  const { spent, admitted, refusals } = await burst(up, nodes, key, 2, {});
  assert.equal(admitted, 1, 'one of the two is served');
  assert.equal(refusals.length, 1);
  assertRefusal(refusals[0], /spend limit of \$0\.01 was reached/);
  assert.equal(spent, 17 * PER_TOKEN);
  await eventually(async () => (await cli(cp, ['key', 'show', id])).spent_usd === formatUsd(spent), `key show says ${formatUsd(spent)} spent`);
  admin.close();
});
