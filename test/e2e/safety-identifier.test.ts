// A safety identifier per customer (issue 34, deliverable 5; docs/safety-identifier.md). Before: the
// upstream received nothing saying which customer sent a request, so violations it could not trace to
// one end user counted against the operator's whole organisation, every customer with it. Now chat and
// Responses requests go upstream with a `safety_identifier` stable per project (across keys and nodes),
// different between projects, revealing no id; a client's own value (and `user`) namespaced under it;
// and the operator maps a value an upstream reports back to its project with `tollgate safety-id resolve`.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import type { DemoKey } from '../helpers/console.js';
import { startFakePricedUpstream, type FakePricedUpstream } from '../helpers/fake-priced-upstream.js';
import { launchGateway, type Gateway } from '../helpers/gateway-fixture.js';
import { bearer, request } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, stopAll, type DataPlane } from '../helpers/processes.js';
import { assertFails } from '../helpers/console-cli.js';
import { openRealtime } from '../helpers/realtime.js';

let up: FakePricedUpstream;
let gw: Gateway;
/** Project A with two keys, project C in A's organisation, project B in another. */
let a1: DemoKey;
let a2: DemoKey;
let c: DemoKey;
let b: DemoKey;

const SID = /^tg_[A-Za-z0-9_-]{22}$/;
const NAMESPACED = /^tg_[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{22}$/;

before(async () => {
  up = await startFakePricedUpstream();
  const yaml = configYaml((cfg) => {
    addUpstreamModel(cfg, 'up-safe', up.baseUrl, ['paid']);
    addUpstreamModel(cfg, 'up-safe-key', up.baseUrl, ['paid'], { safety_identifier: 'key' });
    addUpstreamModel(cfg, 'up-safe-org', up.baseUrl, ['paid'], { safety_identifier: 'organisation' });
    addUpstreamModel(cfg, 'up-unsafe', up.baseUrl, ['paid'], { safety_identifier: 'off' });
  });
  gw = await launchGateway({ controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } }, nodes: 2 });
  a1 = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  a2 = await gw.fundedKey({ tier: 'paid', orgId: a1.orgId, projectId: a1.projectId });
  c = await gw.fundedKey({ tier: 'paid', orgId: a1.orgId, name: 'other project' });
  b = await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
});

after(async () => {
  await stopAll();
  await up?.close();
});

/** Sends one request and returns the body the upstream received. */
async function sent(k: DemoKey, node: DataPlane, path: string, body: Record<string, unknown>): Promise<any> {
  const before = up.requests.length;
  const r = await request(`${node.url}${path}`, { method: 'POST', headers: bearer(k.key), json: body });
  assert.equal(r.status, 200, r.text);
  assert.equal(up.requests.length, before + 1);
  return up.requests[before].body;
}

const chat = (model: string, extra: Record<string, unknown> = {}) => ({ model, messages: [{ role: 'user', content: 'Hi' }], ...extra });
const responses = (model: string, extra: Record<string, unknown> = {}) => ({ model, input: 'Hi', ...extra });

/** No id of the caller, nor its key, anywhere in what the upstream received. */
function assertRevealsNothing(body: unknown, k: DemoKey): void {
  const text = JSON.stringify(body);
  for (const id of [k.key, k.keyId, k.projectId, k.orgId, a1.accountId, b.accountId].filter((x) => x)) assert.ok(!text.includes(id), `the upstream saw ${id}`);
}

test('one project: the same safety_identifier from two keys on two nodes, chat and Responses; another project a different one; no id revealed', async () => {
  const [n0, n1] = gw.nodes;
  const bodies = [
    await sent(a1, n0, '/v1/chat/completions', chat('up-safe')),
    await sent(a2, n1, '/v1/chat/completions', chat('up-safe', { stream: true })),
    await sent(a1, n1, '/v1/responses', responses('up-safe')),
    await sent(a2, n0, '/v1/responses', responses('up-safe', { stream: true })),
  ];
  const sid = bodies[0].safety_identifier;
  assert.match(sid, SID);
  for (const body of bodies) assert.equal(body.safety_identifier, sid);
  assert.equal(bodies[0].user, undefined, 'no user field added');
  for (const [i, body] of bodies.entries()) assertRevealsNothing(body, i % 2 === 0 ? a1 : a2);
  const other = await sent(b, n0, '/v1/chat/completions', chat('up-safe'));
  assert.match(other.safety_identifier, SID);
  assert.notEqual(other.safety_identifier, sid);
  assertRevealsNothing(other, b);
  // A project of the same organisation is another project.
  assert.notEqual((await sent(c, n1, '/v1/responses', responses('up-safe'))).safety_identifier, sid);
});

