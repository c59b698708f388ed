// The SQLite request-log store: a report's blocks are written exactly once (a replay changes nothing),
// queries filter by key, window, IP and status and page newest first (rows of several blocks merged in
// time order), retention drops whole day partitions (the clock is injected), and the per-row tables of
// earlier versions are converted when the store opens.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'node:test';
import { LogBlocksBuilder, type LogRow } from '../../proto/lib/log-columns.js';
import type { LogSource } from '../../control-plane/store/log-store/log-store.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { SqliteLogStore } from '../../control-plane/store/log-store/sqlite-log-store.js';

const DAY = 86_400_000;
const T0 = Date.UTC(2025, 2, 10, 12, 0, 0);

function row(i: number, atMs: number, over: Partial<LogRow> = {}): LogRow {
  return {
    requestId: `r-${i}`, atMs, keyId: 'key_a', projectId: 'proj_1', orgId: 'org_1', clientIp: '10.0.0.1', userAgent: 'ua', method: 'POST',
    path: '/v1/chat/completions', status: 200, latencyUs: 1000, bytesIn: 10, bytesOut: 20, model: 'demo-chat', promptTokens: 1, completionTokens: 2,
    costMicros: 3, reason: '', keyPrefix: '', ...over,
  };
}

/** What a node sends: the rows packed in blocks, one per UTC day. */
function writeRows(s: SqliteLogStore, src: LogSource, seq: number, rows: LogRow[]) {
  const b = new LogBlocksBuilder();
  for (const r of rows) b.add(r);
  return s.writeBlocks(src, [{ seq, blocks: b.blocks() }]);
}

async function open(t: test.TestContext, now: { ms: number }, retentionDays = 30, dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'))): Promise<SqliteLogStore> {
  const store = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays, now: () => now.ms });
  t.after(async () => {
    await store.close().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });
  return store;
}

test('a replayed batch changes nothing; a later one is written', async (t) => {
  const now = { ms: T0 };
  const s = await open(t, now);
  const src = { nodeId: 'n1', instanceId: 'i1' };
  assert.deepEqual(await writeRows(s, src, 1, [row(1, T0), row(2, T0 + 1)]), { duplicate: false, written: 2 });
  assert.deepEqual(await writeRows(s, src, 1, [row(1, T0), row(2, T0 + 1)]), { duplicate: true, written: 0 });
  assert.deepEqual(await writeRows(s, { nodeId: 'n1', instanceId: 'i2' }, 1, [row(3, T0 + 2)]), { duplicate: false, written: 1 });
  const page = await s.query({ keyId: 'key_a' }, 100, '');
  assert.deepEqual(page.logs.map((l) => l.requestId), ['r-3', 'r-2', 'r-1']);
  assert.equal(page.logs[0].nodeId, 'n1');
});

test('filters by key, window, IP and status, and pages newest first across days', async (t) => {
  const now = { ms: T0 + 2 * DAY };
  const s = await open(t, now);
  const rows: LogRow[] = [];
  for (let i = 0; i < 30; i++) {
    rows.push(row(i, T0 + i * 3_600_000, { keyId: i % 2 ? 'key_a' : 'key_b', clientIp: i % 3 ? '10.0.0.1' : '10.0.0.2', status: i % 5 ? 200 : 401 }));
  }
  await writeRows(s, { nodeId: 'n', instanceId: 'i' }, 1, rows);
  assert.ok(s.partitions().length >= 2, `rows span days: ${s.partitions().join(',')}`);
  const want = rows.filter((r) => r.keyId === 'key_a' && r.atMs >= T0 + 5 * 3_600_000 && r.atMs < T0 + 25 * 3_600_000).reverse();
  const got: string[] = [];
  let token = '';
  do {
    const p = await s.query({ keyId: 'key_a', sinceMs: T0 + 5 * 3_600_000, untilMs: T0 + 25 * 3_600_000 }, 3, token);
    assert.ok(p.logs.length <= 3);
    got.push(...p.logs.map((l) => l.requestId));
    token = p.next;
  } while (token);
  assert.deepEqual(got, want.map((r) => r.requestId));
  const byIp = await s.query({ keyId: 'key_a', clientIp: '10.0.0.2' }, 100, '');
  assert.deepEqual(byIp.logs.map((l) => l.requestId), rows.filter((r) => r.keyId === 'key_a' && r.clientIp === '10.0.0.2').reverse().map((r) => r.requestId));
  const byStatus = await s.query({ orgId: 'org_1', status: 401 }, 100, '');
  assert.deepEqual(byStatus.logs.map((l) => l.requestId), rows.filter((r) => r.status === 401).reverse().map((r) => r.requestId));
});

