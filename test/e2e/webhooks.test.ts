// Signed webhooks end to end: a control plane and a node as processes, a destination (an HTTP server
// on port 0) that checks every signature with the standardwebhooks package.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { configYaml } from '../helpers/config.js';
import { createKey, type Console } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, startDataPlane, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { startWebhookReceiver, type ReceivedWebhook, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { within } from '../helpers/data-plane.js';

let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
let recv: WebhookReceiver;
/** The destination's URL carries a token in its query: it reaches the destination and nothing else. */
const HOOK_TOKEN = 'hookQueryToken7731';

gatewayFixture(
  async () => {
    recv = await startWebhookReceiver();
    return {
      controlPlane: {
        env: { TEST_HOOK_SECRET: recv.secret },
        configYaml: configYaml((cfg) => {
          // About 0.2 USD a request: a few dozen requests cross every threshold.
          cfg.models.push({ id: 'demo-priced', provider: 'demo', kind: 'chat', input_usd_per_mtok: '10000', output_usd_per_mtok: '10000' });
          cfg.tiers.paid.models.push('demo-priced');
          cfg.webhooks = [{ url: `${recv.url}?token=${HOOK_TOKEN}`, secret_env: 'TEST_HOOK_SECRET', events: ['*'], retry_initial_ms: 200 }];
          cfg.webhook_balance_low_usd = '7.00';
        }),
      },
      node: { nodeId: 'node-a' },
    };
  },
  (g) => {
    ({ cp, node, console: admin } = g);
  },
);
after(async () => {
  await recv?.close();
});

const delivered = (r: ReceivedWebhook[], type: string, pred: (w: ReceivedWebhook) => boolean = () => true) => r.filter((w) => w.type === type && w.answered < 300 && pred(w));

/** Polls `probe` until it holds, at most `ms` (state the control plane reaches asynchronously by design). */
test('key.created reaches a destination that failed first: delivered once, the same webhook-id, every attempt signed', async () => {
  recv.answers = [500, 502];
  const { key, keyId, orgId, projectId } = await createKey(admin, { tier: 'paid' });
  await recv.waitFor((r) => delivered(r, 'key.created', (w) => w.data.key_id === keyId).length === 1);
  const attempts = recv.received.filter((w) => w.type === 'key.created' && w.data.key_id === keyId);
  assert.deepEqual(attempts.map((w) => w.answered), [500, 502, 204]);
  assert.equal(new Set(attempts.map((w) => w.id)).size, 1, 'one webhook-id across retries');
  assert.match(attempts[0].id, /^msg_/);
  for (const w of attempts) {
    assert.ok(w.verified, 'standardwebhooks verify() accepts every attempt');
    assert.match(w.signature, /^v1,[A-Za-z0-9+/]+=*$/);
    assert.ok(!w.body.includes(key) && !w.body.includes(key.slice(12, 30)), 'no key value in the payload');
  }
  assert.deepEqual(attempts[2].data, { key_id: keyId, project_id: projectId, org_id: orgId, name: 'key', key_prefix: attempts[2].data.key_prefix, created_at: attempts[2].data.created_at });
  const list = await cliJsonAsync(cp, cp.secrets.operatorToken, ['webhooks', 'deliveries']);
  const row = list.deliveries.find((d: any) => d.webhook_id === attempts[0].id);
  assert.equal(row.status, 'delivered');
  assert.equal(row.attempts, 3);
  const hooks = await cliJsonAsync(cp, cp.secrets.operatorToken, ['webhooks', 'list']);
  assert.equal(hooks.destinations[0].url, recv.url);
  assert.equal(hooks.destinations[0].secret_env, 'TEST_HOOK_SECRET');
  assert.equal(hooks.destinations[0].paused, false);
  assert.ok(!JSON.stringify(hooks).includes(recv.secret), 'the secret is never shown');
  // The query (a receiver's token) goes to the destination only: `webhooks list` and `deliveries` show origin and path.
  assert.equal(attempts[0].path, `/hooks?token=${HOOK_TOKEN}`);
  assert.equal(row.url, recv.url);
  assert.ok(!JSON.stringify(hooks).includes(HOOK_TOKEN) && !JSON.stringify(list).includes(HOOK_TOKEN), 'no query in webhooks list or deliveries');
});

test('a revoked key presented again raises key.revoked then one key.revoked_used per hour, with the client IPs', async () => {
  const { key, keyId } = await createKey(admin, { tier: 'paid' });
  await admin.revokeKey({ keyId });
  const [revoked] = await recv.waitFor((r) => delivered(r, 'key.revoked', (w) => w.data.key_id === keyId).length === 1).then((r) => delivered(r, 'key.revoked', (w) => w.data.key_id === keyId));
  assert.equal(revoked.data.revoked_reason, 'revoked');
  for (let i = 0; i < 3; i++) assert.equal((await request(`${node.url}/v1/models`, { headers: bearer(key) })).status, 401);
  const [used] = await recv.waitFor((r) => delivered(r, 'key.revoked_used', (w) => w.data.key_id === keyId).length === 1).then((r) => delivered(r, 'key.revoked_used', (w) => w.data.key_id === keyId));
  assert.deepEqual(used.data.client_ips, ['127.0.0.1']);
  assert.ok(used.data.attempts >= 1);
  assert.ok(!used.body.includes(key));
  // More attempts within the hour: logged (the leak procedure reads them), no second event.
  for (let i = 0; i < 2; i++) assert.equal((await request(`${node.url}/v1/models`, { headers: bearer(key) })).status, 401);
  assert.ok(await within(10_000, async () => (await admin.listRequestLogs({ keyId, projectId: '', orgId: '', sinceMs: 0, untilMs: 0, clientIp: '', status: 401, unknownKeys: false, limit: 100, pageToken: '' })).logs.length === 5));
  const all = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['webhooks', 'deliveries'])).deliveries.filter((d: any) => d.type === 'key.revoked_used');
  assert.equal(all.length, 1);
});

