// Key expiry end to end: nodes hold a key's expiry and refuse it on their own (one of them cut off
// from the control plane), the control plane then revokes it with revoked_reason "expired", the
// organisation's maximum lifetime, `key list --expiring-within`, and the key.expiring webhook.
import { startTcpRelay, type TcpRelay } from '../helpers/tcp-relay.js';
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { configYaml } from '../helpers/config.js';
import { consoleClient, type Console } from '../helpers/console.js';
import { bearer, request, setClock } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { within } from '../helpers/data-plane.js';

let cp: ControlPlane;
let nodeA: DataPlane;
let nodeB: DataPlane;
let proxy: TcpRelay;
let op: Console;
let recv: WebhookReceiver;
let orgId = '';
let projectId = '';
let owner = { id: '', token: '' };


before(async () => {
  recv = await startWebhookReceiver();
  cp = await startControlPlane({
    env: { EXPIRY_HOOK_SECRET: recv.secret },
    configYaml: configYaml((cfg) => void (cfg.webhooks = [{ url: recv.url, secret_env: 'EXPIRY_HOOK_SECRET', events: ['key.expiring', 'key.revoked'] }])),
  });
  proxy = await startTcpRelay(cp.address);
  const clocked = { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } };
  nodeA = await startDataPlane(cp, { ...clocked, nodeId: 'node-a' });
  nodeB = await startDataPlane({ address: proxy.address, secrets: cp.secrets }, { ...clocked, nodeId: 'node-b' });
  op = consoleClient(cp.address, cp.secrets.operatorToken);
  const acct = await op.createAccount({ name: 'owner' });
  owner = { id: acct.account!.id, token: acct.token };
  orgId = (await op.createOrg({ name: 'expiring', ownerAccountId: owner.id, tier: 'free' })).id;
  projectId = (await op.createProject({ orgId, name: 'p' })).id;
});
after(async () => {
  op?.close();
  await stopAll();
  await proxy?.close();
  await recv?.close();
});

const models = (node: DataPlane, key: string) => request(`${node.url}/v1/models`, { headers: bearer(key) });

test('a key expires on both nodes, one of them cut off from the control plane, and is then revoked as expired', async () => {
  const created = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'hour', '--expires-in', '1h']);
  const expiresAtMs = Date.parse(created.expires_at);
  assert.ok(Math.abs(expiresAtMs - (Date.now() + 3_600_000)) < 120_000, created.expires_at);
  assert.equal((await cliJsonAsync(cp, owner.token, ['key', 'show', created.id])).expires_at, created.expires_at);
  assert.equal((await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId])).keys.find((k: any) => k.id === created.id).expires_at, created.expires_at);
  // Both nodes learn the key (B through the relay) and serve it.
  assert.ok(await within(5000, async () => (await models(nodeA, created.key)).status === 200 && (await models(nodeB, created.key)).status === 200));

  proxy.cut();
  assert.ok(await within(10_000, async () => !(await op.listNodes()).nodes.some((n) => n.id === 'node-b' && n.connected)), 'node B is cut off');
  // A second before expiry both still serve it; at expiry both refuse it, B with no control plane.
  for (const n of [nodeA, nodeB]) await setClock(n.adminUrl!, { now_ms: expiresAtMs - 1000 });
  for (const n of [nodeA, nodeB]) assert.equal((await models(n, created.key)).status, 200);
  for (const n of [nodeA, nodeB]) await setClock(n.adminUrl!, { now_ms: expiresAtMs });
  for (const n of [nodeA, nodeB]) {
    const res = await models(n, created.key);
    assert.equal(res.status, 401);
    assert.equal(res.body.error.type, 'authentication_error');
  }
  // The control plane's own clock has not reached it: the record is still active.
  assert.equal((await cliJsonAsync(cp, owner.token, ['key', 'show', created.id])).status, 'active');

  // A key that expires for real in two seconds: the control plane revokes it through the ordinary path.
  const short = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'short', '--expires-in', '2s']);
  assert.ok(await within(20_000, async () => (await op.getKey({ keyId: short.id })).status === 'revoked'));
  const shown = await cliJsonAsync(cp, owner.token, ['key', 'show', short.id]);
  assert.equal(shown.revoked_reason, 'expired');
  assert.ok(Date.parse(shown.revoked_at) >= Date.parse(short.expires_at));
  const hook = await recv.waitFor((r) => r.some((w) => w.type === 'key.revoked' && w.data.key_id === short.id));
  assert.equal(hook.find((w) => w.type === 'key.revoked' && w.data.key_id === short.id)!.data.revoked_reason, 'expired');
  // A key revoked by hand says so.
  const manual = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'manual']);
  assert.equal(manual.expires_at, null);
  await cliJsonAsync(cp, owner.token, ['key', 'revoke', manual.id]);
  assert.equal((await cliJsonAsync(cp, owner.token, ['key', 'show', manual.id])).revoked_reason, 'revoked');
});

