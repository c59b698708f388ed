// rpm, tpm and max parallel requests are fixed onto a key when it is created, from the
// organisation's tier at that moment: a tier change affects only keys created afterwards.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { cliJsonAsync, startControlPlane, stopAll } from '../helpers/processes.js';

const limitsOf = (k: any) => [k.rpm_limit, k.tpm_limit, k.max_parallel_requests];

test("a tier change leaves existing keys' limits unchanged", async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'upgrader', 'free');

  const oldKey = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'old']);
  assert.deepEqual(limitsOf(oldKey), [20, 60000, 100]);

  const paid = await cliJsonAsync(cp, op, ['org', 'set-tier', orgId, '--tier', 'paid']);
  assert.equal(paid.tier, 'paid');
  assert.equal(paid.cap_usd, null, 'the paid tier has no monthly cap');
  assert.equal(paid.free_grant_usd, '0.00');

  const newKey = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'new']);
  assert.deepEqual(limitsOf(newKey), [300, 1000000, 100]);

  const listed = new Map((await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId])).keys.map((k: any) => [k.id, k]));
  assert.deepEqual(limitsOf(listed.get(oldKey.id)), [20, 60000, 100]);
  assert.deepEqual(limitsOf(listed.get(newKey.id)), [300, 1000000, 100]);

  // Back to free: both keys keep what they were created with.
  assert.equal((await cliJsonAsync(cp, op, ['org', 'set-tier', orgId, '--tier', 'free'])).tier, 'free');
  const again = new Map((await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId])).keys.map((k: any) => [k.id, k]));
  assert.deepEqual(limitsOf(again.get(oldKey.id)), [20, 60000, 100]);
  assert.deepEqual(limitsOf(again.get(newKey.id)), [300, 1000000, 100]);
});
