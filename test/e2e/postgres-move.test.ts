// Moving a control plane from SQLite to PostgreSQL (issue 35, deliverable 7: `npm run
// move-to-postgres`): a gateway used on SQLite (accounts, an organisation with credit, a project, a
// key that served model calls, a revoked key, request logs over two UTC days) is stopped, its files
// are moved into an empty database, and a control plane started on that database with the same
// secrets answers the same through the CLI and GET /v1/usage; the key goes on working on a node of
// it, the revoked one stays refused. A database already used, and a missing --db, are refused with
// one line and exit 2.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { createOrgWithProjectAsync } from '../helpers/console-cli.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, request, setClock } from '../helpers/http.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';
import { cliJsonAsync, runProcessAsync, scriptArgs, startControlPlane, startDataPlane, type ControlPlane, type DataPlane } from '../helpers/processes.js';

// Two minutes before yesterday (UTC) ended: the usage and the logs fall on two days.
const T0 = Math.floor(Date.now() / 86_400_000) * 86_400_000 - 2 * 60_000;
const MONTH = new Date(T0).toISOString().slice(0, 7);
const RANGE = `start_time=${Math.floor(T0 / 1000) - 3600}&end_time=${Math.floor(T0 / 1000) + 3600}`;

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

function move(args: string[]) {
  return runProcessAsync(process.execPath, [...scriptArgs('control-plane/move-to-postgres.ts'), ...args], { timeoutMs: 120_000 });
}

interface Made {
  orgId: string;
  projectId: string;
  owner: { id: string; token: string };
  key: { id: string; key: string };
  revoked: { id: string; key: string };
}

/** Everything read back, through the CLI and GET /v1/usage (what differs per process left out). */
async function readBack(cp: ControlPlane, node: DataPlane, m: Made): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const by of ['model', 'day', 'key']) {
    out[`v1usage_${by}`] = (await request(`${node.url}/v1/usage?${RANGE}&group_by=${by}`, { headers: bearer(m.key.key) })).body;
    out[`cli_usage_${by}`] = await cliJsonAsync(cp, m.owner.token, ['usage', '--org', m.orgId, '--month', MONTH, '--by', by]);
  }
  const logs = (await cliJsonAsync(cp, m.owner.token, ['logs', '--key', m.key.id, '--all'])).logs as Record<string, unknown>[];
  // The reads of GET /v1/usage are logged too: left out, as the request ids and latencies.
  out.cli_logs = logs.filter((l) => l.path !== '/v1/usage').map((l) => Object.fromEntries(Object.entries(l).filter(([f]) => !/request_?id|latency|node|user_agent|bytes/i.test(f))));
  const org = await cliJsonAsync(cp, cp.secrets.operatorToken, ['org', 'show', m.orgId]);
  out.org = Object.fromEntries(Object.entries(org).filter(([f]) => f !== 'month'));
  out.keys = (await cliJsonAsync(cp, m.owner.token, ['key', 'list', '--project', m.projectId])).keys;
  out.audit = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['audit', '--org', m.orgId])).entries;
  return out;
}

