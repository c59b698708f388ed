// The whole account → organisation → project → key hierarchy driven through the `tollgate` CLI as a
// process against a real control plane, and the rule that a key's value is shown exactly once.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { assertNoStackTrace, createAccountAsync, createOrgWithProjectAsync, runMany } from '../helpers/console-cli.js';
import { cliJsonAsync, runCliAsync, startControlPlane, stopAll } from '../helpers/processes.js';

const KEY_RE = /^sk-tollgate-[0-9A-Za-z]{43}$/;

test('operator builds accounts, an organisation, members, a project and a key through the CLI', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;

  const me = await cliJsonAsync(cp, op, ['whoami']);
  assert.equal(me.operator, true);

  const alice = await createAccountAsync(cp, op, 'alice');
  const bob = await createAccountAsync(cp, op, 'bob');
  assert.notEqual(alice.id, bob.id);
  assert.notEqual(alice.token, bob.token);
  assert.equal((await cliJsonAsync(cp, alice.token, ['whoami'])).account.id, alice.id);

  const org = await cliJsonAsync(cp, op, ['org', 'create', '--name', 'Acme', '--owner', alice.id]);
  assert.equal(org.name, 'Acme');
  assert.equal(org.tier, 'free');
  assert.equal(org.credits_usd, '0.00');
  assert.equal(org.free_grant_usd, '5.00');
  assert.equal(org.spend_total_usd, '0.00');
  assert.equal(org.month_spend_usd, '0.00');
  assert.equal(org.balance_usd, '5.00');
  assert.equal(org.own_cap_usd, null);
  assert.equal(org.cap_usd, '5.00');
  assert.equal(org.blocked, false);
  assert.equal(org.blocked_reason, null);
  assert.match(org.month, /^\d{4}-\d{2}$/);
  assert.equal(org.month, new Date().toISOString().slice(0, 7));
  assert.equal(typeof org.created_at, 'string');

  const member = await cliJsonAsync(cp, alice.token, ['member', 'add', org.id, '--account', bob.id, '--role', 'member']);
  assert.deepEqual(member, { org_id: org.id, account_id: bob.id, account_name: 'bob', role: 'member' });
  const members = (await cliJsonAsync(cp, bob.token, ['member', 'list', org.id])).members;
  assert.deepEqual(
    members.map((m: any) => [m.account_id, m.role]).sort(),
    [
      [alice.id, 'owner'],
      [bob.id, 'member'],
    ].sort(),
  );

  const project = await cliJsonAsync(cp, alice.token, ['project', 'create', '--org', org.id, '--name', 'backend']);
  assert.equal(project.org_id, org.id);
  assert.equal(project.name, 'backend');
  assert.deepEqual(
    (await cliJsonAsync(cp, bob.token, ['project', 'list', '--org', org.id])).projects.map((p: any) => p.id),
    [project.id],
  );

  const created = await cliJsonAsync(cp, alice.token, ['key', 'create', '--project', project.id, '--name', 'ci', '--models', 'demo-chat,demo-embed']);
  assert.match(created.key, KEY_RE);
  assert.equal(created.key_prefix, `${created.key.slice(0, 12)}...${created.key.slice(-4)}`);
  assert.equal(created.project_id, project.id);
  assert.equal(created.org_id, org.id);
  assert.equal(created.name, 'ci');
  assert.deepEqual(created.allowed_models, ['demo-chat', 'demo-embed']);
  assert.equal(created.status, 'active');
  assert.equal(created.last_used_at, null);
  assert.equal(typeof created.created_at, 'string');
  assert.equal(created.rpm_limit, 20);
  assert.equal(created.tpm_limit, 60000);
  assert.equal(created.max_parallel_requests, 100);

  const listed = (await cliJsonAsync(cp, bob.token, ['key', 'list', '--project', project.id])).keys;
  assert.equal(listed.length, 1);
  assert.equal(listed[0].id, created.id);
  assert.equal(listed[0].key_prefix, created.key_prefix);
  assert.equal(listed[0].status, 'active');
  assert.equal('key' in listed[0], false, 'a listed key has no value');
  assert.deepEqual(listed[0].allowed_models, ['demo-chat', 'demo-embed']);

  // A second key with no --models: every model the plan allows.
  const all = await cliJsonAsync(cp, alice.token, ['key', 'create', '--project', project.id]);
  assert.deepEqual(all.allowed_models, []);
  assert.notEqual(all.key, created.key);

  const models = (await cliJsonAsync(cp, bob.token, ['models', 'list'])).models;
  const byId = new Map(models.map((m: any) => [m.id, m]));
  assert.ok(byId.has('demo-chat'));
  assert.deepEqual([...(byId.get('demo-chat') as any).tiers].sort(), ['free', 'paid']);
  assert.deepEqual((byId.get('demo-chat-pro') as any).tiers, ['paid']);
  assert.equal((byId.get('demo-chat') as any).input_usd_per_mtok, '0.50');

  const shownToBob = await cliJsonAsync(cp, bob.token, ['org', 'show', org.id]);
  assert.equal(shownToBob.role, 'member');
  assert.equal(shownToBob.id, org.id);
  assert.equal((await cliJsonAsync(cp, alice.token, ['org', 'show', org.id])).role, 'owner');
  assert.deepEqual(
    (await cliJsonAsync(cp, alice.token, ['org', 'list'])).orgs.map((o: any) => o.id),
    [org.id],
  );

  // Readable output without --json: tables and key: value lines.
  const table = await runCliAsync(cp, bob.token, ['key', 'list', '--project', project.id]);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /^ID\s+NAME\s+KEY_PREFIX\s+STATUS/m);
  assert.ok(table.stdout.includes(created.key_prefix));
  assert.match(table.stdout, /\bactive\b/);
  const shown = await runCliAsync(cp, alice.token, ['org', 'show', org.id]);
  assert.equal(shown.code, 0, shown.stderr);
  assert.match(shown.stdout, /^balance_usd:\s+5\.00$/m);
  assert.match(shown.stdout, /^tier:\s+free$/m);
  const human = await runCliAsync(cp, alice.token, ['key', 'create', '--project', project.id, '--name', 'human']);
  assert.equal(human.code, 0, human.stderr);
  assert.match(human.stdout, /^key:\s+sk-tollgate-[0-9A-Za-z]{43}$/m);
  assert.match(human.stdout + human.stderr, /will not be shown again/);
  assertNoStackTrace(human, 'key create');
});

