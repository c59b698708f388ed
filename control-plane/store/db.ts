// How the control plane talks to its database, whichever holds it: SQLite (the default, one file,
// sqlite-db.ts) or PostgreSQL (--database-url, pg-db.ts). Both keep one writer connection with one
// queue of statements, so a transaction never interleaves with another of this process (docs/design.md#one-writer-on-both-stores).
// The SQL is shared: `?` placeholders, portable statements, and dialect.ts for what differs.

export interface RunResult {
  changes: number;
  /** SQLite's last inserted rowid; always 0 on PostgreSQL (use RETURNING). */
  lastID: number;
}

export type Param = string | number | bigint | null | Buffer | Uint8Array;

/** Which SQL a statement is written in, for the few statements that differ (dialect.ts). */
export type Dialect = 'sqlite' | 'postgres';

export interface Queryable {
  readonly dialect: Dialect;
  run(sql: string, params?: Param[]): Promise<RunResult>;
  get<T = Record<string, unknown>>(sql: string, params?: Param[]): Promise<T | undefined>;
  all<T = Record<string, unknown>>(sql: string, params?: Param[]): Promise<T[]>;
  /** Statements without parameters, several separated by `;`. */
  exec(sql: string): Promise<void>;
  /** Like run, through a statement prepared once per SQL text and kept (multi-row inserts on hot paths). */
  runPrepared(sql: string, params: Param[]): Promise<RunResult>;
}

export interface Tx extends Queryable {
  /** Runs after COMMIT, before the next queued statement: the place to publish what the transaction made. */
  afterCommit(fn: () => void): void;
  /**
   * The transaction's last statement (runPrepared): none may follow it. When it is also the first,
   * it runs alone, without BEGIN and COMMIT: one statement is atomic by itself, and a hand-off to
   * the database and back costs the same whatever the statement does
   * (docs/design.md#a-report-is-one-statement).
   */
  runLast(sql: string, params: Param[]): Promise<RunResult>;
}

/** The state database: one writer connection and its queue, and a reader for long reads. */
export interface Db extends Queryable {
  /** Statements sent so far (tests count them: what a caller's work costs must not grow with its input). */
  readonly statementsIssued: number;
  /** Told how long each write transaction took (BEGIN to COMMIT or ROLLBACK): for metrics. */
  txObserver: ((seconds: number, committed: boolean) => void) | null;
  /** How many statements or transactions are queued on the writer (for tests and metrics). */
  readonly queueDepth: number;
  /** The reader's queue depth (0 before it is first used). */
  readerQueueDepth(): Promise<number>;
  /** Forgets kept statements whose SQL contains `needle` (before the table they use is dropped). */
  forgetStatements(needle: string): Promise<void>;
  /** Several reads on the reader, in one read transaction (one consistent view of the last commit). */
  readOnly<T>(fn: (q: Queryable) => Promise<T>): Promise<T>;
  /** Several reads on the writer with nothing written in between. */
  read<T>(fn: (q: Queryable) => Promise<T>): Promise<T>;
  /** One write transaction; rolled back when `fn` throws (sqlite-db.ts gives the details both keep). */
  tx<T>(fn: (tx: Tx) => Promise<T>): Promise<T>;
  /** Refuses new work at once, lets every queued statement and transaction finish, then closes. */
  close(): Promise<void>;
  /** PostgreSQL: every write is refused from now on, before it is sent (a leader that lost the lead). */
  refuseWrites?(reason: string): void;
}