test('cap and balance thresholds, blocked and unblocked: each event exactly once', async () => {
  const { key, orgId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 10_000_000, note: 'start' });
  await admin.setOrgCap({ orgId, capMicros: 4_000_000 });
  let refused = 0;
  for (let i = 0; i < 200 && refused === 0; i++) {
    const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`spend ${i}`, 'demo-priced') });
    if (res.status === 401) {
      assert.equal(res.body.error.type, 'insufficient_quota');
      refused++;
    } else assert.equal(res.status, 200);
  }
  assert.equal(refused, 1, 'the cap is reached');
  const ofOrg = (w: ReceivedWebhook) => w.data.org_id === orgId;
  await recv.waitFor((r) => delivered(r, 'org.blocked', ofOrg).length === 1);
  const blocked = delivered(recv.received, 'org.blocked', ofOrg)[0];
  assert.equal(blocked.data.reason, 'monthly_cap_reached');
  // Raising the cap unblocks; more spend crosses nothing again this month.
  await admin.setOrgCap({ orgId, capMicros: 100_000_000 });
  // The first credit's org.unblocked (previous_reason balance_exhausted) may be delivered before or
  // after this one: waiting for "one org.unblocked" hung when both had arrived (a count of 2).
  await recv.waitFor((r) => delivered(r, 'org.unblocked', (w) => ofOrg(w) && w.data.previous_reason === 'monthly_cap_reached').length >= 1);
  const spentBefore = (await admin.getOrg({ orgId })).spendTotalMicros;
  for (let i = 0; i < 3; i++) assert.equal((await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`more ${i}`, 'demo-priced') })).status, 200);
  assert.ok(await within(10_000, async () => (await admin.getOrg({ orgId })).spendTotalMicros > spentBefore));
  // Every event of the organisation was written with the spend that caused it; wait for their delivery.
  assert.ok(await within(10_000, async () => {
    const d = (await admin.listWebhookDeliveries({ failed: false, limit: 1000 })).deliveries.filter((x) => x.orgId === orgId);
    return d.length > 0 && d.every((x) => x.status === 'delivered');
  }));
  const count = (type: string, pred: (w: ReceivedWebhook) => boolean = () => true) => delivered(recv.received, type, (w) => ofOrg(w) && pred(w)).length;
  assert.equal(count('org.cap.threshold', (w) => w.data.threshold_percent === 80), 1);
  assert.equal(count('org.cap.threshold', (w) => w.data.threshold_percent === 100), 1);
  assert.equal(count('org.balance.low'), 1);
  assert.equal(count('org.blocked'), 1);
  // A paid organisation starts blocked (no credit): the first credit unblocked it, the cap raise again.
  assert.deepEqual(delivered(recv.received, 'org.unblocked', ofOrg).map((w) => w.data.previous_reason).sort(), ['balance_exhausted', 'monthly_cap_reached']);
  const cap80 = delivered(recv.received, 'org.cap.threshold', (w) => ofOrg(w) && w.data.threshold_percent === 80)[0];
  assert.equal(cap80.data.cap_micros, 4_000_000);
  assert.ok(cap80.data.month_spend_micros >= 3_200_000);
  const low = delivered(recv.received, 'org.balance.low', ofOrg)[0];
  assert.equal(low.data.threshold_micros, 7_000_000);
  assert.ok(low.data.balance_micros <= 7_000_000);
  for (const w of recv.received) assert.ok(w.verified || w.signatureMatches, `${w.type} signed`);
});

