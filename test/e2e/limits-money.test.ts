// Money: spend = usage × the model's prices; the free grant, credits and the monthly cap decide
// whether an organisation's keys authenticate, on every node, read live from the config.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { type Console } from '../helpers/console.js';
import { configYaml, type GatewayYaml } from '../helpers/config.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { within } from '../helpers/data-plane.js';

let cp: ControlPlane;
let node: DataPlane;
let admin: Console;

// A demo model priced so that one short request costs a few dollars.
function pricey(cfg: GatewayYaml): void {
  cfg.models.push({ id: 'demo-pricey', provider: 'demo', kind: 'chat', input_usd_per_mtok: '100000', output_usd_per_mtok: '100000' });
  cfg.tiers.free.models.push('demo-pricey');
  cfg.tiers.paid.models.push('demo-pricey');
}

const gw = gatewayFixture(() => ({ controlPlane: { configYaml: configYaml(pricey) } }), () => {
  ({ cp, node, console: admin } = gw);
});

/** Polls `probe` until it returns true, at most `ms`; for state that propagates asynchronously by design. */
test('a free organisation spends its 5.00 USD grant and the next request gets 401 insufficient_quota', async () => {
  const { key, orgId } = await gw.fundedKey({ tier: 'free' });
  let admitted = 0;
  let maxCost = 0;
  let refused: Awaited<ReturnType<typeof request>> | undefined;
  for (let i = 0; i < 20 && !refused; i++) {
    const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`spend ${i}`, 'demo-pricey') });
    if (res.status === 200) {
      admitted++;
      const cost = Math.ceil(((res.body.usage.prompt_tokens + res.body.usage.completion_tokens) * 100000 * 1_000_000) / 1_000_000);
      maxCost = Math.max(maxCost, cost);
    } else refused = res;
  }
  assert.ok(refused, 'the grant runs out');
  assert.equal(refused.status, 401);
  assert.equal(refused.body.error.type, 'insufficient_quota');
  assert.equal(refused.body.error.code, '401');
  assert.ok(admitted >= 1);
  // Spend is exact: at most one request (the only one in flight at a time) past the grant.
  assert.ok(await within(2000, async () => (await admin.getOrg({ orgId })).blocked));
  const org = await admin.getOrg({ orgId });
  assert.ok(org.spendTotalMicros >= 5_000_000, `spent ${org.spendTotalMicros}`);
  assert.ok(org.spendTotalMicros < 5_000_000 + maxCost, `spent ${org.spendTotalMicros}, one request costs up to ${maxCost}`);
  // Every model, every path of the key is refused the same way.
  const embed = await request(`${node.url}/v1/embeddings`, { method: 'POST', headers: bearer(key), json: { model: 'demo-embed', input: 'x' } });
  assert.equal(embed.status, 401);
  assert.equal(embed.body.error.type, 'insufficient_quota');
  // The CLI shows the state.
  const shown = JSON.parse((await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'org', 'show', orgId])).stdout);
  assert.equal(shown.blocked, true);
  assert.ok(['balance_exhausted', 'monthly_cap_reached'].includes(shown.blocked_reason));
});

test('a paid organisation with no credit is blocked; an operator credit unblocks it within a second', async () => {
  const { key, orgId } = await gw.fundedKey({ tier: 'paid' });
  const before = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(before.status, 401);
  assert.equal(before.body.error.type, 'insufficient_quota');
  await admin.creditOrg({ orgId, amountMicros: 10_000_000, note: 'top-up' });
  const t0 = Date.now();
  const unblocked = await within(1000, async () => {
    const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
    return res.status === 200;
  });
  assert.ok(unblocked, `still blocked ${Date.now() - t0} ms after the credit`);
});

test('a cap lowered in the config file blocks on reload, without restarting anything', async () => {
  const { key, orgId } = await gw.fundedKey({ tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 100_000_000, note: 'plenty' });
  assert.ok(await within(1000, async () => (await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('x', 'demo-pricey') })).status === 200));
  assert.ok(await within(2000, async () => (await admin.getOrg({ orgId })).monthSpendMicros > 1_000_000));
  writeFileSync(
    cp.configPath!,
    configYaml((cfg) => {
      pricey(cfg);
      cfg.tiers.paid.monthly_cap_usd = '1.00';
    }),
  );
  const reload = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'config', 'reload']);
  assert.equal(reload.code, 0, reload.stderr);
  const blocked = await within(1000, async () => {
    const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
    return res.status === 401 && res.body.error.type === 'insufficient_quota';
  });
  assert.ok(blocked, 'the lowered cap applies without a restart');
  const org = await admin.getOrg({ orgId });
  assert.equal(org.blocked, true);
  assert.equal(org.blockedReason, 'monthly_cap_reached');
  assert.equal(org.effectiveCapMicros, 1_000_000);
  // SIGHUP does the same: raise the cap back and signal.
  writeFileSync(cp.configPath!, configYaml(pricey));
  cp.proc.child.kill('SIGHUP');
  assert.ok(
    await within(2000, async () => (await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() })).status === 200),
    'SIGHUP reload unblocks',
  );
});
