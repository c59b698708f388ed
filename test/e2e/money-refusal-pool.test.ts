// Which pool a money refusal names (docs/money-limits.md#the-last-request). A request that names no
// max, of a model with no ceiling, is unpriced: at $0.10 a token its worst case is about $410, so
// three in flight hold all of a $1,000 organisation's money, and one of them all that is left of a
// key's $10 limit. The key's next request is refused, and what refuses it is the key's limit (the
// organisation spent a few dollars). Before, the organisation's pool was asked first and the refusal
// said "The organisation's balance is exhausted or its monthly spend cap was reached." (how
// money-limits.test.ts failed under load: a request admitted after the others' raises).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { stopAll, runCliAsync, type ControlPlane } from '../helpers/processes.js';
import { launchGateway } from '../helpers/gateway-fixture.js';
import { bearer, request, setClock, type HttpResult } from '../helpers/http.js';
import { createKey } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { startFakeUpstream } from '../helpers/fake-upstream.js';
import { allNodesCurrent } from '../helpers/priced-demo.js';
import { waitUntilKnown } from '../helpers/data-plane.js';

after(stopAll);

async function cli(cp: ControlPlane, args: string[]): Promise<any> {
  const r = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', ...args]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

test('unpriced requests in flight hold all of an organisation\'s $1,000 and of a key\'s $10 limit: the key\'s next request is refused naming its limit, not the organisation\'s balance', async () => {
  const up = await startFakeUpstream();
  after(() => up.close());
  const yaml = configYaml((cfg) => addUpstreamModel(cfg, 'up-pricey', up.baseUrl, ['free', 'paid'], { input_usd_per_mtok: '100000', output_usd_per_mtok: '100000' }));
  const gw = await launchGateway({ controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'k' } }, nodes: 0 });
  const node = await gw.addNode({ nodeId: 'node-0', adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
  // The node's clock stands still: "no more" said by the control plane holds (1 s) however slow the machine.
  await setClock(node.adminUrl!, { now_ms: Date.now() });
  await allNodesCurrent(gw.console, 1);
  const { orgId, projectId, key: plain } = await createKey(gw.console, { tier: 'paid' });
  await gw.console.creditOrg({ orgId, amountMicros: 1_000_000_000, note: 'far more than the key may spend' });
  const limited = await cli(gw.cp, ['key', 'create', '--project', projectId, '--limit-usd', '10']);
  await waitUntilKnown(node.url, limited.key);
  await waitUntilKnown(node.url, plain);
  const hi = (key: string): Promise<HttpResult> => request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: { model: 'up-pricey', messages: [{ role: 'user', content: 'Hi' }] } });
  // One request of each first: what a request costs ($1.70) is the estimate each reserves after.
  for (const k of [limited.key, plain]) assert.equal((await hi(k)).status, 200);
  up.setMode('hold-head');
  // Held in flight one at a time, each raised to its worst case: the limited key's takes all that is
  // left of its limit; the second of the plain key's finds the organisation's slice short and takes
  // all that is left of it (the control plane says no more).
  const held = [hi(limited.key)];
  await up.waitForHeld(1);
  held.push(hi(plain));
  await up.waitForHeld(2);
  held.push(hi(plain));
  await up.waitForHeld(3);
  const next = await hi(limited.key);
  up.release();
  for (const r of await Promise.all(held)) assert.equal(r.status, 200, r.text);
  up.setMode('normal');
  assert.equal(next.status, 401, next.text);
  assert.equal(next.body.error.type, 'insufficient_quota');
  assert.match(next.body.error.message, /This API key's spend limit of \$10\.00 was reached/, 'the key\'s limit, which a held request holds the rest of, refuses');
  gw.console.close();
});