test('project cap and key limit thresholds (80 % and 100 %): each exactly once per period, with the spend that crossed it', async () => {
  const { orgId, projectId } = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId, amountMicros: 100_000_000, note: 'plenty' });
  await admin.setProjectCap({ projectId, capMicros: 2_000_000 });
  const limited = await admin.createKey({ projectId, name: 'limited', allowedModels: [], limitMicros: 1_000_000, limitReset: 'monthly' });
  const other = await admin.createKey({ projectId, name: 'other', allowedModels: [] });
  const chat = (key: string, i: number) => request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(`spend ${i}`, 'demo-priced') });
  // The key's limit first (1 USD), then the project's cap (2 USD) with the other key.
  for (const k of [limited.key, other.key]) {
    let refused = false;
    for (let i = 0; i < 100 && !refused; i++) {
      const res = await chat(k, i);
      if (res.status === 401) {
        assert.equal(res.body.error.type, 'insufficient_quota');
        refused = true;
      } else assert.equal(res.status, 200, res.text);
    }
    assert.ok(refused, 'the limit is reached');
  }
  // More refused requests cross nothing again.
  for (let i = 0; i < 3; i++) assert.equal((await chat(limited.key, i)).status, 401);
  const ofProject = (w: ReceivedWebhook) => w.data.project_id === projectId;
  await recv.waitFor((r) => delivered(r, 'project.cap.threshold', ofProject).length === 2 && delivered(r, 'key.limit.threshold', ofProject).length === 2);
  assert.ok(await within(10_000, async () => {
    const d = (await admin.listWebhookDeliveries({ failed: false, limit: 1000 })).deliveries.filter((x) => x.orgId === orgId);
    return d.length > 0 && d.every((x) => x.status === 'delivered');
  }));
  const key = delivered(recv.received, 'key.limit.threshold', ofProject);
  assert.deepEqual(key.map((w) => w.data.threshold_percent).sort(), [100, 80]);
  const key80 = key.find((w) => w.data.threshold_percent === 80)!;
  assert.equal(key80.data.key_id, limited.apiKey!.id);
  assert.equal(key80.data.org_id, orgId);
  assert.equal(key80.data.limit_micros, 1_000_000);
  assert.equal(key80.data.limit_reset, 'monthly');
  assert.ok(key80.data.spent_micros >= 800_000);
  assert.match(key80.data.period_start, /^\d{4}-\d{2}-01T00:00:00\.000Z$/);
  const project = delivered(recv.received, 'project.cap.threshold', ofProject);
  assert.deepEqual(project.map((w) => w.data.threshold_percent).sort(), [100, 80]);
  const cap100 = project.find((w) => w.data.threshold_percent === 100)!;
  assert.equal(cap100.data.cap_micros, 2_000_000);
  assert.ok(cap100.data.month_spend_micros >= 2_000_000);
  for (const w of [...key, ...project]) {
    assert.ok(w.verified, `${w.type} signed`);
    assert.ok(!w.body.includes(limited.key) && !w.body.includes(other.key), 'no key value in the payload');
  }
});

test('a node that goes away and stays away raises node.disconnected', async () => {
  const gone = await startDataPlane(cp, { nodeId: 'node-gone' });
  await gone.proc.kill('SIGKILL');
  const [w] = await recv.waitFor((r) => delivered(r, 'node.disconnected', (x) => x.data.node_id === 'node-gone').length === 1).then((r) => delivered(r, 'node.disconnected', (x) => x.data.node_id === 'node-gone'));
  assert.ok(w.verified);
  assert.match(w.data.disconnected_at, /^\d{4}-/);
});

test('webhooks test signs and sends a webhook.test now; an unknown url is 404; accounts get 403', async () => {
  // Asynchronously: the destination answers from this process, which must not block on the CLI.
  const run = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'webhooks', 'test', '--url', recv.url]);
  assert.equal(run.code, 0, run.stderr);
  const ok = JSON.parse(run.stdout);
  assert.equal(ok.ok, true);
  assert.equal(ok.status, 204);
  const got = await recv.waitFor((r) => r.some((w) => w.id === ok.webhook_id));
  const test = got.find((w) => w.id === ok.webhook_id)!;
  assert.equal(test.type, 'webhook.test');
  assert.ok(test.verified);
  // Named as `webhooks list` shows it (no query); sent to the full URL; the answer shows none.
  assert.equal(test.path, `/hooks?token=${HOOK_TOKEN}`);
  assert.equal(ok.url, recv.url);
  assert.ok(!run.stdout.includes(HOOK_TOKEN));
  const unknown = await runCliAsync(cp, cp.secrets.operatorToken, ['webhooks', 'test', '--url', 'http://127.0.0.1:1/nowhere']);
  assert.equal(unknown.code, 1);
  assert.match(unknown.stderr, /^404 no webhook destination/);
  const acct = await admin.createAccount({ name: 'nosy' });
  const denied = await runCliAsync(cp, acct.token, ['webhooks', 'list']);
  assert.equal(denied.code, 1);
  assert.match(denied.stderr, /^403 /);
});
