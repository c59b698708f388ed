// Moving a control plane's SQLite files into an empty PostgreSQL database (docs/deployment.md#moving-from-sqlite-to-postgresql):
// both are brought to this version's schema by the same migrations a control plane runs at its start,
// then every table of the state is copied row for row, parents before the tables that refer to them,
// in one transaction, and every day of the request logs into its partition, in another. The target must
// be a database no control plane has used (never merged into); the row counts are compared after.
// The control plane must not run on the SQLite files meanwhile.
import { existsSync } from 'node:fs';
import type { Db, Param, Queryable } from './db.js';
import { runMigrations } from './migrate.js';
import { openStateDb } from './open-store.js';
import { SqliteDb } from './sqlite-db.js';
import { DAY_TABLE_RE } from './log-store/log-days.js';
import { PgLogStore } from './log-store/pg-log-store.js';
import { dayTablesSql } from './log-store/log-writer.js';

/** Rows read and written at a time (PostgreSQL takes at most 65,535 parameters in one statement). */
const BATCH_PARAMS = 30_000;

export interface MovedTable {
  table: string;
  rows: number;
}

export interface MoveReport {
  tables: MovedTable[];
  logDays: string[];
  logBlocks: number;
}

/** The database is not one a move may fill: a control plane used it, or it holds Tollgate's tables. */
export class TargetNotEmptyError extends Error {}

type Row = Record<string, unknown>;

export async function moveSqliteToPostgres(from: { dbPath: string; logsDbPath: string }, databaseUrl: string, log: (line: string) => void): Promise<MoveReport> {
  const src = await SqliteDb.open(from.dbPath);
  let dst: Db | null = null;
  try {
    dst = await openStateDb({ databaseUrl, dbPath: '', logsDbPath: '' }, log);
    await refuseUsed(dst);
    await runMigrations(src);
    await runMigrations(dst);
    const tables = await copyState(src, dst);
    const logs = existsSync(from.logsDbPath) ? await copyLogs(from.logsDbPath, dst, databaseUrl, log) : { days: [], blocks: 0 };
    return { tables, logDays: logs.days, logBlocks: logs.blocks };
  } finally {
    await src.close();
    await dst?.close();
  }
}

/** A database a control plane (or an earlier move) migrated is refused before anything is written. */
async function refuseUsed(dst: Db): Promise<void> {
  const found = await dst.get<{ n: number }>("SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = current_schema() AND table_name IN ('schema_migrations', 'logblocks')");
  if ((found?.n ?? 0) > 0) {
    throw new TargetNotEmptyError('the target database already holds Tollgate tables (a control plane or an earlier move used it): a move fills an empty database only; create a new one');
  }
}