test('a gateway used on SQLite, moved into an empty PostgreSQL database, answers the same there; its key goes on working, the revoked one stays refused', async () => {
  const cp = await startControlPlane({});
  let node = await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
  await setClock(node.adminUrl!, { now_ms: T0 });
  const op = cp.secrets.operatorToken;
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'moved');
  const key = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'kept']);
  const revoked = await cliJsonAsync(cp, owner.token, ['key', 'create', '--project', projectId, '--name', 'revoked']);
  await cliJsonAsync(cp, op, ['org', 'credit', orgId, '--usd', '7.25', '--note', 'before the move']);
  await waitUntilKnown(node.url, key.key);
  await cliJsonAsync(cp, owner.token, ['key', 'revoke', revoked.id]);
  const client = new OpenAI({ apiKey: key.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Before midnight' }] });
  await setClock(node.adminUrl!, { advance_ms: 3 * 60_000 });
  await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'After midnight, a longer question' }] });
  const m: Made = { orgId, projectId, owner, key: { id: key.id, key: key.key }, revoked: { id: revoked.id, key: revoked.key } };
  // Reports arrive on their own schedule: read until both calls are counted and logged.
  let before: Record<string, unknown> = {};
  for (const deadline = Date.now() + 20_000; ; ) {
    before = await readBack(cp, node, m);
    if ((before.v1usage_model as any)?.totals?.requests >= 2 && (before.cli_logs as unknown[]).length >= 2) break;
    if (Date.now() > deadline) throw new Error(`the two calls were never all counted and logged: ${JSON.stringify(before)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  await node.proc.kill('SIGTERM');
  await cp.proc.kill('SIGTERM');

  const url = await server.createDatabase();
  const moved = await move(['--db', cp.dbPath, '--database-url', url]);
  assert.equal(moved.code, 0, moved.stderr + moved.stdout);
  assert.match(moved.stdout, /api_keys: 2 rows/);
  assert.match(moved.stdout, /request logs: [1-9]\d* blocks over 2 days/);
  assert.doesNotMatch(moved.stdout + moved.stderr, new RegExp(new URL(url).password || '\u0000'), 'the password is never printed');

  const pgCp = await startControlPlane({ databaseUrl: url, secrets: cp.secrets });
  try {
    node = await startDataPlane(pgCp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    // The minute of the last call: the new node's probe for the key leaves last_used_at as it was.
    await setClock(node.adminUrl!, { now_ms: T0 + 3 * 60_000 });
    await waitUntilKnown(node.url, key.key);
    const after = await readBack(pgCp, node, m);
    // The new node's probe for the key (waitUntilKnown) is logged too, newest first: the rest is what was moved.
    const [probe, ...movedLogs] = after.cli_logs as Record<string, unknown>[];
    assert.deepEqual([probe.method, probe.path, probe.status], ['GET', '/v1/chat/completions', 405]);
    const copied: Record<string, unknown> = { ...after, cli_logs: movedLogs };
    for (const k of Object.keys(before)) assert.deepEqual(copied[k], before[k], k);
    // The key works on a node of the new control plane; the revoked key does not.
    const again = new OpenAI({ apiKey: key.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
    assert.ok((await again.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'After the move' }] })).id);
    const refused = await request(`${node.url}/v1/models`, { headers: bearer(revoked.key) });
    assert.equal(refused.status, 401, refused.text);
    // Writes go on: a new key, and a credit, whose ledger row takes the next id of a sequence the
    // move set past the copied rows (left where it was, this credit fails on a duplicate id).
    const fresh = await cliJsonAsync(pgCp, owner.token, ['key', 'create', '--project', projectId, '--name', 'after']);
    assert.notEqual(fresh.id, key.id);
    await cliJsonAsync(pgCp, op, ['org', 'credit', orgId, '--usd', '1.00', '--note', 'after the move']);
    assert.equal((await cliJsonAsync(pgCp, op, ['org', 'show', orgId])).credits_usd, '8.25');
  } finally {
    await node.proc.kill('SIGKILL');
    await pgCp.proc.kill('SIGKILL');
  }

  // The same database again: a control plane used it, the move refuses it.
  const twice = await move(['--db', cp.dbPath, '--database-url', url]);
  assert.equal(twice.code, 2, twice.stderr + twice.stdout);
  assert.match(twice.stderr, /already holds Tollgate tables/);
});

test('move-to-postgres: a missing --db file and a malformed URL are one line naming the flag, exit 2', async () => {
  const missing = await move(['--db', '/nonexistent/tollgate.db', '--database-url', 'postgres://u:secret@127.0.0.1:5432/db']);
  assert.equal(missing.code, 2, missing.stderr);
  assert.match(missing.stderr.trim(), /^--db: \/nonexistent\/tollgate\.db does not exist$/);
  const bad = await move(['--db', '/nonexistent/tollgate.db', '--database-url', 'mysql://u:secret@h/db']);
  assert.equal(bad.code, 2, bad.stderr);
  assert.match(bad.stderr, /--database-url must be a postgres:/);
  assert.doesNotMatch(bad.stderr, /secret/);
});
