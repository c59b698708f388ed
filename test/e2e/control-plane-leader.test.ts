// Several control planes on one PostgreSQL database (issue 35, deliverables 2 and 3): exactly one
// leads (a session advisory lock), the others answer every call UNAVAILABLE naming the leader, and
// nodes and the CLI given several addresses find the leader themselves. The lead is fenced: a leader
// whose lock went (its connection terminated with pg_terminate_backend while its own side never hears
// of it, as on a lost network) has its next write refused by the epoch check in the database, and
// stops serving. SIGKILL of the leader: the standby leads within 10 s, the node keeps serving, every
// request it answered is billed once (GET /v1/usage and the balance through the CLI), and a key made
// on the new leader reaches it (one node, light load: not deliverable 4's three nodes under load).
// On SQLite a second control plane on the same file is refused. One PostgreSQL server for the file,
// one database per test.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import pg from 'pg';
import { createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, request } from '../helpers/http.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';
import { cliJsonAsync, newSecrets, runCliAsync, runProcessAsync, scriptArgs, startControlPlane, startDataPlane, type ControlPlane, type Secrets } from '../helpers/processes.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

/** The advisory lock the leader holds (control-plane/store/pg-locks.ts LEADER_LOCK). */
const LEADER_LOCK = 0x7011_0003;

async function startLeaderAndStandby(databaseUrl: string, secrets: Secrets, leaderUrl = databaseUrl): Promise<{ a: ControlPlane; b: ControlPlane }> {
  const a = await startControlPlane({ databaseUrl: leaderUrl, secrets });
  await a.proc.waitFor(/control plane leading \(epoch 1\)/);
  const b = await startControlPlane({ databaseUrl, secrets });
  await b.proc.waitFor(/standing by: another control plane leads at \S+/);
  return { a, b };
}

async function chat(nodeUrl: string, key: string): Promise<string> {
  const client = new OpenAI({ apiKey: key, baseURL: `${nodeUrl}/v1`, maxRetries: 0 });
  const r = await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello' }] });
  return r.choices[0].message.content ?? '';
}

/** An organisation with credit, a project and a key, made through the CLI given `addresses`. */
async function fundedKey(addresses: string, secrets: Secrets, label: string, tier = 'free'): Promise<{ key: string; projectId: string; owner: string; orgId: string }> {
  const cp = { address: addresses };
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, secrets.operatorToken, label, tier);
  await cliJsonAsync(cp, secrets.operatorToken, ['org', 'credit', orgId, '--usd', '5']);
  const k = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', `${label}-key`]);
  return { key: k.key, projectId, owner: owner.token, orgId };
}

test('two control planes on one database: one leads, the other answers UNAVAILABLE naming it; a node and the CLI given both (standby first) find the leader', async (t) => {
  const secrets = newSecrets();
  const { a, b } = await startLeaderAndStandby(await server.createDatabase(), secrets);
  t.after(() => Promise.all([a.proc.kill('SIGKILL'), b.proc.kill('SIGKILL')]));
  assert.match(b.proc.output(), new RegExp(`standing by: another control plane leads at ${a.address}`));

  // The CLI given the standby alone: the standby's UNAVAILABLE names the leader, and the call goes there.
  const who = await runCliAsync(b, secrets.operatorToken, ['--json', 'whoami']);
  assert.equal(who.code, 0, who.stderr);
  assert.equal(JSON.parse(who.stdout).operator, true);
  assert.match(who.stderr, new RegExp(`note: ${b.address} answered "this control plane is a standby: the leader is at ${a.address}"; asking ${a.address}`));

  // A node given both, the standby first: refused there (UNAVAILABLE naming the leader), it syncs with the leader.
  const node = await startDataPlane({ address: `${b.address},${a.address}`, secrets });
  t.after(() => node.proc.kill('SIGKILL'));
  assert.match(node.proc.output(), new RegExp(`control plane connection lost \\(UNAVAILABLE: this control plane is a standby: the leader is at ${a.address}\\)`));
  assert.match(node.proc.output(), new RegExp(`control plane ${b.address} stands by; the leader is at ${a.address}`));

  // The CLI given both (standby first) creates a key; the node serves it.
  const { key } = await fundedKey(`${b.address},${a.address}`, secrets, 'two-cps');
  await waitUntilKnown(node.url, key);
  assert.ok((await chat(node.url, key)).length > 0);
  // The standby did nothing meanwhile: it still stands by.
  assert.doesNotMatch(b.proc.output(), /control plane leading/);
});

