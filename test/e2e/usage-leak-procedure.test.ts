// The spec's leaked-key procedure end to end: a key is used from two client IPs (behind a trusted
// proxy's X-Forwarded-For), revoked, and tried again (401); `tollgate logs --key` for the window
// returns exactly those requests with their IPs and statuses, the attempt after revocation included.
// Only members of the key's organisation (and the operator) may read them. No key value appears in any
// database file or process output.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { Agent, fetch as freshFetch } from 'undici';
import { configYaml } from '../helpers/config.js';
import { assertFails, createAccountAsync } from '../helpers/console-cli.js';
import { startGateway } from '../helpers/gateway-fixture.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, startControlPlane, startDataPlane, stopAll } from '../helpers/processes.js';

after(stopAll);

/** Waits until the wall clock has passed `ms` (so a window boundary falls strictly between requests). */
async function passTime(ms: number): Promise<void> {
  while (Date.now() <= ms) await new Promise((r) => setTimeout(r, 2));
}

test('leak procedure: revoke, then the logs of the key for the window show every use with IP and status, the 401 after revocation included', async (t) => {
  const gw = await startGateway(t, { controlPlane: { configYaml: configYaml((c) => (c.trusted_proxies = ['127.0.0.1/32', '::1/128'])) }, nodes: [{ nodeId: 'leak-node' }] });
  const [cp, dp] = [gw.cp, gw.node];
  const op = cp.secrets.operatorToken;
  const k = await gw.fundedKey();
  // A second key of the same project: its requests must not show up in the first key's logs.
  const other = await gw.fundedKey({ orgId: k.orgId, projectId: k.projectId });

  // Before the leak: outside the window asked for.
  assert.equal((await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(k.key), 'x-forwarded-for': '192.0.2.1' }, json: chatBody('before') })).status, 200);
  const leakAt = Date.now() + 1;
  await passTime(leakAt);

  // The attacker at 203.0.113.7 uses the official client; a second address uses curl-like requests.
  const attacker = new OpenAI({ apiKey: k.key, baseURL: `${dp.url}/v1`, maxRetries: 0, defaultHeaders: { 'x-forwarded-for': '203.0.113.7' } });
  const r1 = await attacker.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'one' }] });
  const r2 = await attacker.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'two' }] });
  const r3 = await request(`${dp.url}/v1/models`, { headers: { ...bearer(k.key), 'x-forwarded-for': '198.51.100.9', 'user-agent': 'leak-test/1.0' } });
  assert.equal(r3.status, 200);
  // Another key's traffic in the same window.
  assert.equal((await request(`${dp.url}/v1/models`, { headers: { ...bearer(other.key), 'x-forwarded-for': '203.0.113.7' } })).status, 200);

  // Revoke first (the spec's order), with the CLI.
  const revoked = await cliJsonAsync(cp, op, ['key', 'revoke', k.keyId]);
  assert.equal(revoked.status, 'revoked');
  // The attacker is still trying.
  const after401 = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(k.key), 'x-forwarded-for': '203.0.113.7' }, json: chatBody('three') });
  assert.equal(after401.status, 401);
  assert.equal(after401.body.error.type, 'authentication_error');
  const until = Date.now() + 1;
  await passTime(until);
  // After the window: not part of the answer.
  assert.equal((await request(`${dp.url}/v1/models`, { headers: { ...bearer(k.key), 'x-forwarded-for': '203.0.113.99' } })).status, 401);

  const args = ['logs', '--key', k.keyId, '--since', new Date(leakAt).toISOString(), '--until', String(until)];
  let logs: any[] = [];
  await eventually(async () => (logs = (await cliJsonAsync(cp, op, args)).logs).length >= 4, 'the window\'s four log rows', 20_000);
  // Exactly those requests, newest first.
  assert.deepEqual(
    logs.map((l) => [l.client_ip, l.method, l.path, l.status]),
    [
      ['203.0.113.7', 'POST', '/v1/chat/completions', 401],
      ['198.51.100.9', 'GET', '/v1/models', 200],
      ['203.0.113.7', 'POST', '/v1/chat/completions', 200],
      ['203.0.113.7', 'POST', '/v1/chat/completions', 200],
    ],
  );
  for (const l of logs) {
    assert.equal(l.key_id, k.keyId);
    assert.equal(l.project_id, k.projectId);
    assert.equal(l.org_id, k.orgId);
    assert.equal(l.node_id, 'leak-node');
    assert.match(l.request_id, /\S+/);
    assert.ok(Date.parse(l.at) >= leakAt && Date.parse(l.at) < until, `${l.at} inside the window`);
    assert.ok(l.latency_ms >= 0);
  }
  const [denied, listing, chat2, chat1] = logs;
  assert.equal(denied.reason, 'authentication_error');
  assert.equal(denied.model, null);
  assert.equal(listing.user_agent, 'leak-test/1.0');
  assert.ok(listing.bytes_out > 0);
  for (const [l, r] of [[chat1, r1], [chat2, r2]] as const) {
    assert.equal(l.model, 'demo-chat');
    assert.equal(l.prompt_tokens, r.usage!.prompt_tokens);
    assert.equal(l.completion_tokens, r.usage!.completion_tokens);
    assert.notEqual(l.cost_usd, '0.00');
    assert.match(l.user_agent, /OpenAI/i);
    assert.ok(l.bytes_in > 0 && l.bytes_out > 0);
  }
  // The 401 filter alone answers "did they keep trying after I revoked?".
  const only401 = (await cliJsonAsync(cp, op, [...args, '--status', '401'])).logs;
  assert.deepEqual(only401.map((l: any) => l.request_id), [denied.request_id]);
  const fromB = (await cliJsonAsync(cp, op, [...args, '--ip', '198.51.100.9'])).logs;
  assert.deepEqual(fromB.map((l: any) => l.request_id), [listing.request_id]);
  // Paging: one row per page walks the same four rows.
  const paged: string[] = [];
  let page: string | null = null;
  do {
    const res: any = await cliJsonAsync(cp, op, [...args, '--limit', '1', ...(page ? ['--page', page] : [])]);
    paged.push(...res.logs.map((l: any) => l.request_id));
    page = res.next_page_token;
  } while (page);
  assert.deepEqual(paged, logs.map((l) => l.request_id));
  // The table form names the same rows.
  const table = await runCliAsync(cp, op, args);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /203\.0\.113\.7 .*401 .*authentication_error/);

  // Roles: the owner (a member) may read them; an account outside the organisation is told the key does not exist.
  const outsider = await createAccountAsync(cp, op, 'outsider');
  assertFails(await runCliAsync(cp, outsider.token, ['logs', '--key', k.keyId]), 404, 'outsider reads the logs of a key of another organisation');
  assertFails(await runCliAsync(cp, outsider.token, ['logs', '--org', k.orgId]), 404, 'outsider reads the logs of another organisation');
  assertFails(await runCliAsync(cp, outsider.token, ['logs', '--unknown-keys']), 403, 'an account reads unknown-key 401s');
  const member = await createAccountAsync(cp, op, 'member');
  await cliJsonAsync(cp, op, ['member', 'add', k.orgId, '--account', member.id, '--role', 'member']);
  const asMember = (await cliJsonAsync(cp, member.token, args)).logs;
  assert.deepEqual(asMember.map((l: any) => l.request_id), logs.map((l) => l.request_id));
  const byProject = (await cliJsonAsync(cp, member.token, ['logs', '--project', k.projectId, '--since', String(leakAt), '--until', String(until)])).logs;
  assert.equal(byProject.length, 5, 'the project view has the other key\'s request too');

  // A key that never existed: a sampled 401 with the IP and a short prefix only, for the operator.
  const bogus = 'sk-tollgate-ZZZZnotarealkeyatallnotarealkeyatall0000';
  // (A new connection: the CLI calls above may have outlasted the node's keep-alive idle timeout.)
  const agent = new Agent();
  const bogusRes = await freshFetch(`${dp.url}/v1/models`, { headers: { ...bearer(bogus), 'x-forwarded-for': '198.18.0.5' }, dispatcher: agent });
  assert.equal(bogusRes.status, 401, dp.proc.output());
  await bogusRes.text();
  await agent.close();
  let unknown: any[] = [];
  await eventually(async () => (unknown = (await cliJsonAsync(cp, op, ['logs', '--unknown-keys'])).logs).length >= 1, 'the unknown-key 401', 20_000);
  assert.equal(unknown[0].client_ip, '198.18.0.5');
  assert.equal(unknown[0].status, 401);
  assert.equal(unknown[0].key_id, null);
  assert.equal(unknown[0].key_prefix, bogus.slice(0, 16));

  // No key value anywhere: the database files (state, logs, their WAL) and every process's output.
  const everything = [cp.proc.output(), dp.proc.output(), table.stdout, table.stderr];
  for (const f of readdirSync(cp.dir)) everything.push(readFileSync(join(cp.dir, f)).toString('latin1'));
  for (const secret of [k.key, other.key, bogus]) {
    for (const text of everything) assert.ok(!text.includes(secret), 'a key value was found in a database file or process output');
  }
});

test('a key revoked before a node started (and before the control plane restarted) is still logged against its key', async () => {
  const first = await startControlPlane();
  const c = consoleClient(first.address, first.secrets.operatorToken);
  const k = await createKey(c);
  await c.revokeKey({ keyId: k.keyId });
  c.close();
  // Tombstones come back from the database on restart and go to nodes in their first snapshot.
  await first.proc.kill('SIGTERM');
  const cp = await startControlPlane({ dir: first.dir, secrets: first.secrets });
  const dp = await startDataPlane(cp, { nodeId: 'late-node' });
  const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody('still trying') });
  assert.equal(r.status, 401);
  assert.equal(r.body.error.type, 'authentication_error');
  let logs: any[] = [];
  await eventually(async () => (logs = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['logs', '--key', k.keyId])).logs).length >= 1, 'the attempt in the logs', 20_000);
  assert.equal(logs.length, 1);
  assert.equal(logs[0].status, 401);
  assert.equal(logs[0].reason, 'authentication_error');
  assert.equal(logs[0].node_id, 'late-node');
  assert.equal(logs[0].project_id, k.projectId);
  assert.equal(logs[0].key_prefix, undefined, 'a known (revoked) key is never recorded by prefix');
});