test('retention drops whole day partitions older than the retention, and never writes into them again', async (t) => {
  const now = { ms: T0 };
  const s = await open(t, now, 3);
  const src = { nodeId: 'n', instanceId: 'i' };
  await writeRows(s, src, 1, [row(1, T0 - 2 * DAY), row(2, T0 - DAY), row(3, T0)]);
  assert.equal(s.partitions().length, 3);
  assert.deepEqual(await s.applyRetention(), []);
  // Two days later: the first two days are older than 3 days.
  now.ms = T0 + 2 * DAY;
  const dropped = await s.applyRetention();
  assert.equal(dropped.length, 2);
  assert.equal(s.partitions().length, 1);
  const left = await s.query({ keyId: 'key_a' }, 100, '');
  assert.deepEqual(left.logs.map((l) => l.requestId), ['r-3']);
  // A late replay of an old day's rows does not bring a dropped partition back.
  await writeRows(s, src, 2, [row(4, T0 - 2 * DAY), row(5, T0 + 2 * DAY)]);
  assert.equal(s.partitions().length, 2);
  assert.deepEqual((await s.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), ['r-5', 'r-3']);
});

test('rows of blocks from several nodes, overlapping in time, page in time order; the page token resumes exactly', async (t) => {
  const now = { ms: T0 + DAY };
  const s = await open(t, now);
  // Three nodes, each a report of 40 rows interleaved in time with the others'; another key between.
  const all: LogRow[] = [];
  for (let n = 0; n < 3; n++) {
    const rows: LogRow[] = [];
    for (let i = 0; i < 40; i++) rows.push(row(n * 100 + i, T0 + i * 10 + n, { keyId: i % 4 === 3 ? 'key_b' : 'key_a' }));
    await writeRows(s, { nodeId: `n${n}`, instanceId: 'i' }, 1, rows);
    all.push(...rows);
  }
  const want = all.filter((r) => r.keyId === 'key_a').sort((a, b) => b.atMs - a.atMs).map((r) => r.requestId);
  for (const pageSize of [1, 7, 90, 500]) {
    const got: string[] = [];
    let token = '';
    do {
      const p = await s.query({ keyId: 'key_a' }, pageSize, token);
      got.push(...p.logs.map((l) => l.requestId));
      token = p.next;
    } while (token);
    assert.deepEqual(got, want, `page size ${pageSize}`);
  }
  // By organisation (every key) and with no filter at all.
  const everything = all.sort((a, b) => b.atMs - a.atMs).map((r) => r.requestId);
  assert.deepEqual((await s.query({ orgId: 'org_1' }, 1000, '')).logs.map((l) => l.requestId), everything);
  assert.deepEqual((await s.query({}, 1000, '')).logs.map((l) => l.requestId), everything);
  assert.deepEqual((await s.query({ projectId: 'proj_2' }, 1000, '')).logs, []);
  await assert.rejects(s.query({ keyId: 'key_a' }, 10, 'nonsense'), /bad page token/);
});

