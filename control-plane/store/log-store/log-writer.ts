// Writing request-log blocks: a report's blocks and its node instance's cursor in one transaction,
// normally one statement through the day's sink (the view logsink_YYYYMMDD and its trigger), so a
// replay is a no-op (sqlite-log-store.ts gives the layout). A day's tables are made by the first write
// to it.
import type { LogBlock } from '../../../proto/gen/tollgate/v1/sync.js';
import type { Db, Param, Queryable, Tx } from '../db.js';
import { greatest } from '../dialect.js';
import { KeptCursors } from '../kept-cursors.js';
import { DAY_TABLE_RE, dayOf, type LogDays } from './log-days.js';
import type { IndexEntry, LogIndex } from './log-index.js';
import { oldestKeptDay } from './log-retention.js';
import type { LogPart, LogSource } from './log-store.js';

/** Blocks per multi-row INSERT. */
const BLOCK_CHUNK = 16;

/**
 * The view a report's blocks of one day are written through, and its trigger: each row inserts a
 * block (its id given) and moves its node instance's cursor (never back). `IF NOT EXISTS`: days made
 * before the view get it when the store opens.
 */
function sinkSql(day: string): string {
  return `CREATE VIEW IF NOT EXISTS logsink_${day} AS
      SELECT NULL AS id, NULL AS node_id, NULL AS min_at, NULL AS max_at, NULL AS rows, NULL AS columns, NULL AS instance_id, NULL AS last_seq;
    CREATE TRIGGER IF NOT EXISTS logsink_${day}_insert INSTEAD OF INSERT ON logsink_${day} BEGIN
      INSERT INTO logblocks_${day} (id, node_id, min_at, max_at, rows, columns) VALUES (NEW.id, NEW.node_id, NEW.min_at, NEW.max_at, NEW.rows, NEW.columns);
      INSERT INTO log_cursors (node_id, instance_id, last_seq) VALUES (NEW.node_id, NEW.instance_id, NEW.last_seq)
        ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq);
    END;`;
}

export async function createLogCursors(db: Db): Promise<void> {
  await db.exec(
    db.dialect === 'postgres'
      ? `CREATE TABLE IF NOT EXISTS log_cursors (
          node_id TEXT COLLATE "C" NOT NULL, instance_id TEXT COLLATE "C" NOT NULL, last_seq BIGINT NOT NULL, PRIMARY KEY (node_id, instance_id))`
      : `CREATE TABLE IF NOT EXISTS log_cursors (
          node_id TEXT NOT NULL, instance_id TEXT NOT NULL, last_seq INTEGER NOT NULL, PRIMARY KEY (node_id, instance_id)
        ) WITHOUT ROWID`,
  );
}

/**
 * PostgreSQL's day partitions: the parents logblocks and logkeys, partitioned by day (LIST), whose
 * partitions are named as SQLite's day tables (logblocks_YYYYMMDD, logkeys_YYYYMMDD) and read as
 * they are; retention drops whole partitions. The parents let a seller's own tools read every day.
 */
export const PG_LOG_PARENTS_SQL = `
  CREATE TABLE IF NOT EXISTS logblocks (
    day TEXT COLLATE "C" NOT NULL, id BIGINT NOT NULL, node_id TEXT COLLATE "C" NOT NULL, min_at BIGINT NOT NULL, max_at BIGINT NOT NULL,
    rows BIGINT NOT NULL, columns BYTEA NOT NULL, PRIMARY KEY (day, id)
  ) PARTITION BY LIST (day);
  CREATE INDEX IF NOT EXISTS logblocks_by_time ON logblocks (max_at);
  CREATE TABLE IF NOT EXISTS logkeys (
    day TEXT COLLATE "C" NOT NULL, key_id TEXT COLLATE "C" NOT NULL, max_at BIGINT NOT NULL, block BIGINT NOT NULL, min_at BIGINT NOT NULL,
    project_id TEXT COLLATE "C" NOT NULL, org_id TEXT COLLATE "C" NOT NULL, rows BIGINT NOT NULL, PRIMARY KEY (day, key_id, max_at, block)
  ) PARTITION BY LIST (day);
  CREATE INDEX IF NOT EXISTS logkeys_by_project ON logkeys (project_id, max_at);
  CREATE INDEX IF NOT EXISTS logkeys_by_org ON logkeys (org_id, max_at);`;

