// Open realtime sockets follow the key and its organisation: revoking the key, or the organisation
// becoming blocked, closes the key's sockets on every node (1008 with a reason) before the nodes ack,
// so they are closed by the time `tollgate key revoke` returns. A node cut off from the control plane
// keeps its sockets (fail-static), unless the configured maximum staleness passes; then its open HTTP
// streams end as well (one registry, one policy: data-plane/state/open-streams.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { type Console } from '../helpers/console.js';
import { gatewayFixture, startGateway } from '../helpers/gateway-fixture.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { startFakeUpstream } from '../helpers/fake-upstream.js';
import { eventually } from '../helpers/data-plane.js';
import { bearer, chatBody, minuteStart, request, setClock } from '../helpers/http.js';
import { attemptRealtime, isRefusal, openRealtime } from '../helpers/realtime.js';

let cp: ControlPlane;
let nodes: DataPlane[];
let admin: Console;

// Injected clocks, set inside one minute: the rpm test must not straddle the top of a minute.
const clocked = { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } };
const gw = gatewayFixture(() => ({
  controlPlane: {
    configYaml: configYaml((cfg) => {
      cfg.models.push({ id: 'demo-pricey', provider: 'demo', kind: 'chat', input_usd_per_mtok: '100000', output_usd_per_mtok: '100000' });
      cfg.tiers.free.models.push('demo-pricey');
      cfg.tiers['rt-one'] = { rpm: 300, tpm: 1000000, max_parallel_requests: 1, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['demo-realtime'] };
    }),
  },
  nodes: [
    { nodeId: 'rt-a', ...clocked },
    { nodeId: 'rt-b', ...clocked },
  ],
}), async () => {
  ({ cp, nodes, console: admin } = gw);
  // One clock value for both nodes, read once (read per node, a minute could turn in between).
  const clock = minuteStart() + 5_000;
  for (const n of nodes) await setClock(n.adminUrl!, { now_ms: clock });
});

test('an open socket is closed within a second of `tollgate key revoke` returning, on each of two nodes (1008, reason)', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const sockets = await Promise.all(nodes.map((n) => openRealtime(n.address, { key: k.key })));
  for (const s of sockets) await s.session.waitFor('session.created');
  // Another key's socket on the same node is left alone.
  const bystander = await gw.fundedKey({ tier: 'free', orgId: k.orgId, projectId: k.projectId, knownOn: [nodes[0]] });
  const other = await openRealtime(nodes[0].address, { key: bystander.key });

  const r = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'key', 'revoke', k.keyId]);
  const returnedAt = Date.now();
  assert.equal(r.code, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout).nodes_confirmed, 2);
  for (const s of sockets) {
    const code = await s.session.waitClosed(1000 + 500);
    assert.equal(code, 1008);
    assert.match(s.session.closeReason, /revoked/);
    assert.ok(s.session.closedAt - returnedAt <= 1000, `closed ${s.session.closedAt - returnedAt} ms after the revoke returned`);
  }
  assert.equal(other.session.closeCode, null, "another key's socket stays open");
  other.session.say('still here?');
  await other.session.waitFor('response.done');
  other.ws.close(1000);
});

