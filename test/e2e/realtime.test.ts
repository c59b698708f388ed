// Realtime sessions end to end: the official `openai` package's realtime WebSocket client against the
// demo model, and `ws` against a fake OpenAI-compatible realtime upstream; events both ways, usage
// from response.done billed to the organisation, upstream refusal and loss.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';
import { cliJsonAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { type Console } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { waitForUsageRows, waitForUsageTotals } from '../helpers/usage-db.js';
import { attemptRealtime, isRefusal, openRealtime } from '../helpers/realtime.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';

const UPSTREAM_KEY = 'sk-upstream-test-credential';
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
let upstream: FakeRealtimeUpstream;

const gw = gatewayFixture(async () => {
  upstream = await startFakeRealtimeUpstream();
  return {
    controlPlane: {
      env: { TOLLGATE_TEST_UPSTREAM_KEY: UPSTREAM_KEY },
      configYaml: configYaml((cfg) => {
        cfg.models.push({ id: 'rt-upstream', provider: 'openai', kind: 'realtime', upstream_model: 'gpt-realtime-test', input_usd_per_mtok: '10.00', output_usd_per_mtok: '40.00' });
        cfg.realtime_upstreams = [{ model: 'rt-upstream', url: upstream.url, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', connect_timeout_ms: 5000 }];
        cfg.tiers.free.models.push('rt-upstream');
        cfg.tiers.paid.models.push('rt-upstream');
      }),
    },
  };
}, () => {
  ({ cp, node, console: admin } = gw);
});
after(async () => {
  await upstream?.close();
});

test('the openai realtime client talks to the demo model through the gateway; usage is billed to the organisation', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const client = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  // The SDK always dials wss://; the test node speaks plain WebSocket, so the SDK's `ws` gets a plain
  // TCP connection to the same host and port (the Authorization header is the SDK's own).
  const [host, port] = [node.address.slice(0, node.address.lastIndexOf(':')), Number(node.address.slice(node.address.lastIndexOf(':') + 1))];
  const rt = new OpenAIRealtimeWS({ model: 'demo-realtime', options: { createConnection: () => connect({ host, port }) } as any }, client);
  const errors: unknown[] = [];
  rt.on('error', (e) => errors.push(e));
  const created = await new Promise<any>((resolve) => rt.on('session.created', resolve));
  assert.equal(created.session.model, 'demo-realtime');

  const deltas: string[] = [];
  rt.on('response.output_text.delta', (e) => deltas.push(e.delta));
  const responseCreated = new Promise<any>((resolve) => rt.on('response.created', resolve));
  const done = new Promise<any>((resolve) => rt.on('response.done', resolve));
  rt.send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'What is a toll gate?' }] } });
  rt.send({ type: 'response.create' });
  assert.equal((await responseCreated).response.status, 'in_progress');
  const finished = await done;
  assert.equal(finished.response.status, 'completed');
  assert.ok(deltas.length >= 2, `text deltas: ${deltas.length}`);
  assert.match(deltas.join(''), /You said: "What is a toll gate\?"/);
  const usage = finished.response.usage;
  assert.ok(usage.input_tokens > 0 && usage.output_tokens > 0);
  assert.equal(usage.total_tokens, usage.input_tokens + usage.output_tokens);
  assert.deepEqual(errors, []);
  const closed = new Promise<number>((resolve) => rt.socket.on('close', (code) => resolve(code)));
  rt.close({ code: 1000, reason: 'done' });
  assert.equal(await closed, 1000);

  // demo-realtime: 4.00 USD in, 16.00 USD out per million tokens.
  const cost = Math.ceil((usage.input_tokens * 4_000_000 + usage.output_tokens * 16_000_000) / 1_000_000);
  const [row] = await waitForUsageRows(cp.dbPath, k.keyId, 1);
  assert.equal(row.model, 'demo-realtime');
  assert.equal(row.path, '/v1/realtime');
  assert.equal(row.prompt_tokens, usage.input_tokens);
  assert.equal(row.completion_tokens, usage.output_tokens);
  assert.equal(row.cost_micros, cost);
  await eventually(async () => (await admin.getOrg({ orgId: k.orgId })).spendTotalMicros === cost, 'the organisation charged for the response');
  // The session is one request-log entry: status 101, its tokens and cost, the client's address.
  let session: any;
  await eventually(async () => (session = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['logs', '--key', k.keyId])).logs.find((l: any) => l.path === '/v1/realtime')) !== undefined, 'the session logged');
  assert.deepEqual([session.method, session.status, session.model, session.client_ip], ['GET', 101, 'demo-realtime', '127.0.0.1']);
  assert.deepEqual([session.prompt_tokens, session.completion_tokens], [usage.input_tokens, usage.output_tokens]);
  assert.equal(Math.round(Number(session.cost_usd) * 1_000_000), cost);
});

