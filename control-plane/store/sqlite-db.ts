// The SQLite store (the default): the only module, with the repos' SQL, that touches sqlite3. One
// connection; every statement runs through one in-process queue, and a transaction is BEGIN IMMEDIATE … COMMIT with nothing else
// interleaved, so callers never see another caller's uncommitted writes (BEGIN goes with its first
// statement; a transaction of one statement sent by runLast needs neither BEGIN nor COMMIT). Reads that may be many and
// slow (usage) go through `readOnly` instead: a second, read-only connection with its own queue,
// which in WAL mode sees the last committed state and never waits behind, or holds up, the writer's
// queue (report ingest, money leases).
import sqlite3 from 'sqlite3';
import type { Db, Param, Queryable, RunResult, Tx } from './db.js';
import { currentTxRider, runTransaction } from './transaction.js';

/**
 * Holds the SQLite state file for this process alone, or answers false when another process holds it:
 * an exclusive transaction, never ended, on a small file beside it (`PATH.lock`). SQLite's file lock
 * goes when the process ends, however it ends. One control plane per SQLite file; several need
 * PostgreSQL (docs/deployment.md#two-or-three-control-planes-on-postgresql).
 */
export async function holdSqliteFile(path: string): Promise<boolean> {
  const raw = await new Promise<sqlite3.Database>((resolve, reject) => {
    const d = new sqlite3.Database(`${path}.lock`, (err) => (err ? reject(err) : resolve(d)));
  });
  const exec = (sql: string) => new Promise<void>((resolve, reject) => raw.exec(sql, (err) => (err ? reject(err) : resolve())));
  try {
    await exec('PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE');
    held.push(raw);
    return true;
  } catch (err) {
    raw.close();
    if ((err as { code?: string }).code === 'SQLITE_BUSY') return false;
    throw err;
  }
}
/** The lock files' connections, kept open (and referenced) as long as the process lives. */
const held: sqlite3.Database[] = [];

export class SqliteDb implements Db {
  readonly dialect = 'sqlite' as const;
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private readonly statements = new Map<string, sqlite3.Statement>();
  /**
   * Statements sent to SQLite so far (each run, get, all, exec, prepared run, BEGIN and COMMIT): what
   * a caller's work costs on the queue, counted by tests that must not grow with their input.
   */
  statementsIssued = 0;
  /** Told how long each write transaction took (BEGIN to COMMIT or ROLLBACK): for metrics. */
  txObserver: ((seconds: number, committed: boolean) => void) | null = null;

  /** Statements and transactions waiting in (or running from) this connection's queue. */
  private queued = 0;
  private reader: Promise<SqliteDb> | null = null;

  private constructor(
    private readonly raw: sqlite3.Database,
    private readonly path: string,
  ) {}

  static async open(path: string): Promise<SqliteDb> {
    const raw = await new Promise<sqlite3.Database>((resolve, reject) => {
      const d = new sqlite3.Database(path, (err) => (err ? reject(err) : resolve(d)));
    });
    const db = new SqliteDb(raw, path);
    await db.direct.exec('PRAGMA journal_mode = WAL');
    await db.direct.exec('PRAGMA busy_timeout = 5000');
    await db.direct.exec('PRAGMA foreign_keys = ON');
    // WAL + NORMAL: a committed transaction survives the process being killed at any moment.
    await db.direct.exec('PRAGMA synchronous = NORMAL');
    return db;
  }

  /** Statements straight on the connection; only for use inside a queued slot. */
  private readonly direct: Queryable = {
    dialect: 'sqlite',
    run: (sql, params = []) =>
      new Promise((resolve, reject) => {
        this.statementsIssued++;
        this.raw.run(sql, params, function (this: sqlite3.RunResult, err: Error | null) {
          if (err) reject(err);
          else resolve({ changes: this.changes, lastID: this.lastID });
        });
      }),
    get: <T>(sql: string, params: Param[] = []) =>
      new Promise<T | undefined>((resolve, reject) => {
        this.statementsIssued++;
        this.raw.get(sql, params, (err: Error | null, row: T) => (err ? reject(err) : resolve(row)));
      }),
    all: <T>(sql: string, params: Param[] = []) =>
      new Promise<T[]>((resolve, reject) => {
        this.statementsIssued++;
        this.raw.all(sql, params, (err: Error | null, rows: T[]) => (err ? reject(err) : resolve(rows)));
      }),
    exec: (sql) =>
      new Promise((resolve, reject) => {
        this.statementsIssued++;
        this.raw.exec(sql, (err) => (err ? reject(err) : resolve()));
      }),
    runPrepared: (sql, params) =>
      new Promise((resolve, reject) => {
        this.statementsIssued++;
        let stmt = this.statements.get(sql);
        if (!stmt) {
          // A statement that does not prepare (a table gone) rejects this call, is not kept, and
          // never reaches the Statement's 'error' event (uncaught, it would end the process).
          const fresh: sqlite3.Statement = this.raw.prepare(sql, (err: Error | null) => {
            if (!err) return;
            if (this.statements.get(sql) === fresh) this.statements.delete(sql);
            reject(err);
          });
          stmt = fresh;
          this.statements.set(sql, stmt);
        }
        const st = stmt;
        st.run(params, function (this: sqlite3.RunResult, err: Error | null) {
          if (err) reject(err);
          else resolve({ changes: this.changes, lastID: this.lastID });
        });
      }),
  };