/** Every table of the state, parents first, in one transaction; its identity sequences moved past the copied ids. */
async function copyState(src: SqliteDb, dst: Db): Promise<MovedTable[]> {
  const names = (await src.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations' ORDER BY name")).map((r) => r.name);
  const order = await parentsFirst(src, names);
  const moved: MovedTable[] = [];
  await dst.tx(async (tx) => {
    // What the migrations seeded is replaced by what the SQLite file holds (children first).
    for (const table of [...order].reverse()) await tx.run(`DELETE FROM ${table}`);
    for (const table of order) {
      const target = await pgColumns(tx, table);
      if (target.size === 0) throw new Error(`the SQLite table ${table} has no counterpart in PostgreSQL: the two schemas differ`);
      const columns = (await src.all<{ name: string }>(`SELECT name FROM pragma_table_info('${table}')`)).map((c) => c.name).filter((c) => target.get(c) !== 'ALWAYS');
      let rows = 0;
      for await (const batch of batches(src, table, columns)) {
        await insertRows(tx, table, columns, batch);
        rows += batch.length;
      }
      for (const [column, identity] of target) {
        if (identity === 'BY DEFAULT' && columns.includes(column)) {
          await tx.get(`SELECT setval(pg_get_serial_sequence('${table}', '${column}'), COALESCE((SELECT MAX(${column}) FROM ${table}), 0) + 1, false)`);
        }
      }
      moved.push({ table, rows });
    }
    for (const { table, rows } of moved) {
      const n = (await tx.get<{ n: number }>(`SELECT COUNT(*) AS n FROM ${table}`))?.n ?? 0;
      if (n !== rows) throw new Error(`table ${table}: ${rows} rows copied, ${n} in PostgreSQL`);
    }
  });
  return moved;
}

/** The tables ordered so that each comes after those its foreign keys name. */
async function parentsFirst(src: Queryable, names: string[]): Promise<string[]> {
  const parents = new Map<string, string[]>();
  for (const t of names) parents.set(t, (await src.all<{ table: string }>(`SELECT "table" FROM pragma_foreign_key_list('${t}')`)).map((r) => r.table).filter((p) => p !== t));
  const out: string[] = [];
  const placed = new Set<string>();
  const place = (t: string, path: Set<string>) => {
    if (placed.has(t) || path.has(t)) return;
    path.add(t);
    for (const p of parents.get(t) ?? []) if (parents.has(p)) place(p, path);
    placed.add(t);
    out.push(t);
  };
  for (const t of names) place(t, new Set());
  return out;
}

/** A PostgreSQL table's columns and how each is generated: 'ALWAYS' or 'BY DEFAULT' for identity columns, '' for others. */
async function pgColumns(q: Queryable, table: string): Promise<Map<string, string>> {
  const rows = await q.all<{ column_name: string; identity_generation: string | null }>(
    'SELECT column_name, identity_generation FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ?',
    [table],
  );
  return new Map(rows.map((r) => [r.column_name, r.identity_generation ?? '']));
}

/** A table's rows in batches, in rowid order (or, for a table without rowid, its primary key's). */
async function* batches(src: Queryable, table: string, columns: string[]): AsyncGenerator<Row[]> {
  const size = Math.max(1, Math.floor(BATCH_PARAMS / Math.max(1, columns.length)));
  const list = columns.map((c) => `"${c}"`).join(', ');
  const withoutRowid = /WITHOUT\s+ROWID/i.test((await src.get<{ sql: string }>("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [table]))?.sql ?? '');
  if (withoutRowid) {
    // Keyset on the primary key, compared as a row value.
    const pk = (await src.all<{ name: string }>(`SELECT name FROM pragma_table_info('${table}') WHERE pk > 0 ORDER BY pk`)).map((c) => `"${c.name}"`);
    let last: Row | null = null;
    for (;;) {
      const where: string = last ? `WHERE (${pk.join(', ')}) > (${pk.map(() => '?').join(', ')})` : '';
      const params: Param[] = last ? pk.map((c) => (last as Row)[c.slice(1, -1)] as Param) : [];
      const rows: Row[] = await src.all<Row>(`SELECT ${list} FROM ${table} ${where} ORDER BY ${pk.join(', ')} LIMIT ?`, [...params, size]);
      if (rows.length === 0) return;
      last = rows[rows.length - 1];
      yield rows;
    }
  }
  let after = -Infinity;
  for (;;) {
    const rows = await src.all<Row & { _rowid: number }>(`SELECT rowid AS _rowid, ${list} FROM ${table} WHERE rowid > ? ORDER BY rowid LIMIT ?`, [after === -Infinity ? Number.MIN_SAFE_INTEGER : after, size]);
    if (rows.length === 0) return;
    after = rows[rows.length - 1]._rowid;
    yield rows;
  }
}

async function insertRows(q: Queryable, table: string, columns: string[], rows: Row[]): Promise<void> {
  if (rows.length === 0) return;
  const one = `(${columns.map(() => '?').join(', ')})`;
  const params: Param[] = [];
  for (const r of rows) for (const c of columns) params.push(r[c] as Param);
  await q.run(`INSERT INTO ${table} (${columns.map((c) => `"${c}"`).join(', ')}) VALUES ${rows.map(() => one).join(', ')}`, params);
}

/** Every day of the request logs into its partition, the nodes' log cursors and the index's, in one transaction. */
async function copyLogs(logsDbPath: string, dst: Db, databaseUrl: string, log: (line: string) => void): Promise<{ days: string[]; blocks: number }> {
  // The parents, the cursors and the index's cursor, as the control plane makes them.
  await (await PgLogStore.open(databaseUrl, { retentionDays: 36_500, now: () => Date.now(), log })).close();
  const src = await SqliteDb.open(logsDbPath);
  try {
    const tables = (await src.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table'")).map((r) => r.name);
    const days = tables.map((t) => DAY_TABLE_RE.exec(t)?.[1]).filter((d): d is string => d !== undefined).sort();
    let blocks = 0;
    await dst.tx(async (tx) => {
      for (const day of days) {
        await tx.exec(dayTablesSql(tx, day));
        for (const [table, columns] of [
          [`logblocks_${day}`, ['id', 'node_id', 'min_at', 'max_at', 'rows', 'columns']],
          [`logkeys_${day}`, ['key_id', 'max_at', 'block', 'min_at', 'project_id', 'org_id', 'rows']],
        ] as const) {
          if (!tables.includes(table)) continue;
          for await (const batch of batches(src, table, [...columns])) {
            await insertRows(tx, table, [...columns], batch);
            if (table.startsWith('logblocks_')) blocks += batch.length;
          }
        }
      }
      if (tables.includes('log_cursors')) {
        for (const r of await src.all<Row>('SELECT node_id, instance_id, last_seq FROM log_cursors')) {
          await tx.run('INSERT INTO log_cursors (node_id, instance_id, last_seq) VALUES (?, ?, ?) ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = excluded.last_seq', [r.node_id as Param, r.instance_id as Param, r.last_seq as Param]);
        }
      }
      if (tables.includes('log_index_cursor')) {
        for (const r of await src.all<Row>('SELECT day, block FROM log_index_cursor')) {
          await tx.run('INSERT INTO log_index_cursor (day, block) VALUES (?, ?) ON CONFLICT (day) DO UPDATE SET block = excluded.block', [r.day as Param, r.block as Param]);
        }
      }
    });
    return { days, blocks };
  } finally {
    await src.close();
  }
}
