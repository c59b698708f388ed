// Every refusal of a realtime connection attempt happens before the upgrade, as a plain HTTP answer in
// the model endpoints' shape (A) with the key's rate headers once the key is known.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cliJsonAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { type Console } from '../helpers/console.js';
import { assertShapeA as assertShapeABody, gatewayFixture } from '../helpers/gateway-fixture.js';
import { configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { attemptRealtime, isRefusal, openRealtime, type Opened, type Refusal } from '../helpers/realtime.js';

let cp: ControlPlane;
let node: DataPlane;
let admin: Console;

const gw = gatewayFixture(() => ({
  controlPlane: {
    configYaml: configYaml((cfg) => {
      // One session at a time per key, and a tier whose plan has no realtime model.
      cfg.tiers['rt-one'] = { rpm: 300, tpm: 1000000, max_parallel_requests: 1, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['demo-realtime'] };
      cfg.tiers['chat-only'] = { rpm: 300, tpm: 1000000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['demo-chat'] };
    }),
  },
}), () => {
  ({ cp, node, console: admin } = gw);
});

async function refused(r: Promise<Opened | Refusal>): Promise<Refusal> {
  const res = await r;
  if (!isRefusal(res)) {
    res.ws.close();
    assert.fail('the socket was accepted');
  }
  return res;
}

function assertShapeA(r: Refusal, status: number, type: string): void {
  assertShapeABody(r, status, { type });
  assert.equal(r.headers['content-type'], 'application/json');
}

function assertRateHeaders(r: Refusal, rpm: number): void {
  assert.equal(r.headers['x-ratelimit-limit-requests'], String(rpm));
  assert.ok(r.headers['x-ratelimit-remaining-requests'] !== undefined);
  assert.ok(r.headers['x-ratelimit-limit-tokens'] !== undefined);
}

test('no credential: 401 authentication_error, before the socket is accepted', async () => {
  const r = await refused(attemptRealtime(node.address));
  assertShapeA(r, 401, 'authentication_error');
  assert.match(r.body.error.message, /Authorization: Bearer/);
  const malformed = await refused(attemptRealtime(node.address, { headers: { authorization: 'Basic abc' } }));
  assertShapeA(malformed, 401, 'authentication_error');
});

test('unknown key: 401 authentication_error', async () => {
  const r = await refused(attemptRealtime(node.address, { key: 'sk-tollgate-doesnotexist0000000000000000000000000' }));
  assertShapeA(r, 401, 'authentication_error');
  assert.equal(r.headers['x-ratelimit-limit-requests'], undefined, 'an unknown key has no rate headers');
});

test('a key offered as a WebSocket subprotocol (browser style) is refused, even beside a valid Authorization header', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const r = await refused(attemptRealtime(node.address, { key: k.key, protocols: ['realtime', `openai-insecure-api-key.${k.key}`] }));
  assertShapeA(r, 401, 'authentication_error');
  assert.match(r.body.error.message, /Sec-WebSocket-Protocol/);
  assert.ok(!JSON.stringify(r).includes(k.key), 'the key is never echoed');
  // A plain subprotocol is fine and answered.
  const ok = await openRealtime(node.address, { key: k.key, protocols: ['realtime'] });
  assert.equal(ok.ws.protocol, 'realtime');
  ok.ws.close();
});

test('revoked key: 401 authentication_error', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  await admin.revokeKey({ keyId: k.keyId });
  const r = await refused(attemptRealtime(node.address, { key: k.key }));
  assertShapeA(r, 401, 'authentication_error');
});

test('model not allowed by allowed_models, or outside the plan: 401 model_not_allowed with rate headers; missing, unknown or non-realtime model: 400', async () => {
  const narrow = await gw.fundedKey({ tier: 'free', allowedModels: ['demo-chat'] });
  const r = await refused(attemptRealtime(node.address, { key: narrow.key }));
  assertShapeA(r, 401, 'model_not_allowed');
  assert.equal(r.body.error.param, 'model');
  assert.match(r.body.error.message, /allowed_models/);
  assertRateHeaders(r, 20);
  assert.equal(r.headers['x-ratelimit-remaining-requests'], '20', 'a refused attempt costs no request');

  const planless = await gw.fundedKey({ tier: 'chat-only' });
  const p = await refused(attemptRealtime(node.address, { key: planless.key }));
  assertShapeA(p, 401, 'model_not_allowed');
  assert.match(p.body.error.message, /plan/);

  const k = await gw.fundedKey({ tier: 'free' });
  for (const [model, pattern] of [
    [null, /Missing required query parameter: model/],
    ['no-such-model', /does not exist/],
    ['demo-chat', /not a realtime model/],
  ] as const) {
    const bad = await refused(attemptRealtime(node.address, { key: k.key, model }));
    assertShapeA(bad, 400, 'invalid_request_error');
    assert.equal(bad.body.error.param, 'model');
    assert.match(bad.body.error.message, pattern);
  }
});