  /** Finalizes the kept statements whose SQL contains `needle` (before the table they use is dropped). */
  forgetStatements(needle: string): Promise<void> {
    return this.enqueue(async () => {
      for (const [sql, st] of [...this.statements]) {
        if (!sql.includes(needle)) continue;
        this.statements.delete(sql);
        await new Promise<void>((resolve) => st.finalize(() => resolve()));
      }
    });
  }

  private enqueue<T>(work: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error('database is closed'));
    this.queued++;
    const next = this.queue.then(work, work).finally(() => this.queued--);
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** How many statements or transactions are queued on this connection (for tests and metrics). */
  get queueDepth(): number {
    return this.queued;
  }

  /**
   * Several reads on the second, read-only connection, in one read transaction (one consistent view
   * of the last commit). Its queue is its own: a burst of these never delays a write, and a long
   * write never delays them. An in-memory database has no second connection: read as `read` does.
   */
  readOnly<T>(fn: (q: Queryable) => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error('database is closed'));
    if (this.path === '' || this.path === ':memory:') return this.read(fn);
    this.reader ??= SqliteDb.openReader(this.path);
    return this.reader.then((r) =>
      r.enqueue(async () => {
        await r.direct.exec('BEGIN');
        try {
          return await fn(r.direct);
        } finally {
          await r.direct.exec('COMMIT').catch(() => undefined);
        }
      }),
    );
  }

  private static async openReader(path: string): Promise<SqliteDb> {
    const raw = await new Promise<sqlite3.Database>((resolve, reject) => {
      const d = new sqlite3.Database(path, sqlite3.OPEN_READONLY, (err) => (err ? reject(err) : resolve(d)));
    });
    const db = new SqliteDb(raw, path);
    await db.direct.exec('PRAGMA busy_timeout = 5000');
    return db;
  }

  /** The read-only connection's queue depth (0 before it is first used). */
  async readerQueueDepth(): Promise<number> {
    return this.reader ? (await this.reader).queued : 0;
  }

  run(sql: string, params?: Param[]): Promise<RunResult> {
    return this.enqueue(() => this.direct.run(sql, params));
  }
  get<T = Record<string, unknown>>(sql: string, params?: Param[]): Promise<T | undefined> {
    return this.enqueue(() => this.direct.get<T>(sql, params));
  }
  all<T = Record<string, unknown>>(sql: string, params?: Param[]): Promise<T[]> {
    return this.enqueue(() => this.direct.all<T>(sql, params));
  }
  exec(sql: string): Promise<void> {
    return this.enqueue(() => this.direct.exec(sql));
  }
  runPrepared(sql: string, params: Param[]): Promise<RunResult> {
    return this.enqueue(() => this.direct.runPrepared(sql, params));
  }

  /** Several reads with nothing written in between. */
  read<T>(fn: (q: Queryable) => Promise<T>): Promise<T> {
    return this.enqueue(() => fn(this.direct));
  }

  /**
   * One write transaction; rolled back when `fn` throws. Hooks from afterCommit run right after COMMIT
   * (all of them; if one throws, the call rejects after the others ran, and the work is committed).
   * BEGIN IMMEDIATE is sent with the first statement (nothing else runs on this connection meanwhile:
   * the queue holds it), so a transaction that issues none costs none, and one whose only statement
   * is `runLast` runs it alone: then it is committed once that statement succeeded, and an error
   * `fn` throws after it is thrown after the hooks ran, as a hook's is.
   */
  tx<T>(fn: (tx: Tx) => Promise<T>): Promise<T> {
    const rider = currentTxRider();
    return this.enqueue(() => runTransaction(this.direct, 'BEGIN IMMEDIATE', fn, this.txObserver, true, rider));
  }

  /** Refuses new work at once, lets every queued statement and transaction finish, then closes. */
  async close(): Promise<void> {
    this.closed = true;
    const reader = this.reader;
    this.reader = null;
    if (reader) await (await reader.catch(() => null))?.close();
    await this.queue;
    for (const st of this.statements.values()) await new Promise<void>((resolve) => st.finalize(() => resolve()));
    this.statements.clear();
    await new Promise<void>((resolve, reject) => this.raw.close((err) => (err ? reject(err) : resolve())));
  }
}