/** One day's tables: SQLite's own tables and view; PostgreSQL's partitions (each row's day by default). */
export function dayTablesSql(q: Queryable, day: string): string {
  if (q.dialect === 'postgres') {
    return `CREATE TABLE IF NOT EXISTS logblocks_${day} PARTITION OF logblocks (day DEFAULT '${day}') FOR VALUES IN ('${day}');
      CREATE TABLE IF NOT EXISTS logkeys_${day} PARTITION OF logkeys (day DEFAULT '${day}') FOR VALUES IN ('${day}');
      INSERT INTO log_index_cursor (day, block) VALUES ('${day}', 0) ON CONFLICT DO NOTHING;`;
  }
  return `CREATE TABLE IF NOT EXISTS logblocks_${day} (
      id INTEGER PRIMARY KEY, node_id TEXT NOT NULL, min_at INTEGER NOT NULL, max_at INTEGER NOT NULL, rows INTEGER NOT NULL,
      columns BLOB NOT NULL
    );
    CREATE INDEX IF NOT EXISTS logblocks_${day}_by_time ON logblocks_${day} (max_at);
    CREATE TABLE IF NOT EXISTS logkeys_${day} (
      key_id TEXT NOT NULL, max_at INTEGER NOT NULL, block INTEGER NOT NULL, min_at INTEGER NOT NULL, project_id TEXT NOT NULL,
      org_id TEXT NOT NULL, rows INTEGER NOT NULL, PRIMARY KEY (key_id, max_at, block)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS logkeys_${day}_by_project ON logkeys_${day} (project_id, max_at);
    CREATE INDEX IF NOT EXISTS logkeys_${day}_by_org ON logkeys_${day} (org_id, max_at);
    INSERT OR IGNORE INTO log_index_cursor (day, block) VALUES ('${day}', 0);
    ${sinkSql(day)}`;
}

/** The days the file holds (`tables`: its tables named log%), each with its view. */
export async function openDays(days: LogDays, tables: readonly string[]): Promise<void> {
  const { db } = days;
  // A day's view without its tables (dropped by a version before the view) goes too.
  for (const { name } of await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'view' AND name LIKE 'logsink_%'")) {
    const day = /^logsink_(\d{8})$/.exec(name)?.[1];
    if (day && !tables.includes(`logblocks_${day}`)) await db.exec(`DROP VIEW ${name}`);
  }
  for (const name of tables) {
    const m = DAY_TABLE_RE.exec(name);
    if (!m) continue;
    days.add(m[1]);
    // Days written by a version before the sink get theirs.
    await db.exec(sinkSql(m[1]));
  }
}

export class LogWriter {
  /** Node instances' log cursors as committed (this store is the file's only writer). */
  private readonly cursors = new KeptCursors();
  /** Each day's next block id, once read (blocks are numbered here so that one insert writes them all). */
  private readonly nextBlock = new Map<string, number>();

  constructor(
    private readonly days: LogDays,
    private readonly index: LogIndex,
  ) {}

  async ensureDay(q: Queryable, day: string, added: string[]): Promise<void> {
    if (this.days.has(day)) return;
    added.push(day);
    await q.exec(dayTablesSql(q, day));
    this.days.add(day);
  }