test("a client's own safety_identifier and user are namespaced under its project's, never passed as they are", async () => {
  const [n0, n1] = gw.nodes;
  const base = (await sent(a1, n0, '/v1/chat/completions', chat('up-safe'))).safety_identifier;
  const own = await sent(a1, n0, '/v1/chat/completions', chat('up-safe', { safety_identifier: 'alice@example.com' }));
  assert.match(own.safety_identifier, NAMESPACED);
  assert.ok(own.safety_identifier.startsWith(`${base}.`));
  assert.ok(own.safety_identifier.length <= 64);
  assert.ok(!JSON.stringify(own).includes('alice'), 'the client value never reaches the upstream');
  // Stable: the same end user from another key of the project, on another node, over the Responses API.
  assert.equal((await sent(a2, n1, '/v1/responses', responses('up-safe', { safety_identifier: 'alice@example.com' }))).safety_identifier, own.safety_identifier);
  // Another end user of the project, and the same end user name from another project: other values.
  assert.notEqual((await sent(a1, n0, '/v1/chat/completions', chat('up-safe', { safety_identifier: 'carol' }))).safety_identifier, own.safety_identifier);
  const elsewhere = (await sent(b, n0, '/v1/chat/completions', chat('up-safe', { safety_identifier: 'alice@example.com' }))).safety_identifier;
  assert.notEqual(elsewhere, own.safety_identifier);
  // The older `user` field: namespaced too, and it names the safety identifier when none was sent.
  const user = await sent(a1, n1, '/v1/responses', responses('up-safe', { user: 'bob', stream: true }));
  assert.match(user.user, NAMESPACED);
  assert.equal(user.safety_identifier, user.user);
  assert.ok(user.user.startsWith(`${base}.`));
  assert.ok(!JSON.stringify(user).includes('bob'));
  const both = await sent(a1, n0, '/v1/chat/completions', chat('up-safe', { user: 'bob', safety_identifier: 'alice@example.com' }));
  assert.equal(both.safety_identifier, own.safety_identifier);
  assert.equal(both.user, user.user);
});

test("WebSocket mode: each create goes upstream with the project's identifier, a client's own namespaced", async () => {
  const [n0, n1] = gw.nodes;
  const project = (await sent(a1, n0, '/v1/chat/completions', chat('up-safe'))).safety_identifier;
  const own = (await sent(a1, n0, '/v1/chat/completions', chat('up-safe', { safety_identifier: 'alice@example.com' }))).safety_identifier;
  const s = await openRealtime(n1.address, { key: a2.key, model: 'up-safe', path: '/v1/responses' });
  const before = up.requests.length;
  s.session.send({ type: 'response.create', input: 'over the socket' });
  await s.session.waitFor('response.completed');
  s.session.send({ type: 'response.create', input: 'again', safety_identifier: 'alice@example.com' });
  await s.session.waitFor('response.completed', 2);
  s.ws.close(1000);
  await s.session.waitClosed();
  const creates = up.requests.slice(before).map((r) => r.body);
  assert.deepEqual(creates.map((c) => c.safety_identifier), [project, own]);
  for (const c of creates) assertRevealsNothing(c, a2);
  assert.ok(!JSON.stringify(creates[1]).includes('alice'));
});

test('per key and per organisation by config; off sends none', async () => {
  const [n0, n1] = gw.nodes;
  const k1 = (await sent(a1, n0, '/v1/chat/completions', chat('up-safe-key'))).safety_identifier;
  assert.match(k1, SID);
  assert.equal((await sent(a1, n1, '/v1/responses', responses('up-safe-key'))).safety_identifier, k1);
  assert.notEqual((await sent(a2, n0, '/v1/chat/completions', chat('up-safe-key'))).safety_identifier, k1);
  const org = (await sent(a1, n0, '/v1/chat/completions', chat('up-safe-org'))).safety_identifier;
  assert.equal((await sent(c, n1, '/v1/chat/completions', chat('up-safe-org'))).safety_identifier, org, "the organisation's other project");
  assert.notEqual((await sent(b, n0, '/v1/chat/completions', chat('up-safe-org'))).safety_identifier, org);
  assert.equal((await sent(a1, n0, '/v1/chat/completions', chat('up-unsafe'))).safety_identifier, undefined);
});

test('tollgate safety-id resolve maps a value an upstream reported back to its project, key or organisation', async () => {
  const op = gw.cp.secrets.operatorToken;
  const [n0] = gw.nodes;
  const project = (await sent(a2, n0, '/v1/chat/completions', chat('up-safe'))).safety_identifier;
  const r = await cliJsonAsync(gw.cp, op, ['safety-id', 'resolve', project]);
  assert.deepEqual(r, { subject: 'project', project_id: a1.projectId, org_id: a1.orgId, key_id: '' });
  // A client's end user: the project's part names the project.
  const own = (await sent(b, n0, '/v1/chat/completions', chat('up-safe', { user: 'mallory' }))).safety_identifier;
  assert.equal((await cliJsonAsync(gw.cp, op, ['safety-id', 'resolve', own])).project_id, b.projectId);
  const key = (await sent(a2, n0, '/v1/chat/completions', chat('up-safe-key'))).safety_identifier;
  assert.deepEqual(await cliJsonAsync(gw.cp, op, ['safety-id', 'resolve', key]), { subject: 'key', project_id: a2.projectId, org_id: a2.orgId, key_id: a2.keyId });
  const org = (await sent(c, n0, '/v1/chat/completions', chat('up-safe-org'))).safety_identifier;
  assert.deepEqual(await cliJsonAsync(gw.cp, op, ['safety-id', 'resolve', org]), { subject: 'organisation', project_id: '', org_id: a1.orgId, key_id: '' });
  const table = await runCliAsync(gw.cp, op, ['safety-id', 'resolve', project]);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, new RegExp(`project: ${a1.projectId}`));
  assertFails(await runCliAsync(gw.cp, op, ['safety-id', 'resolve', 'tg_AAAAAAAAAAAAAAAAAAAAAA']), 404, 'an unknown value');
  assertFails(await runCliAsync(gw.cp, op, ['safety-id', 'resolve', 'not-an-identifier']), 400, 'not an identifier');
  // The operator's only: an organisation's owner is refused.
  const owner = await gw.console.createAccount({ name: 'not-operator' });
  assertFails(await runCliAsync(gw.cp, owner.token, ['safety-id', 'resolve', project]), 403, 'a non-operator');
});
