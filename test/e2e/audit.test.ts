// The audit log end to end: console calls through the CLI (real processes), allowed and refused,
// then `tollgate audit` as the operator, an owner, an admin and a member.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { consoleClient, type Console } from '../helpers/console.js';
import { cliJsonAsync, runCliAsync, startControlPlane, stopAll, type ControlPlane } from '../helpers/processes.js';

let cp: ControlPlane;
let op: Console;
const acct: Record<'alice' | 'bob' | 'carol' | 'dave', { id: string; token: string }> = {} as any;
let orgId = '';
let otherOrgId = '';
let projectId = '';
let keyValue = '';
let keyId = '';
let limitedKeyId = '';

before(async () => {
  cp = await startControlPlane();
  op = consoleClient(cp.address, cp.secrets.operatorToken);
  for (const name of ['alice', 'bob', 'carol', 'dave'] as const) {
    const r = await op.createAccount({ name });
    acct[name] = { id: r.account!.id, token: r.token };
  }
  orgId = (await op.createOrg({ name: 'acme', ownerAccountId: acct.alice.id, tier: 'paid' })).id;
  otherOrgId = (await op.createOrg({ name: 'other', ownerAccountId: acct.dave.id, tier: 'free' })).id;
  await op.addMember({ orgId, accountId: acct.bob.id, role: 'member' });
  await op.addMember({ orgId, accountId: acct.carol.id, role: 'admin' });

  // Allowed: the owner makes a project and a key, caps and revokes; the operator credits.
  projectId = (await cliJsonAsync(cp, acct.alice.token, ['project', 'create', '--org', orgId, '--name', 'backend'])).id;
  const created = await cliJsonAsync(cp, acct.alice.token, ['key', 'create', '--project', projectId, '--name', 'prod']);
  keyValue = created.key;
  keyId = created.id;
  await cliJsonAsync(cp, acct.alice.token, ['org', 'set-cap', orgId, '--usd', '50']);
  await cliJsonAsync(cp, cp.secrets.operatorToken, ['org', 'credit', orgId, '--usd', '10']);
  // Refused for their role: a member creating a key, an admin crediting (operator only), a non-member revoking.
  assert.match((await runCliAsync(cp, acct.bob.token, ['key', 'create', '--project', projectId])).stderr, /^403 /);
  assert.match((await runCliAsync(cp, acct.carol.token, ['org', 'credit', orgId, '--usd', '5'])).stderr, /^403 /);
  assert.match((await runCliAsync(cp, acct.dave.token, ['key', 'revoke', keyId])).stderr, /^404 /);
  await cliJsonAsync(cp, acct.alice.token, ['key', 'revoke', keyId]);
  // Money limits below the organisation (docs/money-limits.md): an admin caps a project, a member may
  // not; a key created with its own limit.
  await cliJsonAsync(cp, acct.carol.token, ['project', 'set-cap', projectId, '--usd', '25']);
  assert.match((await runCliAsync(cp, acct.bob.token, ['project', 'set-cap', projectId, '--usd', '1000'])).stderr, /^403 /);
  limitedKeyId = (await cliJsonAsync(cp, acct.carol.token, ['key', 'create', '--project', projectId, '--name', 'reseller', '--limit-usd', '7.5', '--limit-reset', 'weekly'])).id;
  // The other organisation's owner acts in it.
  await cliJsonAsync(cp, acct.dave.token, ['project', 'create', '--org', otherOrgId, '--name', 'theirs']);
});
after(async () => {
  op?.close();
  await stopAll();
});

type Entry = { id: number; at: string; actor: string; action: string; target_id: string | null; org_id: string | null; outcome: string; caller_address: string | null; detail: string | null };
const audit = async (token: string, args: string[] = []): Promise<Entry[]> => (await cliJsonAsync(cp, token, ['audit', ...args])).entries;
const find = (entries: Entry[], action: string, actor: string, outcome = 'ok') => entries.filter((e) => e.action === action && e.actor === actor && e.outcome === outcome);

