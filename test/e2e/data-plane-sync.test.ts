// A node and its control plane over time: the node serves from its last state while the control plane
// is away, and when it is back the node catches up (including a revocation made while it was away)
// before it serves the revoked key again. Also: a node with the wrong pepper is refused clearly.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { consoleClient, createKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { startControlPlane, startDataPlane, startProcess, stopAll, type Proc } from '../helpers/processes.js';

after(stopAll);

function exitCode(p: Proc): Promise<number | null> {
  if (p.child.exitCode !== null) return Promise.resolve(p.child.exitCode);
  return new Promise((resolve) => p.child.once('exit', (code) => resolve(code)));
}

async function chatStatus(url: string, key: string): Promise<number> {
  return (await request(`${url}/v1/chat/completions`, { method: 'POST', json: chatBody(), headers: bearer(key) })).status;
}

test('control plane away: the node keeps serving; back: it catches up with a revocation made meanwhile', async () => {
  const cp1 = await startControlPlane();
  const dp = await startDataPlane(cp1, { nodeId: 'sync-node', adminListen: true });
  const c1 = consoleClient(cp1.address, cp1.secrets.operatorToken);
  const keep = await createKey(c1);
  const revoked = await createKey(c1);
  c1.close();
  await waitUntilKnown(dp.url, keep.key);
  await waitUntilKnown(dp.url, revoked.key);

  // Control plane stopped: known keys keep working, unknown ones stay refused.
  await cp1.proc.kill('SIGTERM');
  assert.equal(await chatStatus(dp.url, keep.key), 200);
  assert.equal(await chatStatus(dp.url, revoked.key), 200);
  assert.equal(await chatStatus(dp.url, 'sk-tollgate-nope'), 401);
  assert.equal((await fetch(`${dp.adminUrl}/readyz`)).status, 200);

  // The key is revoked through a control plane on another port, which the node cannot reach.
  const cp2 = await startControlPlane({ dir: cp1.dir, secrets: cp1.secrets });
  const c2 = consoleClient(cp2.address, cp2.secrets.operatorToken);
  const res = await c2.revokeKey({ keyId: revoked.keyId });
  assert.equal(res.apiKey?.status, 'revoked');
  c2.close();
  await cp2.proc.kill('SIGTERM');
  // Still away: fail-static, the node serves from its last state.
  assert.equal(await chatStatus(dp.url, keep.key), 200);

  // Back on the node's address: it reconnects, resumes from its version and applies the removal.
  const cp3 = await startControlPlane({ dir: cp1.dir, secrets: cp1.secrets, listen: cp1.address });
  const c3 = consoleClient(cp3.address, cp3.secrets.operatorToken);
  await eventually(async () => {
    const nodes = await c3.listNodes();
    const n = nodes.nodes.find((x) => x.id === 'sync-node');
    return !!n && n.connected && n.ackedVersion >= nodes.currentVersion;
  }, 'the node to reconnect and ack the current version', 15_000);
  assert.equal(await chatStatus(dp.url, revoked.key), 401);
  assert.equal(await chatStatus(dp.url, keep.key), 200);

  // And a revocation through the restarted control plane reaches it before the call returns.
  await c3.revokeKey({ keyId: keep.keyId });
  assert.equal(await chatStatus(dp.url, keep.key), 401);
  c3.close();
  // SIGTERM: listeners closed, reports flushed briefly, exit 0.
  assert.equal(await dp.proc.kill('SIGTERM'), 0);
});

test('a node whose pepper differs is refused with one clear line and exit code 2', async () => {
  const cp = await startControlPlane();
  const node = startProcess(['data-plane/main.ts', '--control-plane', cp.address, '--listen', '127.0.0.1:0'], {
    TOLLGATE_PEPPER: randomBytes(32).toString('hex'),
    TOLLGATE_NODE_TOKEN: cp.secrets.nodeToken,
  });
  await node.waitFor(/refused by control plane: pepper mismatch/);
  assert.equal(await exitCode(node), 2);
});

test('a node with a wrong node token is refused with exit code 2', async () => {
  const cp = await startControlPlane();
  const node = startProcess(['data-plane/main.ts', '--control-plane', cp.address, '--listen', '127.0.0.1:0'], {
    TOLLGATE_PEPPER: cp.secrets.pepper,
    TOLLGATE_NODE_TOKEN: 'node_wrong',
  });
  await node.waitFor(/refused by control plane: node token not accepted/);
  assert.equal(await exitCode(node), 2);
});

test('start-up settings are checked: a short pepper fails with one line', async () => {
  const node = startProcess(['data-plane/main.ts', '--control-plane', '127.0.0.1:1', '--listen', '127.0.0.1:0'], {
    TOLLGATE_PEPPER: 'short',
    TOLLGATE_NODE_TOKEN: 'x',
  });
  await node.waitFor(/key pepper too short/);
  assert.equal(await exitCode(node), 2);
});

test('a snapshot in parts (--snapshot-part-entries 3): a node started after keys were made and one revoked serves each as the whole snapshot would', async () => {
  const cp = await startControlPlane({ extraArgs: ['--snapshot-part-entries', '3'], adminListen: true });
  const c = consoleClient(cp.address, cp.secrets.operatorToken);
  const keys = [];
  for (let i = 0; i < 8; i++) keys.push(await createKey(c));
  const gone = keys.pop()!;
  await c.revokeKey({ keyId: gone.keyId });
  // 7 keys and a tombstone: three parts of at most three.
  const dp = await startDataPlane(cp, { nodeId: 'parts-node' });
  for (const k of keys) await waitUntilKnown(dp.url, k.key);
  for (const k of keys) assert.equal(await chatStatus(dp.url, k.key), 200);
  // It came as three messages (the control plane's count of what it sent).
  const metrics = await (await fetch(`${cp.adminUrl}/metrics`)).text();
  assert.match(metrics, /tollgate_cp_sync_messages_total\{direction="out",kind="snapshot"\} 3\b/);
  const refused = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', json: chatBody(), headers: bearer(gone.key) });
  assert.equal(refused.status, 401);
  // A key made after the snapshot arrives as a delta on top of it.
  const later = await createKey(c);
  await waitUntilKnown(dp.url, later.key);
  assert.equal(await chatStatus(dp.url, later.key), 200);
  c.close();
});
