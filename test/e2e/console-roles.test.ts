// Console roles: admin-or-above calls refused with 403 for a plain member, operator-only calls
// refused with 403 for an organisation's owner, and 401 for a bad or missing token.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertFails, createAccountAsync, createOrgWithProjectAsync, runMany } from '../helpers/console-cli.js';
import { cliJsonAsync, runCliAsync, startControlPlane, stopAll } from '../helpers/processes.js';

test('every role-gated call is refused with 403 for a member, operator calls for an owner, 401 without a good token', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'roles');
  const member = await createAccountAsync(cp, op, 'plain-member');
  const admin = await createAccountAsync(cp, op, 'an-admin');
  const outsider = await createAccountAsync(cp, op, 'outsider');
  await cliJsonAsync(cp, owner.token, ['member', 'add', orgId, '--account', member.id, '--role', 'member']);
  await cliJsonAsync(cp, owner.token, ['member', 'add', orgId, '--account', admin.id, '--role', 'admin']);
  const ownersKey = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'owners']);

  // A plain member may read...
  assert.equal((await cliJsonAsync(cp, member.token, ['key', 'list', '--project', projectId])).keys.length, 1);
  assert.equal((await cliJsonAsync(cp, member.token, ['org', 'show', orgId])).role, 'member');
  // ...but not change anything that needs admin or above; an owner cannot make operator calls; a bad
  // or missing token gets 401.
  const refusals: [string | undefined, string[], number, string][] = [
    [member.token, ['key', 'create', '--project', projectId], 403, 'member key create'],
    [member.token, ['key', 'revoke', ownersKey.id], 403, 'member key revoke'],
    [member.token, ['member', 'add', orgId, '--account', outsider.id, '--role', 'member'], 403, 'member member add'],
    [member.token, ['member', 'add', orgId, '--account', member.id, '--role', 'owner'], 403, 'member promoting itself'],
    [member.token, ['project', 'create', '--org', orgId, '--name', 'nope'], 403, 'member project create'],
    [member.token, ['org', 'set-cap', orgId, '--usd', '1'], 403, 'member set-cap'],
    [member.token, ['org', 'set-cap', orgId, '--clear'], 403, 'member set-cap --clear'],
    [owner.token, ['org', 'set-tier', orgId, '--tier', 'paid'], 403, 'owner set-tier'],
    [owner.token, ['org', 'credit', orgId, '--usd', '10'], 403, 'owner credit'],
    [owner.token, ['account', 'create', '--name', 'sneaky'], 403, 'owner account create'],
    [owner.token, ['org', 'create', '--name', 'second', '--owner', member.id], 403, 'owner creating an org for someone else'],
    [owner.token, ['nodes', 'list'], 403, 'owner nodes list'],
    [owner.token, ['config', 'reload'], 403, 'owner config reload'],
    ['tok_not-a-real-token', ['org', 'list'], 401, 'bad token'],
    ['tok_not-a-real-token', ['whoami'], 401, 'bad token whoami'],
    [undefined, ['org', 'list'], 401, 'no token'],
    [undefined, ['key', 'list', '--project', projectId], 401, 'no token key list'],
  ];
  const results = await runMany(cp, refusals.map(([token, args]) => [token, args]));
  refusals.forEach(([, , status, what], i) => assertFails(results[i], status, what));
  assert.equal((await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId])).keys[0].status, 'active');
  assert.deepEqual(
    (await cliJsonAsync(cp, owner.token, ['member', 'list', orgId])).members.map((m: any) => `${m.account_id}:${m.role}`).sort(),
    [`${owner.id}:owner`, `${member.id}:member`, `${admin.id}:admin`].sort(),
  );

  // An admin may do those.
  const adminKey = await cliJsonAsync(cp, admin.token, ['key', 'create', '--project', projectId, '--name', 'admins']);
  assert.equal(adminKey.status, 'active');
  const capped = await cliJsonAsync(cp, admin.token, ['org', 'set-cap', orgId, '--usd', '2.50']);
  assert.equal(capped.own_cap_usd, '2.50');
  assert.equal(capped.cap_usd, '2.50');
  const cleared = await cliJsonAsync(cp, owner.token, ['org', 'set-cap', orgId, '--clear']);
  assert.equal(cleared.own_cap_usd, null);
  assert.equal(cleared.cap_usd, '5.00');
  assert.equal((await cliJsonAsync(cp, admin.token, ['key', 'revoke', adminKey.id])).status, 'revoked');

  // The refused operator calls changed nothing.
  const org = await cliJsonAsync(cp, op, ['org', 'show', orgId]);
  assert.equal(org.tier, 'free');
  assert.equal(org.credits_usd, '0.00');

  // The operator may do them.
  assert.equal((await cliJsonAsync(cp, op, ['org', 'credit', orgId, '--usd', '10', '--note', 'welcome'])).credits_usd, '10.00');
  assert.ok(Array.isArray((await cliJsonAsync(cp, op, ['nodes', 'list'])).nodes));

  // TOLLGATE_TOKEN is read when --token is absent.
  const viaEnv = await runCliAsync(cp, undefined, ['--json', 'whoami'], { TOLLGATE_TOKEN: member.token });
  assert.equal(viaEnv.code, 0, viaEnv.stderr);
  assert.equal(JSON.parse(viaEnv.stdout).account.id, member.id);
});