test("a key's value appears only in the output of key create, never in the database files", async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'secretive');
  const memberAcct = await createAccountAsync(cp, op, 'reader');
  await cliJsonAsync(cp, owner.token, ['member', 'add', orgId, '--account', memberAcct.id, '--role', 'member']);

  const create = await runCliAsync(cp, owner.token, ['--json', 'key', 'create', '--project', projectId, '--name', 'prod']);
  assert.equal(create.code, 0, create.stderr);
  const created = JSON.parse(create.stdout);
  const key: string = created.key;
  assert.match(key, KEY_RE);
  const randomPart = key.slice('sk-tollgate-'.length);

  const calls: [string, string[]][] = [];
  for (const [token, args] of [
    [owner.token, ['key', 'list', '--project', projectId]],
    [memberAcct.token, ['key', 'list', '--project', projectId]],
    [owner.token, ['org', 'show', orgId]],
    [owner.token, ['org', 'list']],
    [op, ['org', 'list']],
    [owner.token, ['project', 'list', '--org', orgId]],
    [owner.token, ['member', 'list', orgId]],
    [owner.token, ['usage', '--project', projectId]],
    [owner.token, ['usage', '--org', orgId]],
    [owner.token, ['models', 'list']],
    [op, ['nodes', 'list']],
    [owner.token, ['whoami']],
  ] as [string, string[]][]) {
    calls.push([token, ['--json', ...args]], [token, args]);
  }
  const outputs = [create, ...(await runMany(cp, calls))];
  outputs.forEach((r, i) => assert.equal(r.code, 0, `${i === 0 ? 'key create' : calls[i - 1][1].join(' ')}: ${r.stderr}`));
  const revoke = await runCliAsync(cp, owner.token, ['--json', 'key', 'revoke', created.id]);
  assert.equal(revoke.code, 0, revoke.stderr);
  outputs.push(revoke, await runCliAsync(cp, owner.token, ['key', 'list', '--project', projectId]));
  const withValue = outputs.filter((r) => `${r.stdout}${r.stderr}`.includes(randomPart));
  assert.equal(withValue.length, 1, 'the key value is printed by exactly one command');
  assert.equal(withValue[0], create);
  assert.ok(!create.stderr.includes(randomPart), 'and only on stdout');

  const dbBytes = () =>
    Buffer.concat(
      readdirSync(cp.dir)
        .map((name) => join(cp.dir, name))
        .filter((p) => statSync(p).isFile())
        .map((p) => readFileSync(p)),
    );
  const secretsAbsent = (bytes: Buffer, when: string) => {
    assert.ok(!bytes.includes(Buffer.from(randomPart)), `key value found in the database files ${when}`);
    assert.ok(!bytes.includes(Buffer.from(owner.token)), `console token found in the database files ${when}`);
    assert.ok(!bytes.includes(Buffer.from(cp.secrets.pepper)), `pepper found in the database files ${when}`);
    assert.ok(!bytes.includes(Buffer.from(op)), `operator token found in the database files ${when}`);
    // Proves these are the files holding the data at all.
    assert.ok(bytes.includes(Buffer.from(created.id)), `key id not found in the database files ${when}`);
  };
  assert.ok(readdirSync(cp.dir).includes('tollgate.db'));
  secretsAbsent(dbBytes(), 'while the control plane runs');
  await cp.proc.kill('SIGTERM');
  secretsAbsent(dbBytes(), 'after the control plane stopped');
});
