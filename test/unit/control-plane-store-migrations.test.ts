import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Tx } from '../../control-plane/store/db.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { MIGRATIONS } from '../../control-plane/store/migrations/index.js';

const TABLES = [
  'schema_migrations',
  'accounts',
  'orgs',
  'memberships',
  'projects',
  'api_keys',
  'credentials',
  'credit_ledger',
  'usage_folded',
  'usage_journal',
  'org_spend',
  'report_cursors',
  'sync_version',
  'changes',
  'nodes',
];

/** A database in a directory of its own, every migration applied; both gone after the test. */
async function migratedDb(t: { after(fn: () => unknown): void }): Promise<SqliteDb> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-migrations-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  return db;
}

test('migrations from an empty database create every table, in WAL mode; a second run is a no-op', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-migrations-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());

  const applied = await runMigrations(db);
  assert.deepEqual(applied, MIGRATIONS.map((m) => m.version));
  const tables = (await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table'")).map((r) => r.name);
  for (const name of TABLES) assert.ok(tables.includes(name), `table ${name} missing`);
  // Usage is read through a view of the folded rows and the journal (038-usage-journal).
  assert.deepEqual(await db.get("SELECT type FROM sqlite_master WHERE name = 'usage_minutes'"), { type: 'view' });
  const mode = await db.get<{ journal_mode: string }>('PRAGMA journal_mode');
  assert.equal(mode?.journal_mode, 'wal');
  const fk = await db.get<{ foreign_keys: number }>('PRAGMA foreign_keys');
  assert.equal(fk?.foreign_keys, 1);
  assert.deepEqual(await db.get('SELECT version FROM sync_version WHERE id = 1'), { version: 0 });

  assert.deepEqual(await runMigrations(db), []);
  const recorded = await db.all<{ version: number }>('SELECT version FROM schema_migrations ORDER BY version');
  assert.deepEqual(recorded.map((r) => r.version), MIGRATIONS.map((m) => m.version));
});

test('a failed transaction leaves nothing behind', async (t) => {
  const db = await migratedDb(t);
  await assert.rejects(
    db.tx(async (tx) => {
      await tx.run("INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('a', 'n', 'h', 't')");
      throw new Error('boom');
    }),
    /boom/,
  );
  assert.equal(await db.get("SELECT id FROM accounts WHERE id = 'a'"), undefined);
});

test('010-free-grants: organisations that exist keep their grant, and each owner counts as having had one', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-migrations-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db, MIGRATIONS.filter((m) => m.version < 10));
  await db.exec(`
    INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('a', 'a', 'ha', 't'), ('b', 'b', 'hb', 't');
    INSERT INTO orgs (id, name, tier, created_at) VALUES ('o2', 'later', 'free', '2026-02-01'), ('o1', 'earlier', 'free', '2026-01-01'), ('o3', 'nobody', 'free', '2026-01-01');
    INSERT INTO memberships (org_id, account_id, role) VALUES ('o1', 'a', 'owner'), ('o2', 'a', 'owner'), ('o2', 'b', 'admin');
  `);
  assert.deepEqual(await runMigrations(db), MIGRATIONS.filter((m) => m.version >= 10).map((m) => m.version));
  assert.deepEqual(await db.all('SELECT id, free_grant FROM orgs ORDER BY id'), [
    { id: 'o1', free_grant: 1 },
    { id: 'o2', free_grant: 1 },
    { id: 'o3', free_grant: 1 },
  ]);
  // Account a had its grant through its first organisation; b owns none, so it has none yet.
  assert.deepEqual(await db.all('SELECT account_id, org_id FROM free_grants'), [{ account_id: 'a', org_id: 'o1' }]);
});

