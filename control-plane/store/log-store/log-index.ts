// The key index of the request-log blocks (logkeys_DAY: one row per key and block), which follows the
// blocks (docs/design.md#log-store): a block's entries are kept in memory
// once its report committed, and written for all blocks together once a minute (or when many wait),
// sorted by key, in one transaction that also moves log_index_cursor. A query reads those in memory
// beside the table. A control plane that stopped without writing them indexes the blocks past the
// cursor again when it opens (from their columns), so nothing is lost.
import { decodeLogColumns } from '../../../proto/lib/log-columns.js';
import { LogColumns } from '../../../proto/gen/tollgate/v1/sync.js';
import type { Db, Queryable } from '../db.js';
import { greatest } from '../dialect.js';
import { DAY_TABLE_RE, type LogDays } from './log-days.js';

/** The key index is written this often (docs/design.md#log-store). */
const INDEX_EVERY_MS = 60_000;
/** …or as soon as this many entries wait (memory: about 275 bytes each, some 55 MB in all). */
const INDEX_MAX_PENDING = 200_000;
/** Entries per INSERT of the key index. */
const INDEX_CHUNK = 20_000;

/** One row of logkeys_DAY: key_id, max_at, block, min_at, project_id, org_id, rows. */
export type IndexEntry = [string, number, number, number, string, string, number];

/**
 * Makes log_index_cursor when the file has none. Blocks written before the index followed them were
 * indexed as they came: each day is indexed up to its last block.
 */
export async function createIndexCursor(db: Db, tables: readonly string[]): Promise<void> {
  if (tables.includes('log_index_cursor')) return;
  await db.tx(async (tx) => {
    await tx.exec(
      tx.dialect === 'postgres'
        ? 'CREATE TABLE IF NOT EXISTS log_index_cursor (day TEXT COLLATE "C" PRIMARY KEY, block BIGINT NOT NULL)'
        : 'CREATE TABLE log_index_cursor (day TEXT PRIMARY KEY, block INTEGER NOT NULL) WITHOUT ROWID',
    );
    for (const name of tables) {
      const m = DAY_TABLE_RE.exec(name);
      if (m) await tx.run(`INSERT INTO log_index_cursor (day, block) SELECT ?, COALESCE(MAX(id), 0) FROM ${name}`, [m[1]]);
    }
  });
}

export class LogIndex {
  /** Key index entries of committed blocks not written yet, by day. */
  private pending = new Map<string, IndexEntry[]>();
  private pendingCount = 0;
  /** Entries being written (still read by queries until their transaction committed). */
  private writing: Map<string, IndexEntry[]> | null = null;
  private indexing: Promise<void> | null = null;
  private readonly indexTimer: NodeJS.Timeout;

  constructor(private readonly days: LogDays) {
    this.indexTimer = setInterval(() => void this.write(), days.opts.indexEveryMs ?? INDEX_EVERY_MS);
    this.indexTimer.unref();
  }

  /** Blocks past their day's index cursor (the previous process stopped before writing their entries) are indexed now. */
  async indexUnindexed(): Promise<void> {
    const { db, opts } = this.days;
    let indexed = 0;
    for (const day of this.days.sorted()) {
      const cursor = (await db.get<{ block: number }>('SELECT block FROM log_index_cursor WHERE day = ?', [day]))?.block ?? 0;
      for (let after = cursor; ; ) {
        const blocks = await db.all<{ id: number; columns: Buffer }>(`SELECT id, columns FROM logblocks_${day} WHERE id > ? ORDER BY id LIMIT 256`, [after]);
        if (blocks.length === 0) break;
        const entries: IndexEntry[] = [];
        for (const b of blocks) {
          try {
            for (const e of entriesOfColumns(b.id, b.columns)) entries.push(e);
          } catch {
            opts.log?.(`request logs: block ${b.id} of ${day} cannot be decoded; not indexed`);
          }
        }
        after = blocks[blocks.length - 1].id;
        await db.tx((tx) => insertIndex(tx, day, entries, after));
        indexed += blocks.length;
      }
    }
    if (indexed > 0) opts.log?.(`request logs: ${indexed} block(s) written before the last stop indexed`);
  }

