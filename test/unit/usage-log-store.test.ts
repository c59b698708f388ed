// The SQLite request-log store: a batch is written exactly once (a replay changes nothing), queries
// filter by key, window, IP and status and page newest first, and retention drops whole day
// partitions (the clock is injected).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'node:test';
import type { LogRow } from '../../proto/lib/log-columns.js';
import { SqliteLogStore } from '../../control-plane/store/sqlite-log-store.js';

const DAY = 86_400_000;
const T0 = Date.UTC(2025, 2, 10, 12, 0, 0);

function row(i: number, atMs: number, over: Partial<LogRow> = {}): LogRow {
  return {
    requestId: `r-${i}`, atMs, keyId: 'key_a', projectId: 'proj_1', orgId: 'org_1', clientIp: '10.0.0.1', userAgent: 'ua', method: 'POST',
    path: '/v1/chat/completions', status: 200, latencyUs: 1000, bytesIn: 10, bytesOut: 20, model: 'demo-chat', promptTokens: 1, completionTokens: 2,
    costMicros: 3, reason: '', keyPrefix: '', ...over,
  };
}

async function open(t: test.TestContext, now: { ms: number }, retentionDays = 30): Promise<SqliteLogStore> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-logs-'));
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
  assert.deepEqual(await s.writeBatch(src, 1, [row(1, T0), row(2, T0 + 1)]), { duplicate: false, written: 2 });
  assert.deepEqual(await s.writeBatch(src, 1, [row(1, T0), row(2, T0 + 1)]), { duplicate: true, written: 0 });
  assert.deepEqual(await s.writeBatch({ nodeId: 'n1', instanceId: 'i2' }, 1, [row(3, T0 + 2)]), { duplicate: false, written: 1 });
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
  await s.writeBatch({ nodeId: 'n', instanceId: 'i' }, 1, rows);
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
  await s.writeBatch(src, 1, [row(1, T0 - 2 * DAY), row(2, T0 - DAY), row(3, T0)]);
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
  await s.writeBatch(src, 2, [row(4, T0 - 2 * DAY), row(5, T0 + 2 * DAY)]);
  assert.equal(s.partitions().length, 2);
  assert.deepEqual((await s.query({ keyId: 'key_a' }, 100, '')).logs.map((l) => l.requestId), ['r-5', 'r-3']);
});
