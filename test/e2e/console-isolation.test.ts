// A member of one organisation sees nothing of another's: its projects, keys and the organisation
// itself answer 404 (not 403, which would confirm they exist), and `org list` shows only its own.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertFails, createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { cliJsonAsync, runCliAsync, startControlPlane, stopAll } from '../helpers/processes.js';

test("keys of one organisation's project are invisible through another organisation's account", async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const a = await createOrgWithProjectAsync(cp, op, 'org-a');
  const b = await createOrgWithProjectAsync(cp, op, 'org-b');
  const keyA = await cliJsonAsync(cp, a.owner.token, ['key', 'create', '--project', a.projectId, '--name', 'a-key']);

  const asB = async (args: string[]) => await runCliAsync(cp, b.owner.token, args);
  assertFails(await asB(['key', 'list', '--project', a.projectId]), 404, 'key list of another org');
  assertFails(await asB(['key', 'revoke', keyA.id]), 404, 'key revoke of another org');
  assertFails(await asB(['org', 'show', a.orgId]), 404, 'org show of another org');
  assertFails(await asB(['project', 'list', '--org', a.orgId]), 404, 'project list of another org');
  assertFails(await asB(['member', 'list', a.orgId]), 404, 'member list of another org');
  assertFails(await asB(['usage', '--project', a.projectId]), 404, 'usage of another org');
  assertFails(await asB(['key', 'create', '--project', a.projectId]), 404, 'key create in another org');

  const orgsOfB = (await cliJsonAsync(cp, b.owner.token, ['org', 'list'])).orgs.map((o: any) => o.id);
  assert.deepEqual(orgsOfB, [b.orgId]);
  const orgsOfOperator = (await cliJsonAsync(cp, op, ['org', 'list'])).orgs.map((o: any) => o.id);
  assert.deepEqual(orgsOfOperator.sort(), [a.orgId, b.orgId].sort());

  // B's attempt changed nothing, and B's own project still lists (empty).
  const keysOfA = (await cliJsonAsync(cp, a.owner.token, ['key', 'list', '--project', a.projectId])).keys;
  assert.deepEqual(keysOfA.map((k: any) => [k.id, k.status]), [[keyA.id, 'active']]);
  assert.deepEqual((await cliJsonAsync(cp, b.owner.token, ['key', 'list', '--project', b.projectId])).keys, []);
  // The 404 message does not leak the other organisation's name.
  const r = await asB(['org', 'show', a.orgId]);
  assert.ok(!r.stderr.includes('org-a'), r.stderr);
});