  /** Entries of committed blocks wait in memory for the next index write. */
  queue(byDay: Map<string, IndexEntry[]>): void {
    for (const [day, entries] of byDay) {
      if (entries.length === 0) continue;
      const list = this.pending.get(day);
      // (One push per entry: a report may hold more entries than a call takes arguments.)
      if (list) for (const e of entries) list.push(e);
      else this.pending.set(day, entries);
      this.pendingCount += entries.length;
    }
    if (this.pendingCount >= INDEX_MAX_PENDING) void this.write();
  }

  /** One day's entries still in memory, being written and waiting (a query reads them beside the table). */
  held(day: string): readonly (readonly IndexEntry[])[] {
    return [this.writing?.get(day) ?? [], this.pending.get(day) ?? []];
  }

  /**
   * Writes the waiting key index entries of every day in one transaction, each day's sorted by key
   * (neighbouring keys share pages), and moves the days' cursors past their blocks. On failure they
   * wait for the next try.
   */
  write(): Promise<void> {
    if (this.indexing) return this.indexing;
    if (this.pendingCount === 0) return Promise.resolve();
    const batch = this.pending;
    this.writing = batch;
    this.pending = new Map();
    this.pendingCount = 0;
    this.indexing = this.days.db
      .tx(async (tx) => {
        for (const [day, entries] of batch) {
          // A day dropped by retention meanwhile has no table any more.
          if (!this.days.has(day)) continue;
          entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
          let last = 0;
          for (const e of entries) if (e[2] > last) last = e[2];
          await insertIndex(tx, day, entries, last);
        }
      })
      .catch((err: Error) => {
        this.days.opts.log?.(`request logs: key index not written (${err.message}); trying again with the next`);
        for (const [day, entries] of batch) {
          const list = this.pending.get(day);
          this.pending.set(day, list ? [...entries, ...list] : entries);
          this.pendingCount += entries.length;
        }
      })
      .finally(() => {
        this.writing = null;
        this.indexing = null;
      });
    return this.indexing;
  }

  /** A day dropped by retention: its waiting entries go with it. */
  forgetDay(day: string): void {
    this.pendingCount -= this.pending.get(day)?.length ?? 0;
    this.pending.delete(day);
  }

  /** Stops the timer and writes what waits. */
  async close(): Promise<void> {
    clearInterval(this.indexTimer);
    await this.write();
    if (this.pendingCount > 0) await this.write();
  }
}

export async function insertIndex(tx: Queryable, day: string, entries: readonly IndexEntry[], lastBlock: number): Promise<void> {
  for (let i = 0; i < entries.length; i += INDEX_CHUNK) await tx.runPrepared(keysInsertSql(tx, day), [JSON.stringify(entries.slice(i, i + INDEX_CHUNK))]);
  await tx.run(`INSERT INTO log_index_cursor (day, block) VALUES (?, ?) ON CONFLICT (day) DO UPDATE SET block = ${greatest(tx, 'log_index_cursor.block', 'excluded.block')}`, [day, lastBlock]);
}

/** A stored block's index entries, from its columns (as LogColumnsBuilder made them for its LogBlock). */
function entriesOfColumns(block: number, columns: Buffer): IndexEntry[] {
  const byKey = new Map<string, IndexEntry>();
  for (const r of decodeLogColumns(LogColumns.decode(columns)).rows) {
    const e = byKey.get(r.keyId);
    if (e) {
      e[1] = Math.max(e[1], r.atMs);
      e[3] = Math.min(e[3], r.atMs);
      e[6]++;
    } else byKey.set(r.keyId, [r.keyId, r.atMs, block, r.atMs, r.projectId, r.orgId, 1]);
  }
  return [...byKey.values()];
}

const keysSql = new Map<string, string>();
function keysInsertSql(q: Queryable, day: string): string {
  const name = `${q.dialect}:${day}`;
  let sql = keysSql.get(name);
  if (!sql) {
    sql =
      q.dialect === 'postgres'
        ? `INSERT INTO logkeys_${day} (key_id, max_at, block, min_at, project_id, org_id, rows)
            SELECT v ->> 0, (v ->> 1)::bigint, (v ->> 2)::bigint, (v ->> 3)::bigint, v ->> 4, v ->> 5, (v ->> 6)::bigint
            FROM jsonb_array_elements(?::jsonb) AS v ON CONFLICT DO NOTHING`
        : `INSERT OR IGNORE INTO logkeys_${day} (key_id, max_at, block, min_at, project_id, org_id, rows)
            SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6 FROM json_each(?)`;
    if (keysSql.size > 1000) keysSql.clear();
    keysSql.set(name, sql);
  }
  return sql;
}