test('a fake upstream: the gateway dials it with the configured credential and model, relays both ways, bills response.done', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  upstream.usage = { input_tokens: 1000, output_tokens: 500 };
  const before = upstream.connections.length;
  const { session, headers } = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  assert.equal(headers['x-ratelimit-limit-requests'], '20', 'the 101 carries the rate headers');
  const conn = await upstream.waitForConnection(before + 1);
  assert.equal(conn.headers.authorization, `Bearer ${UPSTREAM_KEY}`, 'the upstream credential, never the client key');
  assert.equal(new URL(conn.url, 'ws://x').searchParams.get('model'), 'gpt-realtime-test');
  await session.waitFor('session.created');

  session.say('hello upstream');
  const done = await session.waitFor('response.done');
  assert.equal(done.response.usage.input_tokens, 1000);
  assert.deepEqual(
    session.events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta),
    ['Hello ', 'from ', 'upstream.'],
  );
  assert.deepEqual(conn.received.map((e) => e.type), ['conversation.item.create', 'response.create']);
  // A second response in the same session is billed on its own.
  session.send({ type: 'response.create' });
  await session.waitFor('response.done', 2);
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 2);
  const perResponse = Math.ceil((1000 * 10_000_000 + 500 * 40_000_000) / 1_000_000);
  assert.deepEqual(rows.map((r) => [r.model, r.requests, r.prompt_tokens, r.completion_tokens, r.cost_micros]), [['rt-upstream', 2, 2000, 1000, 2 * perResponse]]);
  await eventually(async () => (await admin.getOrg({ orgId: k.orgId })).spendTotalMicros === 2 * perResponse, 'both responses charged');

  // A client that tries to switch the session to another (cheaper or dearer) model is refused in-band.
  session.send({ type: 'session.update', session: { type: 'realtime', model: 'gpt-other' } });
  const err = await session.waitFor('error');
  assert.equal(err.error.code, 'model_not_allowed');
  assert.ok(!conn.received.some((e) => e.type === 'session.update'), 'the switch never reached the upstream');

  session.ws.close(1000, 'bye');
  assert.equal(await session.waitClosed(), 1000);
  await eventually(async () => conn.closed, 'the upstream connection closed with the client');
});

test('a model switch cannot slip past the gateway spelled with JSON escapes or sent as a binary frame', async () => {
  // Before: the gateway looked for the literal text "session.update" in text frames only, so
  // `"session.upd\u0061te"` (the same event once parsed) and a binary frame carrying the event reached
  // the upstream: a session billed as one model could be switched to another.
  const k = await gw.fundedKey({ tier: 'free' });
  const before = upstream.connections.length;
  const { session } = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  const conn = await upstream.waitForConnection(before + 1);
  await session.waitFor('session.created');
  session.ws.send('{"type":"session.upd\\u0061te","session":{"type":"realtime","model":"gpt-other"}}');
  assert.equal((await session.waitFor('error')).error.code, 'model_not_allowed');
  session.ws.send(Buffer.from(JSON.stringify({ type: 'session.update', session: { model: 'gpt-other' } })), { binary: true });
  assert.equal((await session.waitFor('error', 2)).error.code, 'model_not_allowed');
  // A frame after them shows the upstream has read everything the client sent before it.
  session.send({ type: 'response.create' });
  await session.waitFor('response.done');
  assert.ok(!conn.received.some((e) => e.type === 'session.update'), 'no escaped switch reached the upstream');
  assert.deepEqual(conn.receivedBinary, [], 'no binary switch reached the upstream');
  session.ws.close(1000, 'bye');
  await session.waitClosed();
});

