// Which store holds the control plane's state and request logs: SQLite files by default, or one
// PostgreSQL database (--database-url). The rest of the control plane sees only Db and LogStore.
import type { Db } from './db.js';
import type { SqliteLogStoreOptions } from './log-store/log-days.js';
import type { LogStore } from './log-store/log-store.js';
import { PgLogStore } from './log-store/pg-log-store.js';
import { SqliteLogStore } from './log-store/sqlite-log-store.js';
import { describeUrl, PgDb } from './pg-db.js';
import { PgLeadership } from './pg-leadership.js';
import { STATE_WRITE_LOCK, type Fence } from './pg-locks.js';
import { holdSqliteFile, SqliteDb } from './sqlite-db.js';

/** Another control plane uses the SQLite file: this one must not start (exit 2). */
export class StoreInUseError extends Error {}

export interface StoreLocation {
  /** PostgreSQL when set, else the SQLite files below. */
  databaseUrl: string | null;
  dbPath: string;
  logsDbPath: string;
}

/** Where the state is, for log lines: a file path, or host:port/database (never a password). */
export function describeStore(at: StoreLocation): string {
  return at.databaseUrl ? `postgres ${describeUrl(at.databaseUrl)}` : at.dbPath;
}

/**
 * The state database; on PostgreSQL, connecting is tried again (logged) until the server answers, and
 * `fence` (the leader's epoch) is checked by every write.
 */
export async function openStateDb(at: StoreLocation, log: (line: string) => void, fence?: Fence): Promise<Db> {
  if (at.databaseUrl) return PgDb.open(at.databaseUrl, { writeLockKey: STATE_WRITE_LOCK, log, fence });
  if (!(await holdSqliteFile(at.dbPath))) {
    throw new StoreInUseError(`another control plane uses ${at.dbPath}: one control plane per SQLite file (several need PostgreSQL, --database-url)`);
  }
  return SqliteDb.open(at.dbPath);
}

export function openLogStore(at: StoreLocation, opts: SqliteLogStoreOptions, fence?: Fence): Promise<LogStore> {
  return at.databaseUrl ? PgLogStore.open(at.databaseUrl, opts, fence) : SqliteLogStore.open(at.logsDbPath, opts);
}

/** Who leads among the control planes on one PostgreSQL database; null on SQLite (one control plane). */
export function openLeadership(at: StoreLocation, log: (line: string) => void, retryMs: number): PgLeadership | null {
  return at.databaseUrl ? new PgLeadership(at.databaseUrl, { log, retryMs }) : null;
}