test('changes and role refusals are recorded with actor, action, target, organisation, outcome and address', async () => {
  const all = await audit(cp.secrets.operatorToken);
  const [create] = find(all, 'key.create', acct.alice.id);
  assert.equal(create.target_id, keyId);
  assert.equal(create.org_id, orgId);
  assert.equal(create.caller_address, '127.0.0.1');
  assert.match(create.at, /^\d{4}-\d{2}-\d{2}T/);
  assert.equal(find(all, 'project.create', acct.alice.id)[0].target_id, projectId);
  assert.equal(find(all, 'org.set_cap', acct.alice.id)[0].org_id, orgId);
  assert.equal(find(all, 'org.credit', 'operator')[0].target_id, orgId);
  assert.equal(find(all, 'key.revoke', acct.alice.id)[0].target_id, keyId);
  assert.equal(find(all, 'member.add', 'operator').length, 2);
  assert.equal(find(all, 'account.create', 'operator').length, 4);
  assert.equal(find(all, 'org.create', 'operator').length, 2);
  // Refused: 403 for the member and the admin, 404 for the non-member: all three are "denied".
  const deniedCreate = find(all, 'key.create', acct.bob.id, 'denied');
  assert.equal(deniedCreate.length, 1);
  assert.equal(deniedCreate[0].org_id, orgId);
  assert.equal(find(all, 'org.credit', acct.carol.id, 'denied')[0].org_id, orgId);
  const deniedRevoke = find(all, 'key.revoke', acct.dave.id, 'denied');
  assert.equal(deniedRevoke.length, 1);
  assert.equal(deniedRevoke[0].target_id, keyId);
  // Reads that were allowed are not recorded.
  assert.equal(all.filter((e) => e.action === 'key.list' || e.action === 'org.show').length, 0);
  // Never a key value or a token.
  const text = JSON.stringify(all);
  for (const secret of [keyValue, cp.secrets.operatorToken, ...Object.values(acct).map((a) => a.token)]) assert.ok(!text.includes(secret));
  // Newest first.
  assert.ok(all.every((e, i) => i === 0 || e.at <= all[i - 1].at));
});

test('owners and admins see their organisation; a member sees none; the operator sees all', async () => {
  const owner = await audit(acct.alice.token);
  assert.ok(owner.length > 0);
  assert.ok(owner.every((e) => e.org_id === orgId), 'only acme entries');
  assert.ok(find(owner, 'key.create', acct.bob.id, 'denied').length === 1, 'refusals in the org are shown to its owner');
  const admin = await audit(acct.carol.token, ['--org', orgId]);
  assert.deepEqual(admin.map((e) => e.id), owner.map((e) => e.id));
  // Dave owns the other organisation: he sees its entries, not acme's (his denied attempt there included? no: acme's).
  const dave = await audit(acct.dave.token);
  assert.ok(dave.length > 0 && dave.every((e) => e.org_id === otherOrgId));
  assert.match((await runCliAsync(cp, acct.dave.token, ['audit', '--org', orgId])).stderr, /^404 /);
  // A member: none, and asking for the organisation is refused (and itself recorded).
  assert.deepEqual(await audit(acct.bob.token), []);
  const r = await runCliAsync(cp, acct.bob.token, ['audit', '--org', orgId]);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /^403 /);
  assert.equal(find(await audit(cp.secrets.operatorToken), 'audit.list', acct.bob.id, 'denied').length, 1);
  // Entries without an organisation (accounts) are the operator's alone.
  assert.ok(!owner.some((e) => e.action === 'account.create'));
});

test('audit filters by action and time', async () => {
  const revokes = await audit(cp.secrets.operatorToken, ['--action', 'key.revoke']);
  assert.deepEqual(new Set(revokes.map((e) => e.action)), new Set(['key.revoke']));
  assert.equal(revokes.length, 2);
  const all = await audit(cp.secrets.operatorToken);
  const cut = all[Math.floor(all.length / 2)].at;
  const since = await audit(cp.secrets.operatorToken, ['--since', cut]);
  assert.ok(since.length > 0 && since.length < all.length);
  assert.ok(since.every((e) => e.at >= cut));
  assert.match((await runCliAsync(cp, cp.secrets.operatorToken, ['audit', '--since', 'yesterday'])).stderr, /^400 --since must be/);
});

test('project.set_cap is recorded allowed (admin) and denied (member), with the cap; key.create carries the key limit', async () => {
  const all = await audit(cp.secrets.operatorToken, ['--action', 'project.set_cap']);
  const [allowed] = find(all, 'project.set_cap', acct.carol.id);
  assert.equal(allowed.target_id, projectId);
  assert.equal(allowed.org_id, orgId);
  assert.equal(allowed.detail, 'cap_usd=25.00');
  const [denied] = find(all, 'project.set_cap', acct.bob.id, 'denied');
  assert.equal(denied.target_id, projectId);
  assert.equal(denied.org_id, orgId);
  const [limited] = (await audit(cp.secrets.operatorToken, ['--action', 'key.create'])).filter((e) => e.target_id === limitedKeyId);
  assert.equal(limited.detail, 'limit_usd=7.50 limit_reset=weekly');
  // A key without a limit says nothing more; no entry carries a key value.
  assert.equal(find(await audit(cp.secrets.operatorToken), 'key.create', acct.alice.id).find((e) => e.target_id === keyId)!.detail, null);
  assert.ok(!JSON.stringify(await audit(cp.secrets.operatorToken)).includes(keyValue));
});
