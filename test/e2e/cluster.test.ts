// `npm run cluster` (cli/cluster.ts): a control plane, three real nodes and the load balancer come up;
// requests through the balancer reach every node, which count the client's X-Forwarded-For address
// (the balancer is their trusted proxy); with one node killed the balancer keeps serving from the
// other two; a revocation is confirmed by the two that remain and names the one that is gone; SIGTERM
// stops everything.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { cliJsonAsync, ROOT, runCliAsync, startProcess, stopAll, tempDir } from '../helpers/processes.js';
import { consoleClient } from '../helpers/console.js';

after(stopAll);

const NO_SECRET_ENV = { TOLLGATE_PEPPER: '', TOLLGATE_OPERATOR_TOKEN: '', TOLLGATE_NODE_TOKEN: '' };

function accepts(address: string): Promise<boolean> {
  const i = address.lastIndexOf(':');
  return new Promise((resolve) => {
    const s = connect({ host: address.slice(0, i), port: Number(address.slice(i + 1)) });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

test('the three-node cluster serves through its load balancer, survives a node killed, and the rest confirm a revocation', async (t) => {
  const dir = tempDir('tollgate-cluster-');
  const cluster = startProcess(
    [join(ROOT, 'cli', 'cluster.ts'), '--listen', '127.0.0.1:0', '--control-plane-listen', '127.0.0.1:0', '--data-dir', join(dir, 'data'), '--secrets-dir', join(dir, 'secrets')],
    NO_SECRET_ENV,
    { cwd: dir },
  );
  const ready = await cluster.waitFor(/cluster ready: API on http:\/\/(\S+)\/v1, control plane on (\S+), 3 node\(s\)/, 120_000);
  const lbUrl = `http://${ready[1]}`;
  const cp = { address: ready[2] };
  const out = cluster.output();
  const nodes = [...out.matchAll(/cluster: node (edge-\d) on (\S+), admin (\S+) \(pid (\d+)\)/g)].map((m) => ({ id: m[1], address: m[2], admin: m[3], pid: Number(m[4]) }));
  assert.deepEqual(nodes.map((n) => n.id).sort(), ['edge-1', 'edge-2', 'edge-3']);
  assert.match(readFileSync(join(dir, 'data', 'cluster-gateway.yaml'), 'utf8'), /trusted_proxies:\n\s+- 127\.0\.0\.1\/32/);
  const token = readFileSync(join(dir, 'data', 'operator-token'), 'utf8').trim();
  const key = /sk-tollgate-[0-9A-Za-z]{43}/.exec(out)![0];
  for (const n of nodes) await waitUntilKnown(`http://${n.address}`, key);

  // Through the balancer: every node serves (each one reports usage).
  for (let i = 0; i < 6; i++) {
    const r = await request(`${lbUrl}/v1/chat/completions`, { method: 'POST', json: chatBody(), headers: bearer(key) });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.object, 'chat.completion');
  }
  const c = consoleClient(cp.address, token);
  t.after(() => c.close());
  await eventually(async () => (await c.listNodes()).nodes.filter((n) => n.connected && n.lastReportAt !== '').length === 3, 'all three nodes to report usage');

  // The nodes count the client's address from X-Forwarded-For, not the balancer's: one client runs
  // out of its no-credential budget (12 per minute on each node), another is still served.
  const statuses: number[] = [];
  for (let i = 0; i < 39; i++) statuses.push((await request(`${lbUrl}/v1/models`, { headers: { 'x-forwarded-for': '203.0.113.7' } })).status);
  assert.ok(statuses.includes(429), `no 429 among ${statuses.join(',')}`);
  assert.equal((await request(`${lbUrl}/v1/models`, { headers: { 'x-forwarded-for': '203.0.113.8' } })).status, 401);

  // One node killed: the balancer skips it and every request is still served.
  const victim = nodes[1];
  process.kill(victim.pid, 'SIGKILL');
  await eventually(async () => !(await accepts(victim.address)), `${victim.id} to be gone`);
  for (let i = 0; i < 6; i++) {
    const r = await request(`${lbUrl}/v1/chat/completions`, { method: 'POST', json: chatBody(), headers: bearer(key) });
    assert.equal(r.status, 200, r.text);
  }
  await cluster.waitFor(new RegExp(`\\[load-balancer\\] load balancer: ${victim.address.replace(/\./g, '\\.')} unreachable`));

  // The revocation is confirmed by the two nodes left, and names the one that is gone.
  await eventually(async () => (await c.listNodes()).nodes.some((n) => n.id === victim.id && !n.connected), `${victim.id} to be seen as disconnected`);
  const keyId = (await cliJsonAsync(cp, token, ['key', 'list', '--project', /project (proj_\w+)/.exec(out)![1]])).keys[0].id as string;
  const revoked = await runCliAsync(cp, token, ['--json', 'key', 'revoke', keyId]);
  assert.equal(revoked.code, 0, revoked.stderr);
  const res = JSON.parse(revoked.stdout);
  assert.equal(res.nodes_total, 2);
  assert.equal(res.nodes_confirmed, 2);
  assert.deepEqual(res.nodes_unconfirmed, []);
  assert.deepEqual(res.nodes_disconnected.map((n: { id: string }) => n.id), [victim.id]);
  for (let i = 0; i < 4; i++) {
    const r = await request(`${lbUrl}/v1/chat/completions`, { method: 'POST', json: chatBody(), headers: bearer(key) });
    assert.equal(r.status, 401, r.text);
  }

  // SIGTERM stops the control plane, the nodes and the balancer.
  const cpAlive = nodes.filter((n) => n !== victim).map((n) => n.address).concat(cp.address, ready[1]);
  await cluster.kill('SIGTERM');
  for (const a of cpAlive) {
    const deadline = Date.now() + 20_000;
    while (await accepts(a)) {
      if (Date.now() > deadline) throw new Error(`${a} still accepts connections after SIGTERM`);
      await sleep(100);
    }
  }
});