test('a logs.db with the per-row day tables of an earlier version is converted to blocks when opened', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
  const raw = await SqliteDb.open(join(dir, 'logs.db'));
  await raw.exec(`CREATE TABLE logs_20250310 (
      request_id TEXT NOT NULL, at_ms INTEGER NOT NULL, node_id TEXT NOT NULL, key_id TEXT NOT NULL, project_id TEXT NOT NULL,
      org_id TEXT NOT NULL, client_ip TEXT NOT NULL, user_agent TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
      status INTEGER NOT NULL, latency_us INTEGER NOT NULL, bytes_in INTEGER NOT NULL, bytes_out INTEGER NOT NULL, model TEXT NOT NULL,
      prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL, reason TEXT NOT NULL,
      key_prefix TEXT NOT NULL)`);
  const old = [row(1, T0, { status: 401, reason: 'authentication_error' }), row(2, T0 + 5, { clientIp: '10.9.9.9' }), row(3, T0 + 9, { keyId: 'key_b' })];
  for (const [i, r] of old.entries()) {
    await raw.run('INSERT INTO logs_20250310 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)', [
      r.requestId, r.atMs, `node${i % 2}`, r.keyId, r.projectId, r.orgId, r.clientIp, r.userAgent, r.method, r.path, r.status, r.latencyUs,
      r.bytesIn, r.bytesOut, r.model, r.promptTokens, r.completionTokens, r.costMicros, r.reason, r.keyPrefix,
    ]);
  }
  await raw.close();
  const s = await open(t, { ms: T0 }, 30, dir);
  const got = await s.query({ orgId: 'org_1' }, 100, '');
  assert.deepEqual(got.logs, [...old].reverse().map((r) => ({ ...r, nodeId: `node${Number(r.requestId.slice(2)) % 2 === 1 ? 0 : 1}` })));
  assert.deepEqual(s.partitions(), ['20250310']);
});

test('reports written together: one transaction for all; a batch that overlaps what was written writes only the new reports', async (t) => {
  const s = await open(t, { ms: T0 });
  const src = { nodeId: 'n1', instanceId: 'i1' };
  const part = (seq: number) => {
    const b = new LogBlocksBuilder();
    b.add(row(seq, T0 + seq));
    return { seq, blocks: b.blocks() };
  };
  assert.deepEqual(await s.writeBlocks(src, [part(1), part(2)]), { duplicate: false, written: 2 });
  // The ack of 2 was lost: the node sends 2 again with 3 and 4.
  assert.deepEqual(await s.writeBlocks(src, [part(2), part(3), part(4)]), { duplicate: false, written: 2 });
  assert.deepEqual(await s.writeBlocks(src, [part(3), part(4)]), { duplicate: true, written: 0 });
  assert.deepEqual((await s.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), ['r-4', 'r-3', 'r-2', 'r-1']);
});

/** Rows in the key index table of a day, read through a connection of its own. */
async function indexRows(dir: string, day: string): Promise<number> {
  const raw = await SqliteDb.open(join(dir, 'logs.db'));
  try {
    return (await raw.get<{ n: number }>(`SELECT COUNT(*) AS n FROM logkeys_${day}`))!.n;
  } finally {
    await raw.close();
  }
}

