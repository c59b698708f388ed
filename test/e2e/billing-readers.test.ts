// Billing from what the upstream says it served: realtime events told apart by their parsed type,
// usage read from answers of any size, the prices the upstream bills by (cached, audio), and the
// charge shown to the caller (`usage.cost`, `x-request-id`).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { configYaml } from '../helpers/config.js';
import { consoleClient, createKey, type Console } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';
import { openRealtime } from '../helpers/realtime.js';
import { startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageTotals } from '../helpers/usage-db.js';

let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
let realtime: FakeRealtimeUpstream;

before(async () => {
  realtime = await startFakeRealtimeUpstream();
  cp = await startControlPlane({
    env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test-credential' },
    configYaml: configYaml((cfg) => {
      cfg.models.push({ id: 'rt-up', provider: 'openai', kind: 'realtime', upstream_model: 'gpt-realtime-test', input_usd_per_mtok: '1.00', output_usd_per_mtok: '2.00' });
      cfg.realtime_upstreams = [{ model: 'rt-up', url: realtime.url, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', connect_timeout_ms: 5000 }];
      cfg.tiers.free.models.push('rt-up');
      cfg.tiers.paid.models.push('rt-up');
    }),
  });
  node = await startDataPlane(cp);
  admin = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  admin?.close();
  await stopAll();
  await realtime?.close();
});

test('realtime: a response.done whose metadata mentions "response.created" is billed like any other', async () => {
  // Before the fix, events were told apart by substring tests: a response.done containing the text
  // "response.created" anywhere (here in the client's own metadata, which the upstream echoes) was
  // taken for a response.created and never billed (4 responses delivered, 1 billed).
  const k = await createKey(admin, { tier: 'free' });
  await waitUntilKnown(node.url, k.key);
  realtime.usage = { input_tokens: 10_000, output_tokens: 0 };
  const { session } = await openRealtime(node.address, { key: k.key, model: 'rt-up' });
  await session.waitFor('session.created');
  session.send({ type: 'response.create' });
  for (let i = 2; i <= 4; i++) session.send({ type: 'response.create', response: { metadata: { note: 'response.created', n: String(i) } } });
  await session.waitFor('response.done', 4);
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 4);
  assert.deepEqual(rows.map((r) => [r.model, r.requests, r.cost_micros]), [['rt-up', 4, 40_000]]);
  session.ws.close(1000, 'bye');
  await session.waitClosed();
});
