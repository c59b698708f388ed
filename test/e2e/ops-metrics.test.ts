// Metrics and health of both processes, scraped from their admin listeners and parsed as Prometheus
// text: the node counts each request by route family, status and refusal reason, with its latency
// histograms; the control plane counts console calls, ingested rows, transactions and nodes; a node
// is ready only after its first snapshot; nothing of this is served on the API listener.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { consoleClient, createKey, type Console } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { scrapeMetrics, type Metrics } from '../helpers/prometheus.js';
import { freePort, startControlPlane, startDataPlane, startProcess, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageRows } from '../helpers/usage-db.js';

let cp: ControlPlane;
let dp: DataPlane;
let c: Console;
let up: FakeUpstream;
let readyBeforeSync: { status: number; connected: number | undefined; version: number | undefined };

before(async () => {
  // The node starts first, pointed at a control plane that is not there yet: not ready.
  const cpPort = await freePort();
  const secrets = { pepper: 'p'.repeat(64), operatorToken: `op_${'a'.repeat(40)}`, nodeToken: `node_${'b'.repeat(40)}` };
  dp = await startDataPlane({ address: `127.0.0.1:${cpPort}`, secrets }, { adminListen: true, waitReady: false });
  const early = await fetch(`${dp.adminUrl}/readyz`);
  const earlyMetrics = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  readyBeforeSync = { status: early.status, connected: earlyMetrics.value('tollgate_node_sync_connected'), version: earlyMetrics.value('tollgate_node_sync_applied_version') };
  up = await startFakeUpstream();
  const yaml = configYaml((cfg) => {
    addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['free', 'paid']);
    addUpstreamModel(cfg, 'dead-chat', 'http://127.0.0.1:1/v1', ['free', 'paid']);
  });
  cp = await startControlPlane({ secrets, listen: `127.0.0.1:${cpPort}`, adminListen: true, configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } });
  await dp.proc.waitFor(/data plane ready/);
  c = consoleClient(cp.address, secrets.operatorToken);
});
after(async () => {
  c?.close();
  await stopAll();
  await up?.close();
});

function delta(a: Metrics, b: Metrics, name: string, labels: Record<string, string>): number {
  return (b.value(name, labels) ?? 0) - (a.value(name, labels) ?? 0);
}

test('a node is not ready before its first snapshot, and ready after it', async () => {
  assert.equal(readyBeforeSync.status, 503);
  assert.equal(readyBeforeSync.connected, 0);
  assert.equal(readyBeforeSync.version, 0);
  const res = await fetch(`${dp.adminUrl}/readyz`);
  assert.equal(res.status, 200);
  assert.equal((await fetch(`${dp.adminUrl}/healthz`)).status, 200);
  const m = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  assert.equal(m.value('tollgate_node_sync_connected'), 1);
  const nodes = await c.listNodes();
  assert.ok(m.value('tollgate_node_sync_applied_version')! > 0);
  assert.ok(m.value('tollgate_node_sync_applied_version')! <= nodes.currentVersion);
  assert.equal(m.value('tollgate_node_sync_lag_seconds'), 0);
});