test('the key index follows the blocks: written once for many reports, and every query finds the rows before and after it is written', async (t) => {
  // Before, each report wrote its index entries (three B-trees per key) in its own transaction: half
  // of the control plane's CPU per report with 5,000 keys (docs/scale.md, "The log index follows the blocks").
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
  const s = await open(t, { ms: T0 }, 30, dir);
  const src = { nodeId: 'n1', instanceId: 'i1' };
  for (let seq = 1; seq <= 5; seq++) {
    await writeRows(s, src, seq, [row(seq * 10, T0 + seq, { keyId: `key_${seq % 2}`, projectId: `proj_${seq % 2}`, orgId: 'org_1' }), row(seq * 10 + 1, T0 + seq, { keyId: 'key_all' })]);
  }
  const asked = async () => ({
    key0: (await s.query({ keyId: 'key_0' }, 100, '')).logs.map((l) => l.requestId),
    key1: (await s.query({ keyId: 'key_1' }, 100, '')).logs.map((l) => l.requestId),
    all: (await s.query({ keyId: 'key_all' }, 100, '')).logs.length,
    project: (await s.query({ projectId: 'proj_1' }, 100, '')).logs.length,
    org: (await s.query({ orgId: 'org_1' }, 100, '')).logs.length,
  });
  const before = await asked();
  assert.deepEqual(before, { key0: ['r-40', 'r-20'], key1: ['r-50', 'r-30', 'r-10'], all: 5, project: 8, org: 10 });
  assert.equal(await indexRows(dir, '20250310'), 0, 'nothing indexed yet');
  await s.writeIndex();
  assert.equal(await indexRows(dir, '20250310'), 10, 'one entry per key and block, in one write');
  assert.deepEqual(await asked(), before);
});

test('a store that stopped without writing its key index indexes the blocks past the cursor when it opens again', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
  const logged: string[] = [];
  const first = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0 });
  await writeRows(first, { nodeId: 'n1', instanceId: 'i1' }, 1, [row(1, T0), row(2, T0 + 1, { keyId: 'key_b' })]);
  await first.writeIndex();
  await writeRows(first, { nodeId: 'n1', instanceId: 'i1' }, 2, [row(3, T0 + 2, { keyId: 'key_c' })]);
  // The process dies here: key_c's entry was never written. The next one opens the same file.
  const second = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0, log: (l) => logged.push(l) });
  t.after(async () => {
    await first.close().catch(() => {});
    await second.close().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });
  assert.deepEqual(logged, ['request logs: 1 block(s) written before the last stop indexed']);
  assert.equal(await indexRows(dir, '20250310'), 3);
  assert.deepEqual((await second.query({ keyId: 'key_c' }, 100, '')).logs.map((l) => l.requestId), ['r-3']);
  // A logs.db from before the cursor existed was indexed block by block: nothing to index again.
  const raw = await SqliteDb.open(join(dir, 'logs.db'));
  await raw.exec('DROP TABLE log_index_cursor');
  await raw.close();
  const third = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0, log: (l) => logged.push(l) });
  await third.close();
  assert.equal(logged.length, 1);
});

test('a report with 130,000 keys in its blocks is indexed like any other (its entries are queued without spreading them as arguments)', async (t) => {
  // Before: queueing 130,000 entries behind others of the same day threw RangeError after COMMIT, so
  // the report was stored, its resend was a duplicate, and its keys were never indexed.
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
  const s = await open(t, { ms: T0 }, 30, dir);
  const src = { nodeId: 'n1', instanceId: 'i1' };
  await writeRows(s, src, 1, [row(1, T0)]);
  const many = Array.from({ length: 130_000 }, (_, i) => row(100 + i, T0 + 1, { keyId: `key_${i}` }));
  assert.deepEqual(await writeRows(s, src, 2, many), { duplicate: false, written: 130_000 });
  assert.deepEqual((await s.query({ keyId: 'key_129999' }, 10, '')).logs.map((l) => l.requestId), ['r-130099']);
  await s.writeIndex();
  assert.equal(await indexRows(dir, '20250310'), 130_001);
});

