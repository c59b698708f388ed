// Every organisation has an owner. Before the fix, the operator could create an organisation with no
// owner at all (nobody but the operator could ever manage it), and an account could not create one.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertFails, createAccountAsync } from '../helpers/console-cli.js';
import { cliJsonAsync, runCliAsync, startControlPlane, stopAll } from '../helpers/processes.js';

test('an organisation always has an owner: the operator names one, an account becomes the owner of its own', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const alice = await createAccountAsync(cp, op, 'alice');
  const bob = await createAccountAsync(cp, op, 'bob');

  // The operator must name the owner.
  assertFails(await runCliAsync(cp, op, ['org', 'create', '--name', 'ownerless']), 400, 'operator org create without --owner', { message: /owner/ });
  const named = await cliJsonAsync(cp, op, ['org', 'create', '--name', 'named', '--owner', alice.id, '--tier', 'paid']);
  assert.equal(named.tier, 'paid');
  assert.deepEqual((await cliJsonAsync(cp, op, ['member', 'list', named.id])).members.map((m: any) => `${m.account_id}:${m.role}`), [`${alice.id}:owner`]);

  // An account without --owner becomes the owner of the organisation it creates, on the default tier.
  const own = await cliJsonAsync(cp, bob.token, ['org', 'create', '--name', 'bobs']);
  assert.equal(own.role, 'owner');
  assert.equal(own.tier, 'free');
  assert.deepEqual((await cliJsonAsync(cp, bob.token, ['member', 'list', own.id])).members.map((m: any) => `${m.account_id}:${m.role}`), [`${bob.id}:owner`]);
  // It can name itself, but nobody else, and it cannot pick a tier (tier changes need the operator).
  assert.equal((await cliJsonAsync(cp, bob.token, ['org', 'create', '--name', 'bobs-2', '--owner', bob.id])).role, 'owner');
  assertFails(await runCliAsync(cp, bob.token, ['org', 'create', '--name', 'for-alice', '--owner', alice.id]), 403, 'account naming another owner');
  assertFails(await runCliAsync(cp, bob.token, ['org', 'create', '--name', 'bobs-paid', '--tier', 'paid']), 403, 'account choosing a tier');
  // The refused calls created nothing.
  assert.deepEqual((await cliJsonAsync(cp, bob.token, ['org', 'list'])).orgs.map((o: any) => o.name).sort(), ['bobs', 'bobs-2']);
});