  /**
   * A report's blocks and its cursor, written together: normally by one statement, a transaction by
   * itself (one row per block into the day's view logsink_DAY, whose trigger inserts the block and
   * moves the cursor; BLOCK_CHUNK blocks a statement). The cursor and each day's next block id are
   * kept in memory once read, so telling a replay and numbering blocks cost no statement.
   */
  async writeBlocks(source: LogSource, parts: readonly LogPart[]): Promise<{ duplicate: boolean; written: number }> {
    if (parts.length === 0) return { duplicate: true, written: 0 };
    const oldest = oldestKeptDay(this.days);
    const id = KeptCursors.id(source.nodeId, source.instanceId);
    // The highest seq, whatever the order parts came in (a cursor never moves back).
    const last = parts.reduce((m, p) => Math.max(m, p.seq), -Infinity);
    return this.inTx([], async (tx, added) => {
      const cursor = await this.cursors.get(id, async () => (await tx.get<{ last_seq: number }>('SELECT last_seq FROM log_cursors WHERE node_id = ? AND instance_id = ?', [source.nodeId, source.instanceId]))?.last_seq ?? null);
      const fresh = cursor === null ? parts : parts.filter((p) => p.seq > cursor);
      if (fresh.length === 0) return { duplicate: true, written: 0 };
      const byDay = new Map<string, LogBlock[]>();
      let written = 0;
      for (const part of fresh) {
        for (const b of part.blocks) {
          const day = dayOf(b.minAtMs);
          if (b.rows <= 0 || b.columns.length === 0 || day < oldest) continue;
          const list = byDay.get(day);
          if (list) list.push(b);
          else byDay.set(day, [b]);
          written += b.rows;
        }
      }
      // Each statement: the day's view, its rows' SQL and parameters. Ids come from memory (read once a day).
      const statements: { sql: string; params: Param[] }[] = [];
      const entries = new Map<string, IndexEntry[]>();
      const nextIds = new Map<string, number>();
      for (const [day, blocks] of byDay) {
        await this.ensureDay(tx, day, added);
        // A day made by this write starts at 1; another is read once.
        let next = this.nextBlock.get(day) ?? (added.includes(day) ? 1 : (await tx.get<{ next: number }>(`SELECT COALESCE(MAX(id), 0) + 1 AS next FROM logblocks_${day}`))!.next);
        const dayEntries: IndexEntry[] = [];
        for (let i = 0; i < blocks.length; i += BLOCK_CHUNK) {
          const part = blocks.slice(i, i + BLOCK_CHUNK);
          const params: Param[] = [];
          for (const b of part) {
            const blockId = next++;
            params.push(blockId, source.nodeId, b.minAtMs, b.maxAtMs, b.rows, b.columns, source.instanceId, last);
            for (const k of b.keys) dayEntries.push([k.keyId, k.maxAtMs, blockId, k.minAtMs, k.projectId, k.orgId, k.rows]);
          }
          statements.push(
            tx.dialect === 'postgres'
              ? { sql: `INSERT INTO logblocks_${day} (id, node_id, min_at, max_at, rows, columns) VALUES ${part.map(() => '(?, ?, ?, ?, ?, ?)').join(', ')}`, params: params.filter((_, j) => j % 8 < 6) }
              : { sql: `INSERT INTO logsink_${day} (id, node_id, min_at, max_at, rows, columns, instance_id, last_seq) VALUES ${part.map(() => '(?, ?, ?, ?, ?, ?, ?, ?)').join(', ')}`, params },
          );
        }
        entries.set(day, dayEntries);
        nextIds.set(day, next);
      }
      // Nothing to store (every row empty or past retention): the cursor moves alone. PostgreSQL has
      // no day view: the cursor always moves by its own statement, the transaction's last.
      if (statements.length === 0 || tx.dialect === 'postgres') {
        statements.push({
          sql: `INSERT INTO log_cursors (node_id, instance_id, last_seq) VALUES (?, ?, ?)
            ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = ${greatest(tx, 'log_cursors.last_seq', 'excluded.last_seq')}`,
          params: [source.nodeId, source.instanceId, last],
        });
      }
      for (const [i, st] of statements.entries()) {
        if (i === statements.length - 1) await tx.runLast(st.sql, st.params);
        else await tx.runPrepared(st.sql, st.params);
      }
      tx.afterCommit(() => {
        this.cursors.keep(id, Math.max(cursor ?? -Infinity, last));
        for (const [day, next] of nextIds) this.nextBlock.set(day, next);
        this.index.queue(entries);
      });
      return { duplicate: false, written };
    });
  }

  /** A transaction that may create day tables: if it rolls back, the tables it made do not exist. */
  async inTx<T>(added: string[], work: (tx: Tx, added: string[]) => Promise<T>): Promise<T> {
    try {
      return await this.days.db.tx((tx) => work(tx, added));
    } catch (err) {
      for (const d of added) this.days.delete(d);
      // Read again next time (what memory holds is committed, but a failure is not the place to trust it).
      this.nextBlock.clear();
      throw err;
    }
  }

  /** A day dropped by retention: its next block id goes with it. */
  forgetDay(day: string): void {
    this.nextBlock.delete(day);
  }
}

/**
 * One day's blocks: one multi-row INSERT for the blocks (SQLite numbers the rows of one statement
 * one after the other, so the last id gives them all). Returns their key index entries.
 */
export async function insertBlocks(q: Queryable, day: string, nodeId: string, blocks: readonly LogBlock[]): Promise<IndexEntry[]> {
  const entries: IndexEntry[] = [];
  for (let i = 0; i < blocks.length; i += BLOCK_CHUNK) {
    const part = blocks.slice(i, i + BLOCK_CHUNK);
    const params: Param[] = [];
    for (const b of part) params.push(nodeId, b.minAtMs, b.maxAtMs, b.rows, b.columns);
    const { lastID } = await q.runPrepared(
      `INSERT INTO logblocks_${day} (node_id, min_at, max_at, rows, columns) VALUES ${part.map(() => '(?, ?, ?, ?, ?)').join(', ')}`,
      params,
    );
    part.forEach((b, j) => {
      const id = lastID - (part.length - 1 - j);
      for (const k of b.keys) entries.push([k.keyId, k.maxAtMs, id, k.minAtMs, k.projectId, k.orgId, k.rows]);
    });
  }
  return entries;
}