test('an organisation key policy gives keys its maximum lifetime and refuses longer ones', async () => {
  const member = await op.createAccount({ name: 'member' });
  await op.addMember({ orgId, accountId: member.account!.id, role: 'member' });
  assert.match((await runCliAsync(cp, member.token, ['org', 'set-key-policy', orgId, '--max-lifetime', '90d'])).stderr, /^403 /);
  assert.deepEqual(await cliJsonAsync(cp, owner.token, ['org', 'set-key-policy', orgId, '--max-lifetime', '90d']), { org_id: orgId, max_lifetime_sec: 90 * 86_400 });
  const defaulted = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'policy']);
  assert.ok(Math.abs(Date.parse(defaulted.expires_at) - (Date.now() + 90 * 86_400_000)) < 120_000, defaulted.expires_at);
  const tooLong = await runCliAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--expires-in', '100d']);
  assert.equal(tooLong.code, 1);
  assert.match(tooLong.stderr, /^400 organisation \S+ allows keys to live at most 90d/);
  const past = await runCliAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--expires-at', '2020-01-01T00:00:00Z']);
  assert.match(past.stderr, /^400 expires_at must be in the future/);
  assert.match((await runCliAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--expires-in', 'soon'])).stderr, /^400 --expires-in must be a duration/);
  await cliJsonAsync(cp, owner.token, ['org', 'set-key-policy', orgId, '--clear']);
  assert.equal((await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'free again'])).expires_at, null);
  const audit = (await cliJsonAsync(cp, owner.token, ['audit', '--org', orgId, '--action', 'org.set_key_policy'])).entries;
  assert.deepEqual(audit.map((e: any) => e.outcome).sort(), ['denied', 'ok', 'ok']);
});

test('key list --expiring-within and the key.expiring webhook 7 days ahead, once', async () => {
  const soon = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'soon', '--expires-in', '6d']);
  const later = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'later', '--expires-in', '8d']);
  const listed = (await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId, '--expiring-within', '7d'])).keys.map((k: any) => k.id);
  assert.ok(listed.includes(soon.id));
  assert.ok(!listed.includes(later.id));
  assert.ok(listed.every((id: string) => id !== later.id));
  const got = await recv.waitFor((r) => r.some((w) => w.type === 'key.expiring' && w.data.key_id === soon.id), 30_000);
  const w = got.find((x) => x.type === 'key.expiring' && x.data.key_id === soon.id)!;
  assert.ok(w.verified);
  assert.equal(w.data.expires_at, soon.expires_at);
  // A key created now is warned of by a later scan, which saw `soon` again: still one event for it.
  const next = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'next', '--expires-in', '5d']);
  await recv.waitFor((r) => r.some((x) => x.type === 'key.expiring' && x.data.key_id === next.id), 30_000);
  assert.equal(recv.received.filter((x) => x.type === 'key.expiring' && x.data.key_id === soon.id).length, 1);
  assert.equal(recv.received.filter((x) => x.type === 'key.expiring' && x.data.key_id === later.id).length, 0);
});
