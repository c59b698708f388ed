// A node at scale: a snapshot far larger than gRPC's default 4 MiB message, and more concurrent streams
// to one upstream than a fixed connection pool would hold.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { consoleClient, createKey } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeUpstream } from '../helpers/fake-upstream.js';
import { startGateway } from '../helpers/gateway-fixture.js';
import { bearer } from '../helpers/http.js';
import { seedKeys } from '../helpers/seed-keys.js';
import { startControlPlane, startDataPlane, stopAll } from '../helpers/processes.js';

after(async () => {
  await stopAll();
});

// Before the fix a node refused any snapshot over 4 MiB (gRPC's default receive limit): with about
// 30,000 keys or more it never became ready and reconnected forever.
test('a node takes a snapshot of 60,000 keys (over 8 MiB) and serves the real key among them', async () => {
  const cp = await startControlPlane();
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const real = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: real.orgId, amountMicros: 1_000_000, note: 'test' });
  admin.close();
  await cp.proc.kill('SIGTERM');
  await seedKeys(cp.dbPath, real.orgId, real.projectId, 60_000);
  const big = await startControlPlane({ dir: cp.dir, secrets: cp.secrets, listen: cp.address });
  const node = await startDataPlane(big, { waitReady: false });
  await node.proc.waitFor(/data plane ready/, 60_000);
  assert.doesNotMatch(node.proc.output(), /RESOURCE_EXHAUSTED/);
  await waitUntilKnown(node.url, real.key);
  const r = await fetch(`${node.url}/v1/models`, { headers: bearer(real.key) });
  assert.equal(r.status, 200);
  const body = (await r.json()) as { object: string; data: unknown[] };
  assert.equal(body.object, 'list');
  // The node first: its drain sends its last usage to the control plane (stopped first, the node would
  // wait its whole --drain-seconds for acknowledgements).
  await node.proc.kill('SIGTERM');
  await big.proc.kill('SIGTERM');
});

// Before the fix a node opened at most 128 connections to one upstream: the 129th concurrent stream
// waited for another to end, however long that took (a stream can last minutes).
test('300 concurrent streams to one upstream all reach it at once', async (t) => {
  const up = await startFakeUpstream();
  const yaml = configYaml((cfg) => {
    addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['paid'], { timeout_ms: 30_000 });
    cfg.tiers.paid.max_parallel_requests = 1000;
    cfg.tiers.paid.rpm = 10_000;
  });
  const gw = await startGateway(t, { controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'k' } } });
  const node = gw.node;
  const { key } = await gw.fundedKey({ tier: 'paid', creditMicros: 1_000_000_000 });
  up.setMode('hold-stream');
  const body = JSON.stringify({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'Say hello' }] });
  const responses = Array.from({ length: 300 }, () =>
    fetch(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body }),
  );
  let timer: NodeJS.Timeout | undefined;
  const arrived = await Promise.race([up.waitForRequests(300).then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), 20_000)))]);
  // Cleared: a timer left running would hold this file's process open for its 20 s after the last test.
  clearTimeout(timer);
  assert.ok(arrived, `only ${up.requests.length} of 300 streams reached the upstream within 20 s`);
  up.release();
  const texts = await Promise.all(responses.map(async (p) => {
    const r = await p;
    assert.equal(r.status, 200);
    return r.text();
  }));
  for (const t of texts) assert.match(t, /data: \[DONE\]/);
  await up.close();
});
