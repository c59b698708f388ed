// Request logs in PostgreSQL (--database-url), beside the control state in the same database: the
// same blocks, key index, queries and retention as sqlite-log-store.ts, over the tables partitioned
// by day that log-writer.ts makes (PG_LOG_PARENTS_SQL): logblocks and logkeys, one partition per UTC
// day named as SQLite's day tables, dropped whole when the day passes the retention. Its own
// connections (and write lock), as SQLite's request logs have their own file: a report's blocks
// never wait behind the control state's writes.
import { PgDb } from '../pg-db.js';
import { LOG_WRITE_LOCK, type Fence } from '../pg-locks.js';
import { DAY_TABLE_RE, LogDays, type SqliteLogStoreOptions } from './log-days.js';
import { createIndexCursor, LogIndex } from './log-index.js';
import { isPageToken, LogQuery } from './log-query.js';
import { LogRetention } from './log-retention.js';
import type { LogFilter, LogPage, LogPart, LogSource, LogStore } from './log-store.js';
import { createLogCursors, LogWriter, PG_LOG_PARENTS_SQL } from './log-writer.js';

export class PgLogStore implements LogStore {
  private readonly index: LogIndex;
  private readonly writer: LogWriter;
  private readonly reader: LogQuery;
  private readonly retention: LogRetention;

  /** Every write is refused from now on (this control plane lost the lead). */
  refuseWrites(reason: string): void {
    this.days.db.refuseWrites?.(reason);
  }

  private constructor(private readonly days: LogDays) {
    this.index = new LogIndex(days);
    this.writer = new LogWriter(days, this.index);
    this.reader = new LogQuery(days, this.index);
    this.retention = new LogRetention(days, [this.writer, this.index]);
  }

  /** `fence`: a leader's epoch, checked by every write (several control planes on one database). */
  static async open(url: string, opts: SqliteLogStoreOptions, fence?: Fence): Promise<PgLogStore> {
    const db = await PgDb.open(url, { writeLockKey: LOG_WRITE_LOCK, log: opts.log, fence });
    await db.tx(async (tx) => {
      await tx.exec(PG_LOG_PARENTS_SQL);
    });
    await createLogCursors(db);
    await createIndexCursor(db, []);
    const store = new PgLogStore(new LogDays(db, opts));
    const partitions = await db.all<{ name: string }>(
      "SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'logblocks'::regclass",
    );
    for (const { name } of partitions) {
      const m = DAY_TABLE_RE.exec(name);
      if (m) store.days.add(m[1]);
    }
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
