// The Responses API's WebSocket mode on /v1/responses (?model=MODEL): `response.create` events over
// one socket, each response billed on its final event, one parallel slot held while the socket is
// open, the socket closed on revocation, and stored responses still the creating project's own.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { tokenCostMicros } from '../../proto/lib/money.js';
import { configYaml } from '../helpers/config.js';
import { consoleClient, createKey, type Console, type DemoKey } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, request } from '../helpers/http.js';
import { runCliAsync, startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { attemptRealtime, isRefusal, openRealtime } from '../helpers/realtime.js';
import { waitForUsageTotals } from '../helpers/usage-db.js';

let cp: ControlPlane;
let node: DataPlane;
let admin: Console;

const open = (k: DemoKey, model = 'demo-chat') => openRealtime(node.address, { key: k.key, model, path: '/v1/responses' });

before(async () => {
  cp = await startControlPlane({
    configYaml: configYaml((cfg) => {
      cfg.tiers['one-at-a-time'] = { rpm: 300, tpm: 1000000, max_parallel_requests: 1, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['demo-chat'] };
    }),
  });
  node = await startDataPlane(cp);
  admin = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  admin.close();
  await stopAll();
});

test('two responses on one socket: each answered with the Responses events and billed on response.completed', async () => {
  const k = await createKey(admin);
  await waitUntilKnown(node.url, k.key);
  const s = await open(k);
  s.session.send({ type: 'response.create', model: 'demo-chat', input: 'first question' });
  const one = await s.session.waitFor('response.completed', 1);
  s.session.send({ type: 'response.create', input: [{ role: 'user', content: 'second question' }] });
  const two = await s.session.waitFor('response.completed', 2);
  assert.equal(s.session.count('response.created'), 2);
  assert.ok(s.session.count('response.output_text.delta') >= 2);
  assert.match(one.response.output[0].content[0].text, /first question/);
  assert.match(two.response.output[0].content[0].text, /second question/);
  s.ws.close(1000);
  await s.session.waitClosed();
  const rows = await waitForUsageTotals(cp.dbPath, k.keyId, 2);
  const u = [one.response.usage, two.response.usage];
  const cost = u.reduce((n, x) => n + tokenCostMicros(x.input_tokens, x.output_tokens, 500_000, 1_500_000), 0);
  assert.deepEqual(
    rows.map((r) => [r.model, r.requests, r.prompt_tokens, r.completion_tokens, r.cost_micros]),
    [['demo-chat', 2, u[0].input_tokens + u[1].input_tokens, u[0].output_tokens + u[1].output_tokens, cost]],
  );
  // Created over the socket, stored for its project: readable by it, 404 for another project.
  const got = await request(`${node.url}/v1/responses/${one.response.id}`, { headers: bearer(k.key) });
  assert.equal(got.status, 200, got.text);
  const other = await createKey(admin, { orgId: k.orgId });
  await waitUntilKnown(node.url, other.key);
  assert.equal((await request(`${node.url}/v1/responses/${one.response.id}`, { headers: bearer(other.key) })).status, 404);
  const o = await open(other);
  o.session.send({ type: 'response.create', input: 'go on', previous_response_id: one.response.id });
  const err = await o.session.waitFor('error');
  // The HTTP refusal's status, code and param (issue 32: a turn is refused as a request is).
  assert.deepEqual([err.status, err.error.code, err.error.param], [404, '404', 'previous_response_id']);
  // Another model than the socket's is refused (the socket is billed at its model's prices).
  o.session.send({ type: 'response.create', model: 'demo-chat-pro', input: 'x' });
  const err2 = await o.session.waitFor('error', 2);
  assert.equal(err2.error.param, 'model');
  assert.equal(o.session.count('response.created'), 0);
  o.ws.close(1000);
});

test('refusals before the upgrade are plain HTTP answers in Shape A', async () => {
  const k = await createKey(admin, { allowedModels: ['demo-embed'] });
  await waitUntilKnown(node.url, k.key);
  const notAllowed = await attemptRealtime(node.address, { key: k.key, model: 'demo-chat', path: '/v1/responses' });
  assert.ok(isRefusal(notAllowed));
  assert.equal(notAllowed.status, 401);
  assert.equal(notAllowed.body.error.param, 'model');
  const noKey = await attemptRealtime(node.address, { model: 'demo-chat', path: '/v1/responses' });
  assert.ok(isRefusal(noKey));
  assert.equal(noKey.status, 401);
  const unknown = await attemptRealtime(node.address, { key: k.key, model: 'nope', path: '/v1/responses' });
  assert.ok(isRefusal(unknown));
  assert.equal(unknown.status, 400);
  assert.equal(unknown.body.error.param, 'model');
});

test('the socket holds one parallel slot while open and gives it back when closed', async () => {
  const k = await createKey(admin, { tier: 'one-at-a-time' });
  await waitUntilKnown(node.url, k.key);
  const s = await open(k);
  const post = () => request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'demo-chat', input: 'x' } });
  const busy = await post();
  assert.equal(busy.status, 429, busy.text);
  assert.equal(busy.body.error.type, 'max_parallel_requests');
  assert.ok(Number(busy.headers.get('retry-after')) >= 1);
  s.ws.close(1000);
  await s.session.waitClosed();
  const free = await post();
  assert.equal(free.status, 200, free.text);
});

test('revoking the key closes its open socket (1008, revoked)', async () => {
  const k = await createKey(admin);
  await waitUntilKnown(node.url, k.key);
  const s = await open(k);
  const r = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'key', 'revoke', k.keyId]);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(await s.session.waitClosed(5000), 1008);
  assert.match(s.session.closeReason, /revoked/);
});
