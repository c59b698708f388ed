// Revocation in the spec's order: the credential is deleted and pushed to every node, the control
// plane waits for the nodes' acks, and only then does the console record say `revoked`. A control
// plane killed between the two steps repairs the record when it starts again.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { hashKey } from '../../proto/lib/keys.js';
import { assertFails, createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { removesKeyHash, startFakeNode } from '../helpers/fake-node.js';
import { cliJsonAsync, runCliAsync, startControlPlane, stopAll, type ControlPlane } from '../helpers/processes.js';

async function setupKey(cp: ControlPlane) {
  const { owner, projectId } = await createOrgWithProjectAsync(cp, cp.secrets.operatorToken, 'revoker');
  const created = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'doomed']);
  const hash = hashKey(Buffer.from(cp.secrets.pepper, 'utf8'), created.key);
  return { owner, projectId, created, hash };
}

// The node's ack is awaited far longer than the test needs, so holding it is never cut short.
const SLOW_ACKS = { extraArgs: ['--revoke-ack-timeout-ms', '60000'] };

const statusOf = async (cp: ControlPlane, token: string, projectId: string, keyId: string) =>
  (await cliJsonAsync(cp, token, ['key', 'list', '--project', projectId])).keys.find((k: any) => k.id === keyId)?.status;

test('a revoked key stays active in the console until the node acks, then is revoked for good', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane(SLOW_ACKS);
  const { owner, projectId, created, hash } = await setupKey(cp);

  const node = await startFakeNode(cp, { nodeId: 'slow-node', holdAcks: true });
  t.after(() => node.close());
  const entry = node.snapshot.keys.find((k) => k.keyId === created.id);
  assert.ok(entry, 'the snapshot carries the key');
  assert.equal(entry.keyHash, hash, 'the synced credential is HMAC-SHA256(pepper, key)');
  assert.deepEqual([entry.rpmLimit, entry.tpmLimit, entry.maxParallelRequests], [20, 60000, 100]);
  const nodes = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['nodes', 'list'])).nodes;
  assert.ok(nodes.some((n: any) => n.id === 'slow-node' && n.connected), JSON.stringify(nodes));

  const revoking = runCliAsync(cp, owner.token, ['--json', 'key', 'revoke', created.id]);
  await node.waitForDelta(removesKeyHash(hash));
  // The credential is gone from the gateway's table, but the node has not confirmed yet.
  assert.equal(await statusOf(cp, owner.token, projectId, created.id), 'active');
  node.release();
  const r = await revoking;
  assert.equal(r.code, 0, r.stderr);
  const revoked = JSON.parse(r.stdout);
  assert.deepEqual(revoked, { id: created.id, status: 'revoked', key_prefix: created.key_prefix, nodes_confirmed: 1, nodes_total: 1, nodes_unconfirmed: [], nodes_disconnected: [] });
  const listed = (await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId])).keys.find((k: any) => k.id === created.id);
  assert.equal(listed.status, 'revoked');
  assert.equal(typeof listed.revoked_at, 'string');

  // No way back out of `revoked`: revoking again (success or refusal) leaves it revoked.
  const again = await runCliAsync(cp, owner.token, ['--json', 'key', 'revoke', created.id]);
  if (again.code === 0) assert.equal(JSON.parse(again.stdout).status, 'revoked');
  else assertFails(again, 400, 'revoke of a revoked key');
  assert.equal(await statusOf(cp, owner.token, projectId, created.id), 'revoked');
});

test('a control plane killed between credential deletion and record update comes back with the key revoked', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane(SLOW_ACKS);
  const { owner, projectId, created, hash } = await setupKey(cp);

  // This node never acks, so the revocation is stuck waiting when the control plane dies.
  const node = await startFakeNode(cp, { nodeId: 'never-acks', holdAcks: true });
  t.after(() => node.close());
  const revoking = runCliAsync(cp, owner.token, ['--json', 'key', 'revoke', created.id]);
  await node.waitForDelta(removesKeyHash(hash));
  await cp.proc.kill('SIGKILL');
  const r = await revoking;
  assert.notEqual(r.code, 0, `the interrupted revoke must not report success: ${r.stdout}`);
  assert.match(r.stderr, /^(503|500) /);
  node.close();

  const restarted = await startControlPlane({ dir: cp.dir, secrets: cp.secrets });
  assert.equal(await statusOf(restarted, owner.token, projectId, created.id), 'revoked');
  // And the credential is not handed to nodes again.
  const fresh = await startFakeNode(restarted, { nodeId: 'after-restart', holdAcks: false });
  t.after(() => fresh.close());
  assert.equal(fresh.snapshot.keys.some((k) => k.keyId === created.id || k.keyHash === hash), false);
});
