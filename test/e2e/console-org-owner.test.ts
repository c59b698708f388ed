// Every organisation has an owner. Before the fix, the operator could create an organisation with no
// owner at all (nobody but the operator could ever manage it), and an account could not create one.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertFails, createAccount } from '../helpers/console-cli.js';
import { cliJson, runCli, startControlPlane, stopAll } from '../helpers/processes.js';

test('an organisation always has an owner: the operator names one, an account becomes the owner of its own', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const alice = createAccount(cp, op, 'alice');
  const bob = createAccount(cp, op, 'bob');

  // The operator must name the owner.
  assertFails(runCli(cp, op, ['org', 'create', '--name', 'ownerless']), 400, 'operator org create without --owner', { message: /owner/ });
  const named = cliJson(cp, op, ['org', 'create', '--name', 'named', '--owner', alice.id, '--tier', 'paid']);
  assert.equal(named.tier, 'paid');
  assert.deepEqual(cliJson(cp, op, ['member', 'list', named.id]).members.map((m: any) => `${m.account_id}:${m.role}`), [`${alice.id}:owner`]);

  // An account without --owner becomes the owner of the organisation it creates, on the default tier.
  const own = cliJson(cp, bob.token, ['org', 'create', '--name', 'bobs']);
  assert.equal(own.role, 'owner');
  assert.equal(own.tier, 'free');
  assert.deepEqual(cliJson(cp, bob.token, ['member', 'list', own.id]).members.map((m: any) => `${m.account_id}:${m.role}`), [`${bob.id}:owner`]);
  // It can name itself, but nobody else, and it cannot pick a tier (tier changes need the operator).
  assert.equal(cliJson(cp, bob.token, ['org', 'create', '--name', 'bobs-2', '--owner', bob.id]).role, 'owner');
  assertFails(runCli(cp, bob.token, ['org', 'create', '--name', 'for-alice', '--owner', alice.id]), 403, 'account naming another owner');
  assertFails(runCli(cp, bob.token, ['org', 'create', '--name', 'bobs-paid', '--tier', 'paid']), 403, 'account choosing a tier');
  // The refused calls created nothing.
  assert.deepEqual(cliJson(cp, bob.token, ['org', 'list']).orgs.map((o: any) => o.name).sort(), ['bobs', 'bobs-2']);
});