test("fencing: a leader whose lock was taken over has its next write refused by the epoch check, and stops serving", async (t) => {
  const secrets = newSecrets();
  const databaseUrl = await server.createDatabase();
  // The first control plane reaches PostgreSQL through a relay, so that its lock connection can go
  // silent: the server ends the session, and the control plane is never told.
  const relay = await startTcpRelay(`127.0.0.1:${server.port}`);
  t.after(() => relay.close());
  const relayed = databaseUrl.replace(`:${server.port}/`, `:${relay.address.split(':')[1]}/`);
  const { a, b } = await startLeaderAndStandby(databaseUrl, secrets, relayed);
  t.after(() => Promise.all([a.proc.kill('SIGKILL'), b.proc.kill('SIGKILL')]));
  const node = await startDataPlane({ address: `${a.address},${b.address}`, secrets });
  t.after(() => node.proc.kill('SIGKILL'));
  const first = await fundedKey(`${a.address},${b.address}`, secrets, 'fence-before');
  await waitUntilKnown(node.url, first.key);

  // The leader's lock: held by a session of the relayed control plane. Its connection goes silent,
  // then the server ends that session (and so the lock).
  const admin = new pg.Client({ connectionString: server.adminUrl(databaseUrl.slice(databaseUrl.lastIndexOf('/') + 1)) });
  await admin.connect();
  t.after(() => admin.end());
  const lock = await admin.query<{ pid: number; client_port: number }>(
    "SELECT l.pid, a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objid = $1 AND l.granted",
    [LEADER_LOCK],
  );
  assert.equal(lock.rows.length, 1);
  assert.ok(relay.targetPorts().includes(lock.rows[0].client_port), 'the lock is held by the relayed control plane');
  relay.hold(lock.rows[0].client_port);
  await admin.query('SELECT pg_terminate_backend($1)', [lock.rows[0].pid]);
  await b.proc.waitFor(/control plane leading \(epoch 2\)/, 15_000);

  // The former leader's next write (a node's report, or this key creation, whichever comes first)
  // fails on the epoch in the database; it stops at once and exits, naming the new leader.
  const second = await fundedKey(`${a.address},${b.address}`, secrets, 'fence-after');
  await a.proc.waitFor(new RegExp(`lost the lead: write refused: this control plane led in epoch 1, another leads in epoch 2: the leader is at ${b.address}`), 15_000);
  const exitCode = a.proc.child.exitCode ?? (await new Promise<number | null>((resolve) => a.proc.child.once('exit', resolve)));
  assert.equal(exitCode, 3, 'a control plane that lost the lead exits 3 (its supervisor starts it again, as a standby)');
  assert.doesNotMatch(a.proc.output(), /lost the lead: lock connection/, 'the fence, not the lock connection, stopped it');

  // What the former leader was asked after the new one led was done once, on the new leader.
  const keys = await cliJsonAsync(b, second.owner, ['key', 'list', '--project', second.projectId]);
  assert.equal(keys.keys.length, 1, JSON.stringify(keys));
  // The node moved to the new leader: the key made there reaches it, and both keys serve.
  await waitUntilKnown(node.url, second.key, 15_000);
  assert.ok((await chat(node.url, second.key)).length > 0);
  assert.ok((await chat(node.url, first.key)).length > 0);
});