test('the node counts requests by route family, status and refusal reason, with latency histograms', async () => {
  const k = await createKey(c, { tier: 'free' });
  await waitUntilKnown(dp.url, k.key);
  const before = await scrapeMetrics(`${dp.adminUrl}/metrics`);

  for (let i = 0; i < 3; i++) {
    const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody() });
    assert.equal(r.status, 200, r.text);
  }
  for (let i = 0; i < 2; i++) {
    const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer('sk-tollgate-nope'), json: chatBody() });
    assert.equal(r.status, 401);
  }
  const bad = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(k.key), 'content-type': 'application/json' }, body: '{not json' });
  assert.equal(bad.status, 400);
  const models = await request(`${dp.url}/v1/models`, { headers: bearer(k.key) });
  assert.equal(models.status, 200);
  const missing = await request(`${dp.url}/v1/nothing-here`, { headers: bearer(k.key) });
  assert.equal(missing.status, 404);

  const after = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  assert.equal(after.type('tollgate_node_requests_total'), 'counter');
  const req = 'tollgate_node_requests_total';
  assert.equal(delta(before, after, req, { family: 'chat', status: '200', reason: 'none' }), 3);
  assert.equal(delta(before, after, req, { family: 'chat', status: '401', reason: 'KEY_INVALID' }), 2);
  assert.equal(delta(before, after, req, { family: 'chat', status: '400', reason: 'INVALID_REQUEST' }), 1);
  assert.equal(delta(before, after, req, { family: 'models', status: '200', reason: 'none' }), 1);
  assert.equal(delta(before, after, req, { family: 'v1', status: '404', reason: 'NOT_FOUND' }), 1);
  // Every request counted once: 8 in all.
  assert.equal(after.sum(req) - before.sum(req), 8);

  // Latency: every answered request has an added-latency observation; the 3 chat calls that reached
  // the (demo) provider have an upstream time too.
  assert.equal(after.type('tollgate_node_added_latency_seconds'), 'histogram');
  assert.equal(delta(before, after, 'tollgate_node_added_latency_seconds_count', { family: 'chat' }), 6);
  assert.equal(delta(before, after, 'tollgate_node_upstream_seconds_count', { family: 'chat' }), 3);
  assert.equal(delta(before, after, 'tollgate_node_upstream_seconds_count', { family: 'models' }), 0);
  assert.ok(delta(before, after, 'tollgate_node_added_latency_seconds_sum', { family: 'chat' }) > 0);

  assert.equal(after.value('tollgate_node_inflight_requests'), 0);
  assert.equal(after.value('tollgate_node_open_streams', { kind: 'sse' }), 0);
  assert.equal(after.value('tollgate_node_open_streams', { kind: 'realtime' }), 0);
  assert.ok(after.value('tollgate_node_edge_windows')! >= 1);
  assert.equal(after.type('tollgate_node_upstream_errors_total'), 'counter');
  assert.ok(after.value('tollgate_node_journal_depth')! >= 0);
  assert.equal(after.value('tollgate_node_draining'), 0);

  // The usage of the 3 calls reaches the control plane: its ingest counts the rows and the node's
  // journal of unacknowledged usage empties.
  await waitForUsageRows(cp.dbPath, k.keyId, 3);
  // The rows are in the database file as soon as SQLite's worker commits them, a moment before the
  // control plane's main thread hears of the commit and counts them: a scrape in between saw 0.
  await eventually(async () => ((await scrapeMetrics(`${cp.adminUrl}/metrics`)).value('tollgate_cp_ingest_rows_total') ?? 0) >= 3, 'the control plane counted the 3 rows');
  await eventually(async () => (await scrapeMetrics(`${dp.adminUrl}/metrics`)).value('tollgate_node_journal_depth') === 0, 'journal depth 0');
});

