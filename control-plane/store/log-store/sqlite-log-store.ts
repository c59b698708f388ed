// Request logs in their own SQLite file (WAL), stored as nodes send them: a block of one UTC day's
// rows, packed column by column (LogColumns), is one database row, indexed by the keys in it. Writing
// a report therefore costs one row per block plus one small row per key in it, however many requests
// it covers; rows are decoded only when read. Each day has two tables, so retention drops whole
// tables instead of deleting rows:
//   logblocks_YYYYMMDD (id, node_id, min_at, max_at, rows, columns)
//   logkeys_YYYYMMDD   (key_id, project_id, org_id, min_at, max_at, block, rows), one per key and block,
//                      indexed by key, project and organisation, each with max_at.
// The leak question ("who used this key between T1 and T2") reads the key's index entries in the
// window, newest first, and decodes only those blocks, until a page is full. A report's blocks go in
// with its cursor (log_cursors) in one transaction, which makes a replay a no-op: normally one
// statement, an insert into the day's view logsink_YYYYMMDD whose trigger writes both (the cursor and
// the next block id are kept in memory once read).
// The key index follows the blocks (docs/design.md#log-store): entries wait
// in memory and are written once a minute, and a query reads them beside the table.
// The parts, each in its own file: log-writer.ts (a report's blocks, the day sink), log-index.ts (the
// key index, waiting and written), log-query.ts (pages, newest first), log-retention.ts (whole days
// dropped), log-legacy.ts (days written before blocks existed), over log-days.ts (what they share);
// this class puts them together behind the LogStore contract (log-store.ts).
import { SqliteDb } from '../sqlite-db.js';
import { LogDays, type SqliteLogStoreOptions } from './log-days.js';
import { createIndexCursor, LogIndex } from './log-index.js';
import { convertOldDays } from './log-legacy.js';
import { isPageToken, LogQuery } from './log-query.js';
import { LogRetention } from './log-retention.js';
import type { LogFilter, LogPage, LogPart, LogSource, LogStore } from './log-store.js';
import { createLogCursors, LogWriter, openDays } from './log-writer.js';

export class SqliteLogStore implements LogStore {
  private readonly index: LogIndex;
  private readonly writer: LogWriter;
  private readonly reader: LogQuery;
  private readonly retention: LogRetention;

  private constructor(private readonly days: LogDays) {
    this.index = new LogIndex(days);
    this.writer = new LogWriter(days, this.index);
    this.reader = new LogQuery(days, this.index);
    this.retention = new LogRetention(days, [this.writer, this.index]);
  }

  static async open(path: string, opts: SqliteLogStoreOptions): Promise<SqliteLogStore> {
    const db = await SqliteDb.open(path);
    await createLogCursors(db);
    const tables = (await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'log%'")).map((r) => r.name);
    await createIndexCursor(db, tables);
    const store = new SqliteLogStore(new LogDays(db, opts));
    await openDays(store.days, tables);
    await convertOldDays(store.days, store.writer, tables);
    await store.index.indexUnindexed();
    return store;
  }

  writeBlocks(source: LogSource, parts: readonly LogPart[]): Promise<{ duplicate: boolean; written: number }> {
    return this.writer.writeBlocks(source, parts);
  }

  /** Writes the waiting key index now (it is written once a minute, and on close). */
  writeIndex(): Promise<void> {
    return this.index.write();
  }

  isPageToken(token: string): boolean {
    return isPageToken(token);
  }

  query(filter: LogFilter, limit: number, pageToken: string): Promise<LogPage> {
    return this.reader.query(filter, limit, pageToken);
  }

  applyRetention(): Promise<string[]> {
    return this.retention.apply();
  }

  /** Statements this store sent to SQLite so far (tests count them: a report's must not grow). */
  get statementsIssued(): number {
    return this.days.db.statementsIssued;
  }

  /** The day partitions that exist (for tests and operators). */
  partitions(): string[] {
    return this.days.sorted();
  }

  /** Writes the waiting key index, then closes. */
  async close(): Promise<void> {
    await this.index.close();
    return this.days.db.close();
  }
}