test('SIGKILL of the leader: the standby leads within 10 s, the node keeps serving, every answered request is billed once, and a key made on the new leader reaches it', async (t) => {
  const secrets = newSecrets();
  const { a, b } = await startLeaderAndStandby(await server.createDatabase(), secrets);
  t.after(() => Promise.all([a.proc.kill('SIGKILL'), b.proc.kill('SIGKILL')]));
  const node = await startDataPlane({ address: `${a.address},${b.address}`, secrets });
  t.after(() => node.proc.kill('SIGKILL'));
  // The paid tier (300 rpm): the requests sent through the failover stay within the key's minute.
  const first = await fundedKey(`${a.address},${b.address}`, secrets, 'kill-before', 'paid');
  await waitUntilKnown(node.url, first.key);

  const killedAt = Date.now();
  await a.proc.kill('SIGKILL');
  // Requests keep being answered while no control plane leads.
  let served = 0;
  let leading = false;
  const took = b.proc.waitFor(/control plane leading \(epoch 2\)/, 10_000).then(() => (leading = true));
  while (!leading) {
    assert.ok((await chat(node.url, first.key)).length > 0);
    served++;
    if (Date.now() - killedAt > 10_000) break;
    // Paced: about 20 a second.
    await sleep(50);
  }
  await took;
  const failoverMs = Date.now() - killedAt;
  assert.ok(failoverMs <= 10_000, `the standby led after ${failoverMs} ms`);
  assert.ok(served > 0);

  // The CLI given both (the dead one first) creates a key on the new leader; it reaches the node.
  const second = await fundedKey(`${a.address},${b.address}`, secrets, 'kill-after');
  await waitUntilKnown(node.url, second.key, 15_000);
  assert.ok((await chat(node.url, second.key)).length > 0);
  assert.ok((await chat(node.url, first.key)).length > 0);
  served++;

  // Every request the node answered with the first key, before and after the takeover, is billed
  // once: the node's journal replays to the new leader, which writes each report once.
  const range = `start_time=${Math.floor(killedAt / 1000) - 3600}&end_time=${Math.floor(Date.now() / 1000) + 3600}`;
  let usage: { totals: { requests: number; cost_usd: string } } | null = null;
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    const r = await request(`${node.url}/v1/usage?${range}`, { headers: bearer(first.key) });
    if (r.status === 200 && r.body.totals.requests >= served) {
      usage = r.body;
      break;
    }
    await sleep(100);
  }
  assert.ok(usage, `usage never counted the ${served} requests answered`);
  assert.equal(usage.totals.requests, served);
  const org = await cliJsonAsync(b, secrets.operatorToken, ['org', 'show', first.orgId]);
  assert.equal(org.spend_total_usd, usage.totals.cost_usd, 'the balance paid for exactly the requests answered');
});

test('on SQLite one control plane per file: a second started on the same --db is refused with one line, exit 2', async (t) => {
  const first = await startControlPlane();
  t.after(() => first.proc.kill('SIGKILL'));
  const second = await runProcessAsync(process.execPath, [...scriptArgs('control-plane/main.ts'), '--db', first.dbPath, '--listen', '127.0.0.1:0'], {
    env: { ...process.env, TOLLGATE_PEPPER: first.secrets.pepper, TOLLGATE_OPERATOR_TOKEN: first.secrets.operatorToken, TOLLGATE_NODE_TOKEN: first.secrets.nodeToken, TOLLGATE_TEST_STORE: '' },
  });
  assert.equal(second.code, 2, second.stderr + second.stdout);
  assert.equal(second.stderr.trim(), `another control plane uses ${first.dbPath}: one control plane per SQLite file (several need PostgreSQL, --database-url)`);
  assert.doesNotMatch(second.stdout, /control plane listening/);
  // The first is untouched: it still answers.
  const who = await runCliAsync(first, first.secrets.operatorToken, ['--json', 'whoami']);
  assert.equal(who.code, 0, who.stderr);
});