test("a report's blocks and cursor are one statement once its instance's cursor and the day's next block id are known; after a restart a resend is a replay and block ids go on", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
  const first = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0 });
  const src = { nodeId: 'n1', instanceId: 'i1' };
  const counted = async (s: SqliteLogStore, seq: number, rows: LogRow[], source: LogSource = src) => {
    const before = s.statementsIssued;
    const r = await writeRows(s, source, seq, rows);
    return { ...r, statements: s.statementsIssued - before };
  };
  assert.deepEqual(await writeRows(first, src, 1, [row(1, T0)]), { duplicate: false, written: 1 });
  assert.deepEqual(await counted(first, 2, [row(2, T0 + 1), row(3, T0 + 2, { keyId: 'key_b' })]), { duplicate: false, written: 2, statements: 1 });
  // A new instance's first report is new whatever its seq.
  assert.deepEqual((await writeRows(first, { nodeId: 'n1', instanceId: 'i0' }, 0, [row(4, T0 + 3)])).duplicate, false);
  await first.close();
  // The next process opens the file; a day made before the sink view existed gets one when it opens.
  const raw = await SqliteDb.open(join(dir, 'logs.db'));
  await raw.exec('DROP VIEW logsink_20250310');
  await raw.close();
  const second = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0 });
  t.after(async () => {
    await second.close().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });
  assert.deepEqual(await writeRows(second, src, 2, [row(2, T0 + 1), row(3, T0 + 2, { keyId: 'key_b' })]), { duplicate: true, written: 0 }, 'the resend of a written report');
  assert.deepEqual(await writeRows(second, src, 3, [row(5, T0 + 4)]), { duplicate: false, written: 1 });
  assert.deepEqual(await counted(second, 4, [row(6, T0 + 5)]), { duplicate: false, written: 1, statements: 1 });
  const check = await SqliteDb.open(join(dir, 'logs.db'));
  try {
    assert.deepEqual(await check.get('SELECT COUNT(*) AS n, COUNT(DISTINCT id) AS ids, MIN(id) AS first, MAX(id) AS last FROM logblocks_20250310'), { n: 5, ids: 5, first: 1, last: 5 });
    assert.deepEqual(await check.all('SELECT instance_id, last_seq FROM log_cursors ORDER BY instance_id'), [{ instance_id: 'i0', last_seq: 0 }, { instance_id: 'i1', last_seq: 4 }]);
  } finally {
    await check.close();
  }
  const keyA = ['r-6', 'r-5', 'r-4', 'r-2', 'r-1'];
  assert.deepEqual((await second.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), keyA);
  await second.writeIndex();
  assert.deepEqual((await second.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), keyA, 'the index entries name the blocks written');
  assert.deepEqual((await second.query({ keyId: 'key_b' }, 100, '')).logs.map((l) => l.requestId), ['r-3']);
});

test('parts out of seq order move the cursor to their highest seq, in memory as in the file; a day view left without its tables is dropped when the store opens', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
  const s = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0 });
  t.after(async () => {
    await s.close().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });
  const src = { nodeId: 'n1', instanceId: 'i1' };
  const part = (seq: number) => {
    const b = new LogBlocksBuilder();
    b.add(row(seq, T0 + seq));
    return { seq, blocks: b.blocks() };
  };
  assert.deepEqual(await s.writeBlocks(src, [part(4)]), { duplicate: false, written: 1 });
  assert.deepEqual(await s.writeBlocks(src, [part(6), part(3)]), { duplicate: false, written: 1 }, 'only 6 is past the cursor');
  assert.deepEqual(await s.writeBlocks(src, [part(4)]), { duplicate: true, written: 0 }, 'the resend of 4 is a replay');
  assert.deepEqual(await s.writeBlocks(src, [part(5)]), { duplicate: true, written: 0 }, 'the cursor is at 6');
  assert.deepEqual((await s.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), ['r-6', 'r-4']);
  await s.close();
  const raw = await SqliteDb.open(join(dir, 'logs.db'));
  await raw.exec("CREATE VIEW logsink_20250101 AS SELECT NULL AS id");
  await raw.close();
  const again = await SqliteLogStore.open(join(dir, 'logs.db'), { retentionDays: 30, now: () => T0 });
  await again.close();
  const check = await SqliteDb.open(join(dir, 'logs.db'));
  try {
    assert.deepEqual(await check.all("SELECT name FROM sqlite_master WHERE type = 'view' ORDER BY name"), [{ name: 'logsink_20250310' }]);
  } finally {
    await check.close();
  }
});