test("an organisation that becomes blocked has its keys' open sockets closed on every node (1008 insufficient_quota)", async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const sockets = await Promise.all(nodes.map((n) => openRealtime(n.address, { key: k.key })));
  for (const s of sockets) await s.session.waitFor('session.created');
  // The organisation spends its grant over HTTP (a few dollars a request) until it is refused.
  let status = 200;
  for (let i = 0; i < 20 && status === 200; i++) {
    status = (await request(`${nodes[0].url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody(`spend ${i}`, 'demo-pricey') })).status;
  }
  assert.equal(status, 401, 'the grant ran out');
  for (const s of sockets) {
    assert.equal(await s.session.waitClosed(5000), 1008);
    assert.match(s.session.closeReason, /^insufficient_quota: /);
  }
});

test("connection attempts are requests: a free key's 20 per minute hold across two nodes (waiting for leases), the 21st gets 429 requests", async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const opened = [];
  for (let i = 0; i < 20; i++) opened.push(await openRealtime(nodes[i % 2].address, { key: k.key }));
  for (const o of opened) o.ws.close(1000);
  const r = await attemptRealtime(nodes[0].address, { key: k.key });
  assert.ok(isRefusal(r), 'the 21st attempt is refused');
  assert.equal(r.status, 429);
  assert.equal(r.body.error.type, 'requests');
  assert.match(r.body.error.message, /requests per minute \(rpm\): 20\/20 used/);
  assert.equal(r.headers['x-ratelimit-remaining-requests'], '0');
  assert.ok(Number(r.headers['retry-after']) >= 1);
});

test("the parallel limit holds across nodes: a one-at-a-time key's open socket on one node refuses a second on the other until it closes", async () => {
  const k = await gw.fundedKey({ tier: 'rt-one' });
  const first = await openRealtime(nodes[0].address, { key: k.key });
  const r = await attemptRealtime(nodes[1].address, { key: k.key });
  assert.ok(isRefusal(r), 'the second session is refused');
  assert.equal(r.status, 429);
  assert.equal(r.body.error.type, 'max_parallel_requests');
  first.ws.close(1000);
  await first.session.waitClosed();
  let again: Awaited<ReturnType<typeof attemptRealtime>> | undefined;
  await eventually(async () => !isRefusal((again = await attemptRealtime(nodes[1].address, { key: k.key }))), 'a session on the other node once the first closed', 5000);
  if (again && !isRefusal(again)) again.ws.close(1000);
});

test('fail-static: a node that loses the control plane keeps its open sockets and keeps serving them', async () => {
  const k = await gw.fundedKey({ tier: 'free', knownOn: [nodes[1]] });
  const s = await openRealtime(nodes[1].address, { key: k.key });
  await s.session.waitFor('session.created');
  await cp.proc.kill('SIGKILL');
  await nodes[1].proc.waitFor(/control plane connection lost/);
  s.session.say('are you there?');
  const done = await s.session.waitFor('response.done');
  assert.ok(done.response.usage.output_tokens > 0);
  assert.equal(s.session.closeCode, null);
  s.ws.close(1000);
  assert.equal(await s.session.waitClosed(), 1000);
});

test('fail-static with a maximum staleness: once a cut-off node passes it, its sockets close (1008) and attempts are refused', async (t) => {
  const strictGw = await startGateway(t, { controlPlane: { configYaml: configYaml((cfg) => (cfg.max_staleness_ms = 1500)) }, nodes: [{ nodeId: 'rt-strict' }] });
  const [strict, n] = [strictGw.cp, strictGw.node];
  const k = await strictGw.fundedKey({ tier: 'free' });
  const s = await openRealtime(n.address, { key: k.key });
  await s.session.waitFor('session.created');
  await strict.proc.kill('SIGKILL');
  const lostAt = Date.now();
  assert.equal(await s.session.waitClosed(10_000), 1008);
  assert.match(s.session.closeReason, /^invalid_api_key: this gateway node cannot currently verify API keys/);
  assert.ok(s.session.closedAt - lostAt >= 1000, 'kept open while within the staleness allowed');
  const r = await attemptRealtime(n.address, { key: k.key });
  assert.ok(isRefusal(r));
  assert.equal(r.status, 401);
});

test('one policy for what a key has open: past the maximum staleness an open HTTP event stream ends too, with the same reason as the socket beside it', async (t) => {
  // Before issue 22 only realtime sockets were ended at the staleness bound; HTTP streams ran on.
  const up = await startFakeUpstream();
  t.after(() => up.close());
  const strictGw = await startGateway(t, {
    controlPlane: {
      env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
      configYaml: configYaml((cfg) => {
        cfg.max_staleness_ms = 1500;
        addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['free']);
      }),
    },
    nodes: [{ nodeId: 'both-strict' }],
  });
  const n = strictGw.node;
  const k = await strictGw.fundedKey({ tier: 'free' });
  const s = await openRealtime(n.address, { key: k.key });
  await s.session.waitFor('session.created');
  up.setMode('hold-stream');
  const res = await fetch(`${n.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(k.key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'hold on' }] }),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  await reader.read();
  await up.waitForHeld(1);
  const upstreamLetGo = up.waitForClientClose();

  await strictGw.cp.proc.kill('SIGKILL');
  assert.equal(await s.session.waitClosed(10_000), 1008);
  assert.match(s.session.closeReason, /^invalid_api_key: this gateway node cannot currently verify API keys/);
  let rest = '';
  for (;;) {
    const r = await reader.read().catch(() => ({ done: true, value: undefined }));
    if (r.done) break;
    rest += Buffer.from(r.value!).toString();
  }
  const events = rest.split('\n\n').filter((e) => e.startsWith('data: {'));
  const last = JSON.parse(events[events.length - 1].slice('data: '.length));
  assert.equal(last.error.type, 'authentication_error');
  assert.match(last.error.message, /^This gateway node cannot currently verify API keys/);
  // The upstream call was cancelled at once, as for a revoked key.
  await upstreamLetGo;
  up.release();
});