test('blocked organisation: 401 insufficient_quota', async () => {
  // A paid organisation with no credit has nothing to spend.
  const paid = await gw.fundedKey({ tier: 'paid' });
  const r = await refused(attemptRealtime(node.address, { key: paid.key }));
  assertShapeA(r, 401, 'insufficient_quota');
  assertRateHeaders(r, 300);
});

test('a malformed path is 400 bad_path before the credential is looked at', async () => {
  const r = await refused(attemptRealtime(node.address, { path: '/v1/realtime/a%2Fb' }));
  assert.equal(r.status, 400);
  assert.equal(r.body.error.code, 'bad_path');
});

test("the key's parallel limit: the second socket of a one-at-a-time key gets 429 max_parallel_requests; closing the first frees the slot", async () => {
  const k = await gw.fundedKey({ tier: 'rt-one' });
  const first = await openRealtime(node.address, { key: k.key });
  const r = await refused(attemptRealtime(node.address, { key: k.key }));
  assertShapeA(r, 429, 'max_parallel_requests');
  assert.equal(r.body.error.param, null);
  assert.match(r.body.error.message, /max parallel requests: 1\/1/);
  assert.ok(Number(r.headers['retry-after']) >= 1);
  assertRateHeaders(r, 300);
  first.ws.close(1000);
  await first.session.waitClosed();
  // The slot is released when the socket closes (eventually: the close reaches the node first).
  let again: Opened | Refusal | undefined;
  await eventually(async () => {
    again = await attemptRealtime(node.address, { key: k.key });
    return !isRefusal(again);
  }, 'a new session after the first closed', 5000);
  (again as Opened).ws.close();
});

test('the 61st connection attempt in a minute from one IP: 429 api_error without param, with retry-after', async () => {
  // From a loopback address of its own, so the other tests' attempts do not count here.
  const localAddress = '127.0.0.61';
  const statuses: number[] = [];
  for (let i = 0; i < 60; i += 10) {
    const batch = await Promise.all(Array.from({ length: 10 }, () => attemptRealtime(node.address, { key: 'sk-tollgate-unknown', localAddress })));
    statuses.push(...batch.map((b) => (isRefusal(b) ? b.status : 101)));
  }
  assert.ok(statuses.every((s) => s === 401), `60 attempts pass the edge: ${statuses.join(',')}`);
  const r = await refused(attemptRealtime(node.address, { key: 'sk-tollgate-unknown', localAddress }));
  assert.equal(r.status, 429);
  assert.equal(r.body.error.type, 'api_error');
  assert.equal(r.body.error.code, '429');
  assert.ok(!('param' in r.body.error));
  const retry = Number(r.headers['retry-after']);
  assert.ok(retry >= 1 && retry <= 60, `retry-after ${retry}`);
  // Another address is not affected.
  const other = await refused(attemptRealtime(node.address, { key: 'sk-tollgate-unknown', localAddress: '127.0.0.62' }));
  assert.equal(other.status, 401);
});

test("refused realtime attempts of a known key, and a revoked key's attempts, are in the key's request log", async () => {
  // Before: only HTTP requests were logged against a key: a realtime attempt refused before the
  // upgrade (model not allowed, bad model, blocked, 429) or made with a revoked key left no trace, so
  // the leak procedure ("read the request logs of the key between leak and revoke") missed an attacker
  // who used the leaked key on /v1/realtime.
  const k = await gw.fundedKey({ tier: 'free', allowedModels: ['demo-chat'] });
  assertShapeA(await refused(attemptRealtime(node.address, { key: k.key, headers: { 'user-agent': 'rt-attacker/1' } })), 401, 'model_not_allowed');
  assertShapeA(await refused(attemptRealtime(node.address, { key: k.key, model: 'no-such-model' })), 400, 'invalid_request_error');
  await admin.revokeKey({ keyId: k.keyId });
  assertShapeA(await refused(attemptRealtime(node.address, { key: k.key })), 401, 'authentication_error');
  let logs: any[] = [];
  // (waitUntilKnown's own probe is in the log too.)
  const realtimeLogs = async () => (await cliJsonAsync(cp, cp.secrets.operatorToken, ['logs', '--key', k.keyId])).logs.filter((l: any) => l.path === '/v1/realtime');
  await eventually(async () => (logs = await realtimeLogs()).length >= 3, 'three attempts logged');
  const rows = logs.map((l) => [l.method, l.path, l.status, l.reason]).sort((a, b) => Number(a[2]) - Number(b[2]) || String(a[3]).localeCompare(String(b[3])));
  assert.deepEqual(rows, [
    ['GET', '/v1/realtime', 400, 'invalid_request'],
    ['GET', '/v1/realtime', 401, 'authentication_error'],
    ['GET', '/v1/realtime', 401, 'model_not_allowed'],
  ]);
  assert.ok(logs.some((l) => l.user_agent === 'rt-attacker/1'));
  assert.ok(logs.every((l) => l.client_ip === '127.0.0.1'));
});