test('an open stream is counted while it runs, and a failed upstream as an upstream error', async () => {
  const k = await createKey(c, { tier: 'free' });
  await waitUntilKnown(dp.url, k.key);
  const before = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  up.setMode('hold-stream');
  const res = await fetch(`${dp.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(k.key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'Hello' }] }),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = dec.decode((await reader.read()).value);
  // The upstream holds the rest of its stream: the response is open.
  const during = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  assert.equal(during.value('tollgate_node_open_streams', { kind: 'sse' }), 1);
  assert.equal(during.value('tollgate_node_inflight_requests'), 1);
  up.release();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value);
  }
  assert.match(text, /\[DONE\]/);
  up.setMode('normal');

  const dead = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody('Hello', 'dead-chat') });
  assert.equal(dead.status, 502);
  const after = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  assert.equal(after.value('tollgate_node_open_streams', { kind: 'sse' }), 0);
  assert.equal(after.value('tollgate_node_inflight_requests'), 0);
  assert.equal(delta(before, after, 'tollgate_node_upstream_errors_total', { family: 'chat' }), 1);
  assert.equal(delta(before, after, 'tollgate_node_requests_total', { family: 'chat', status: '502', reason: 'none' }), 1);
  assert.equal(delta(before, after, 'tollgate_node_requests_total', { family: 'chat', status: '200', reason: 'none' }), 1);
  // The streamed call's upstream time (to its response headers) was observed.
  assert.equal(delta(before, after, 'tollgate_node_upstream_seconds_count', { family: 'chat' }), 1);
});

test('the control plane counts console calls by method and status, and reports its nodes and transactions', async () => {
  assert.equal((await fetch(`${cp.adminUrl}/healthz`)).status, 200);
  assert.equal((await fetch(`${cp.adminUrl}/readyz`)).status, 200);
  const before = await scrapeMetrics(`${cp.adminUrl}/metrics`);
  const k = await createKey(c, { tier: 'paid' });
  const stranger = consoleClient(cp.address, 'not-a-token-at-all');
  await assert.rejects(stranger.listOrgs());
  stranger.close();
  const after = await scrapeMetrics(`${cp.adminUrl}/metrics`);
  const calls = 'tollgate_cp_console_requests_total';
  assert.equal(after.type(calls), 'counter');
  assert.equal(delta(before, after, calls, { method: 'createKey', code: 'OK' }), 1);
  assert.equal(delta(before, after, calls, { method: 'createOrg', code: 'OK' }), 1);
  assert.equal(delta(before, after, calls, { method: 'listOrgs', code: 'UNAUTHENTICATED' }), 1);
  assert.equal(after.value('tollgate_cp_connected_nodes'), 1);
  assert.equal(after.value('tollgate_cp_ready'), 1);
  const nodes = await c.listNodes();
  assert.equal(after.value('tollgate_cp_state_version'), nodes.currentVersion);
  // Creating an account, an organisation, a project and a key wrote at least 4 transactions.
  assert.ok(delta(before, after, 'tollgate_cp_db_transaction_seconds_count', { outcome: 'commit' }) >= 4);
  assert.equal(after.type('tollgate_cp_lease_answers_total'), 'counter');
  assert.equal(after.type('tollgate_cp_ingest_rows_total'), 'counter');
  assert.equal(after.type('tollgate_cp_node_version_lag'), 'gauge');

  // A paid organisation's request asks for a money lease, which the control plane answers.
  await c.creditOrg({ orgId: k.orgId, amountMicros: 1_000_000, note: 'test' });
  await waitUntilKnown(dp.url, k.key);
  const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody() });
  assert.equal(r.status, 200, r.text);
  const leased = await scrapeMetrics(`${cp.adminUrl}/metrics`);
  assert.ok(leased.sum('tollgate_cp_lease_answers_total', { kind: 'money' }) > before.sum('tollgate_cp_lease_answers_total', { kind: 'money' }));
});

test('metrics and health are not served on the API listener', async () => {
  // Without a key the API listener does not even say whether the path exists.
  const r = await request(`${dp.url}/metrics`);
  assert.notEqual(r.status, 200);
  assert.doesNotMatch(r.text, /tollgate_node_/);
  const v1 = await request(`${dp.url}/v1/metrics`);
  assert.notEqual(v1.status, 200);
  assert.doesNotMatch(v1.text, /tollgate_node_/);
  const health = await request(`${dp.url}/readyz`);
  assert.notEqual(health.status, 200);
});

test('a node does not start on an address another node listens on: it exits naming the flag', async () => {
  // Before: uWS binds a fixed port with SO_REUSEPORT, so a second node on the same address started
  // silently and the kernel split new connections between the two.
  const env = { TOLLGATE_PEPPER: 'p'.repeat(64), TOLLGATE_NODE_TOKEN: `node_${'b'.repeat(40)}` };
  const [api, admin] = [`127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`];
  const first = startProcess(['data-plane/main.ts', '--control-plane', cp.address, '--listen', api, '--admin-listen', admin], env);
  try {
    await first.waitFor(/data plane ready/);
    for (const [flags, flag] of [[['--listen', api], '--listen'], [['--listen', '127.0.0.1:0', '--admin-listen', admin], '--admin-listen']] as const) {
      const second = startProcess(['data-plane/main.ts', '--control-plane', cp.address, ...flags], env);
      try {
        const m = await second.waitFor(/choose another with (--[a-z-]+)|data plane ready/, 60_000);
        assert.equal(m[1], flag, second.output());
        const code = await new Promise<number | null>((resolve) => (second.child.exitCode !== null ? resolve(second.child.exitCode) : second.child.once('exit', (c) => resolve(c))));
        assert.notEqual(code, 0, second.output());
      } finally {
        await second.kill('SIGKILL');
      }
    }
  } finally {
    await first.kill('SIGKILL');
  }
});