test('the openai realtime client through the gateway to a fake upstream: events both ways, usage billed', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  upstream.usage = { input_tokens: 40, output_tokens: 60 };
  const client = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const [host, port] = [node.address.slice(0, node.address.lastIndexOf(':')), Number(node.address.slice(node.address.lastIndexOf(':') + 1))];
  const rt = new OpenAIRealtimeWS({ model: 'rt-upstream', options: { createConnection: () => connect({ host, port }) } as any }, client);
  rt.on('error', () => {});
  await new Promise((resolve) => rt.on('session.created', resolve));
  const done = new Promise<any>((resolve) => rt.on('response.done', resolve));
  rt.send({ type: 'response.create' });
  assert.equal((await done).response.usage.total_tokens, 100);
  rt.close({ code: 1000, reason: 'done' });
  const [row] = await waitForUsageRows(cp.dbPath, k.keyId, 1);
  assert.deepEqual([row.model, row.prompt_tokens, row.completion_tokens, row.cost_micros], ['rt-upstream', 40, 60, Math.ceil((40 * 10_000_000 + 60 * 40_000_000) / 1_000_000)]);
});

test('an upstream that refuses the handshake: the client gets 502 in the model shape before any upgrade, and nothing is billed', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  upstream.refuseWith = 403;
  try {
    const r = await attemptRealtime(node.address, { key: k.key, model: 'rt-upstream' });
    assert.ok(isRefusal(r));
    assert.equal(r.status, 502);
    assert.equal(r.body.error.type, 'api_error');
    assert.equal(r.body.error.code, '502');
    assert.match(r.body.error.message, /refused the connection with HTTP 403/);
    assert.equal(r.headers['x-ratelimit-limit-requests'], '20');
  } finally {
    upstream.refuseWith = 0;
  }
  assert.equal((await admin.getOrg({ orgId: k.orgId })).spendTotalMicros, 0);
});

test('a key revoked while its upstream handshake is in progress never gets a session', async () => {
  // Before: the key was checked only before the upstream was dialled; revoked while the upstream's
  // handshake was under way (up to its connect timeout), the client was upgraded anyway and its session
  // stayed open after `tollgate key revoke` had returned, until some later change made the node look again.
  const k = await gw.fundedKey({ tier: 'free' });
  upstream.holdHandshakes = true;
  const attempt = attemptRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  try {
    await upstream.waitForHeldHandshakes(1);
    await admin.revokeKey({ keyId: k.keyId });
  } finally {
    upstream.releaseHandshakes();
  }
  const r = await attempt;
  if (!isRefusal(r)) {
    const closed = await Promise.race([r.session.waitClosed(), new Promise((resolve) => setTimeout(() => resolve('still open'), 3000))]);
    r.ws.terminate();
    assert.fail(`the socket was accepted after the revocation (then: ${closed})`);
  }
  assert.equal(r.status, 401, JSON.stringify(r.body));
  assert.equal(r.body.error.type, 'authentication_error');
});

test('an upstream lost mid-session closes the client with 1014 and a reason', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const before = upstream.connections.length;
  const { session } = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  await upstream.waitForConnection(before + 1);
  await session.waitFor('session.created');
  session.send({ type: 'test.drop' });
  assert.equal(await session.waitClosed(), 1014);
  assert.match(session.closeReason, /upstream connection lost/);
  // The key goes on: another session opens (and a plain close is 1000).
  const again = await openRealtime(node.address, { key: k.key });
  again.ws.close(1000);
  assert.equal(await again.session.waitClosed(), 1000);
});

test('an upstream message over the 8 MiB limit ends the session with 1009 and says so', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const { session } = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  await session.waitFor('session.created');
  session.send({ type: 'test.big', bytes: 9 * 1024 * 1024 });
  assert.equal(await session.waitClosed(), 1009);
  assert.match(session.closeReason, /^upstream: .*payload/i);
});
