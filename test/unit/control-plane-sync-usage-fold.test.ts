// Usage is journaled, then folded (control-plane/sync/usage-fold.ts,
// docs/design.md#usage-is-journaled-then-folded): every sum read through usage_minutes is the same
// before, during and after a fold, a fold that fails leaves every row where it was, and what a
// stopped process left in the journal is folded by the next one.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { addUsageMinutes, type UsageMinute } from '../../control-plane/store/usage-repo.js';
import { FOLD_AT_ROWS, UsageFold } from '../../control-plane/sync/usage-fold.js';
import { eventually } from '../helpers/data-plane.js';

const MINUTE = 29_000_000;

async function open(t: { after(fn: () => unknown): void }, dir?: string): Promise<{ db: SqliteDb; dir: string }> {
  const d = dir ?? mkdtempSync(join(tmpdir(), 'tollgate-usage-fold-'));
  if (!dir) t.after(() => rmSync(d, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(d, 'tollgate.db'));
  await runMigrations(db);
  return { db, dir: d };
}

/** One report's rows: `keys` keys of 4 projects, one call of 10 µ$ each in `minute`. */
function rows(keys: number, minute = MINUTE, model = 'demo-chat'): UsageMinute[] {
  return Array.from({ length: keys }, (_, i) => ({
    projectId: `proj_${i % 4}`,
    orgId: `org_${i % 4}`,
    keyId: `key_${String(i).padStart(5, '0')}`,
    model,
    minute,
    requests: 1,
    promptTokens: 7,
    completionTokens: 9,
    costMicros: 10,
  }));
}

async function journal(db: SqliteDb, fold: UsageFold, r: UsageMinute[]): Promise<void> {
  await db.tx(async (tx) => {
    await addUsageMinutes(tx, r);
    tx.afterCommit(() => fold.journaled(r.length));
  });
}

interface Sums {
  rows: number;
  requests: number;
  cost: number;
  tokens: number;
}

/** What every reader sums: usage per project and per organisation, and everything, through the view. */
async function sums(q: SqliteDb): Promise<{ all: Sums; byProject: unknown[]; byOrg: unknown[]; journal: number; folded: number }> {
  const all = (await q.get<Sums>('SELECT COUNT(*) AS rows, SUM(requests) AS requests, SUM(cost_micros) AS cost, SUM(prompt_tokens + completion_tokens) AS tokens FROM usage_minutes'))!;
  const byProject = await q.all("SELECT key_id, model, SUM(requests) AS r, SUM(cost_micros) AS c FROM usage_minutes WHERE project_id = 'proj_1' AND minute >= ? AND minute < ? GROUP BY key_id, model ORDER BY key_id", [MINUTE, MINUTE + 2]);
  const byOrg = await q.all("SELECT minute, SUM(requests) AS r FROM usage_minutes WHERE org_id = 'org_2' GROUP BY minute ORDER BY minute");
  const journal = (await q.get<{ n: number }>('SELECT COUNT(*) AS n FROM usage_journal'))!.n;
  const folded = (await q.get<{ n: number }>('SELECT COUNT(*) AS n FROM usage_folded'))!.n;
  return { all, byProject, byOrg, journal, folded };
}

test('journaled usage counts at once; a fold sums it per key and minute and changes no sum', async (t) => {
  const { db } = await open(t);
  t.after(() => db.close());
  const fold = new UsageFold(db);
  // Three reports of 100 keys in one minute, a fourth in the next minute.
  for (let i = 0; i < 3; i++) await journal(db, fold, rows(100));
  await journal(db, fold, rows(100, MINUTE + 1));
  assert.equal(fold.pending, 400);
  const before = await sums(db);
  assert.deepEqual(before.all, { rows: 400, requests: 400, cost: 4000, tokens: 6400 });
  assert.equal(before.journal, 400);
  assert.equal(before.folded, 0);

  assert.equal(await fold.foldNow(), 400);
  const after = await sums(db);
  assert.equal(after.journal, 0);
  assert.equal(after.folded, 200, 'one row per key and minute');
  assert.deepEqual({ ...after.all, rows: 0 }, { ...before.all, rows: 0 });
  assert.deepEqual(after.byProject, before.byProject);
  assert.deepEqual(after.byOrg, before.byOrg);
  assert.equal(fold.pending, 0);

  // A later report of the same keys and minute is added to the folded rows by the next fold.
  await journal(db, fold, rows(100));
  const mixed = await sums(db);
  assert.deepEqual(mixed.all, { rows: 300, requests: 500, cost: 5000, tokens: 8000 });
  assert.equal(await fold.foldNow(), 100);
  const last = await sums(db);
  assert.deepEqual({ ...last.all, rows: 0 }, { ...mixed.all, rows: 0 });
  assert.deepEqual(last.byProject, mixed.byProject);
  assert.equal(last.folded, 200);
  assert.deepEqual(await db.get("SELECT requests, cost_micros FROM usage_folded WHERE key_id = 'key_00001' AND minute = ?", [MINUTE]), { requests: 4, cost_micros: 40 });
});

test('a fold that fails leaves every row in the journal, counted once; the next fold folds it once', async (t) => {
  const { db } = await open(t);
  t.after(() => db.close());
  const lines: string[] = [];
  const fold = new UsageFold(db, (l) => lines.push(l));
  await journal(db, fold, rows(50));
  await journal(db, fold, rows(50));
  const before = await sums(db);
  // The fold's insert fails after it began (a full disk, say): its transaction rolls back whole.
  await db.exec("CREATE TEMP TRIGGER fail_fold BEFORE INSERT ON usage_folded BEGIN SELECT RAISE(ABORT, 'disk full'); END");
  assert.equal(await fold.foldNow(), 0);
  assert.match(lines.join('\n'), /journal not folded .*disk full/);
  assert.deepEqual(await sums(db), before);
  assert.equal(fold.pending, 100);
  await db.exec('DROP TRIGGER fail_fold');
  assert.equal(await fold.foldNow(), 100);
  const after = await sums(db);
  assert.deepEqual({ ...after.all, rows: 0 }, { ...before.all, rows: 0 });
  assert.deepEqual(after.byProject, before.byProject);
  assert.equal(after.journal, 0);
});

test('what a stopped process left in the journal is folded when the next one starts, in bounded transactions', async (t) => {
  const { db, dir } = await open(t);
  const first = new UsageFold(db);
  for (let i = 0; i < 5; i++) await journal(db, first, rows(40, MINUTE + i));
  const before = await sums(db);
  // Killed before any fold: the journal is all there is (and the view counts it).
  await db.close();

  const { db: next } = await open(t, dir);
  t.after(() => next.close());
  assert.deepEqual(await sums(next), before);
  let txs = 0;
  next.txObserver = () => void txs++;
  const fold = new UsageFold(next, () => undefined, { maxRows: 60 });
  await fold.start();
  t.after(() => fold.close());
  const after = await sums(next);
  assert.equal(after.journal, 0);
  assert.equal(after.folded, 200);
  assert.deepEqual({ ...after.all, rows: 0 }, { ...before.all, rows: 0 });
  assert.deepEqual(after.byOrg, before.byOrg);
  assert.equal(txs, 4, '200 rows folded 60 at most at a time');
});

test(`a fold starts on its own once ${FOLD_AT_ROWS.toLocaleString('en')} journal rows wait, and a graceful stop folds the rest`, async (t) => {
  const { db } = await open(t);
  t.after(() => db.close());
  const fold = new UsageFold(db);
  await fold.start();
  await journal(db, fold, rows(FOLD_AT_ROWS - 1));
  assert.equal((await sums(db)).journal, FOLD_AT_ROWS - 1, 'not folded below the threshold');
  await journal(db, fold, rows(1, MINUTE + 1));
  await eventually(async () => (await sums(db)).journal === 0, 'the journal folded');
  assert.equal((await sums(db)).all.requests, FOLD_AT_ROWS);
  await journal(db, fold, rows(10));
  await fold.close();
  const end = await sums(db);
  assert.equal(end.journal, 0);
  assert.equal(end.all.requests, FOLD_AT_ROWS + 10);
});

test('after a failed fold only the timer retries: reports past the threshold do not start one each', async (t) => {
  const { db } = await open(t);
  t.after(() => db.close());
  const lines: string[] = [];
  const fold = new UsageFold(db, (l) => lines.push(l));
  let rolledBack = 0;
  db.txObserver = (_s, committed) => void (committed || rolledBack++);
  await db.exec("CREATE TEMP TRIGGER fail_fold BEFORE INSERT ON usage_folded BEGIN SELECT RAISE(ABORT, 'disk full'); END");
  await journal(db, fold, rows(FOLD_AT_ROWS));
  await eventually(async () => rolledBack === 1, 'the fold the threshold started failed');
  for (let i = 0; i < 10; i++) await journal(db, fold, rows(5, MINUTE + 1));
  assert.equal(rolledBack, 1, 'no fold was started by the ten reports after it');
  assert.equal(lines.length, 1);
  await db.exec('DROP TRIGGER fail_fold');
  // The timer's next fold (foldNow is what it calls) folds all of it, and the threshold works again.
  assert.equal(await fold.foldNow(), FOLD_AT_ROWS + 50);
  await journal(db, fold, rows(FOLD_AT_ROWS));
  await eventually(async () => (await sums(db)).journal === 0, 'the threshold starts folds again');
});

test('a fold adds as the upsert at ingest did: the first organisation that came, and sums past 2^63 that do not stop it', async (t) => {
  const { db } = await open(t);
  t.after(() => db.close());
  const fold = new UsageFold(db);
  const row = (org: string, cost: number, keyId = 'key_x'): UsageMinute => ({ projectId: 'proj_x', orgId: org, keyId, model: 'm', minute: MINUTE, requests: 1, promptTokens: 0, completionTokens: 0, costMicros: cost });
  await journal(db, fold, [row('org_b', 10)]);
  await journal(db, fold, [row('org_a', 10)]);
  // Two costs a node clamped to 2^53 each, summed over many calls in its reports: past 2^63 together.
  const huge = 600 * (2 ** 53 - 1);
  await journal(db, fold, [row('org_b', huge, 'key_huge')]);
  await journal(db, fold, [row('org_b', huge, 'key_huge')]);
  await journal(db, fold, rows(10));
  assert.equal(await fold.foldNow(), 14);
  assert.equal((await sums(db)).journal, 0);
  assert.deepEqual(await db.get("SELECT org_id, requests, cost_micros FROM usage_folded WHERE key_id = 'key_x'"), { org_id: 'org_b', requests: 2, cost_micros: 20 });
  assert.deepEqual(await db.get("SELECT typeof(cost_micros) AS t, requests FROM usage_folded WHERE key_id = 'key_huge'"), { t: 'real', requests: 2 });
});