test('after COMMIT every afterCommit hook runs, even after one threw; the call rejects with the first error and the work stays committed', async (t) => {
  const db = await migratedDb(t);
  const ran: string[] = [];
  await assert.rejects(
    db.tx(async (tx) => {
      await tx.run("INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('a', 'n', 'h', 't')");
      tx.afterCommit(() => ran.push('first'));
      tx.afterCommit(() => {
        throw new Error('hook broke');
      });
      tx.afterCommit(() => {
        throw new Error('second hook broke');
      });
      tx.afterCommit(() => ran.push('last'));
    }),
    /^Error: hook broke$/,
  );
  assert.deepEqual(ran, ['first', 'last']);
  assert.deepEqual(await db.get("SELECT id FROM accounts WHERE id = 'a'"), { id: 'a' });
});

test('a transaction sends BEGIN with its first statement: none costs nothing, runLast alone runs without BEGIN and COMMIT, and nothing may follow runLast', async (t) => {
  const db = await migratedDb(t);
  const insert = "INSERT INTO accounts (id, name, token_hash, created_at) VALUES (?1, 'n', ?1, 't')";
  const counted = async (fn: (tx: Tx) => Promise<unknown>) => {
    const before = db.statementsIssued;
    const committed: boolean[] = [];
    db.txObserver = (_s, ok) => void committed.push(ok);
    let error: unknown = null;
    await db.tx(fn).catch((err) => (error = err));
    return { statements: db.statementsIssued - before, committed, error: error === null ? null : String(error) };
  };
  let hooks = 0;
  assert.deepEqual(await counted(async (tx) => tx.afterCommit(() => hooks++)), { statements: 0, committed: [true], error: null });
  assert.deepEqual(await counted(async (tx) => (tx.afterCommit(() => hooks++), tx.runLast(insert, ['alone']))), { statements: 1, committed: [true], error: null });
  assert.deepEqual(await counted(async (tx) => (await tx.run(insert, ['first']), tx.runLast(insert, ['last']))), { statements: 4, committed: [true], error: null });
  assert.equal(hooks, 2, 'hooks run after a transaction of no statement and after runLast alone');
  // A statement after runLast is refused (not sent) and the transaction rolled back: BEGIN, x, y, ROLLBACK; nothing written.
  const after = await counted(async (tx) => {
    await tx.run(insert, ['x']);
    await tx.runLast(insert, ['y']);
    await tx.run(insert, ['z']);
  });
  assert.deepEqual(after, { statements: 4, committed: [false], error: 'Error: no statement may follow runLast in a transaction' });
  // runLast alone that fails writes nothing (the statement is atomic by itself) and runs no hook.
  const failed = await counted(async (tx) => (tx.afterCommit(() => hooks++), tx.runLast(insert, ['alone'])));
  assert.equal(failed.statements, 1);
  assert.match(String(failed.error), /UNIQUE constraint failed/);
  assert.equal(hooks, 2);
  assert.deepEqual((await db.all('SELECT id FROM accounts ORDER BY id')).map((r) => r.id), ['alone', 'first', 'last']);
});

test('statements issued together in a transaction all wait for its BEGIN (none runs outside it and survives a rollback); an error after a lone runLast is thrown after its hooks, and the statement stays committed', async (t) => {
  const db = await migratedDb(t);
  const insert = "INSERT INTO accounts (id, name, token_hash, created_at) VALUES (?1, 'n', ?1, 't')";
  for (let i = 0; i < 500; i++) {
    await assert.rejects(
      db.tx(async (tx) => {
        await Promise.all([tx.runPrepared(insert, [`a${i}`]), tx.runPrepared(insert, [`b${i}`])]);
        throw new Error('changed my mind');
      }),
      /changed my mind/,
    );
  }
  assert.deepEqual(await db.get('SELECT COUNT(*) AS n FROM accounts'), { n: 0 });
  let hooks = 0;
  await assert.rejects(
    db.tx(async (tx) => {
      tx.afterCommit(() => hooks++);
      await tx.runLast(insert, ['lone']);
      throw new Error('after the last statement');
    }),
    /after the last statement/,
  );
  assert.equal(hooks, 1, 'committed: its hooks ran');
  assert.deepEqual(await db.all('SELECT id FROM accounts'), [{ id: 'lone' }]);
});
