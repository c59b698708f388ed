// The PostgreSQL store (--database-url): the only module, with the repos' SQL, that touches pg. It
// keeps what SQLite's store promises (docs/design.md#one-writer-on-both-stores): one writer connection whose
// queue runs one statement or transaction at a time, a transaction begun with the same statement as
// a transaction-scoped advisory lock (what BEGIN IMMEDIATE is to SQLite: one writer on the database
// at a time, whoever else connects), and a second connection for long reads, each in one REPEATABLE
// READ snapshot. A connection that cannot be made is tried again, with a logged line, until it can:
// statements wait in the queue meanwhile, and a report not written is not acknowledged, so nodes keep
// it and send it again. A leader's store is fenced (docs/design.md#several-control-planes-on-one-database):
// every write, a lone statement included, runs in a transaction that checks the leader's epoch first.
import pg from 'pg';
import type { Db, Param, Queryable, RunResult, Tx } from './db.js';
import { FENCED_SQLSTATE, type Fence } from './pg-locks.js';
import { currentTxRider, runTransaction, type TxRider } from './transaction.js';
import { CpError } from '../errors.js';

const INT8_OID = 20;
const NUMERIC_OID = 1700;
// BIGINT columns and SUM()s (NUMERIC) as numbers: micro-dollars and counts stay far below 2^53.
const types = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === INT8_OID || oid === NUMERIC_OID ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format as 'text')) as typeof pg.types.getTypeParser,
};

/** Error codes of a server that is there but not taking this connection yet (tried again). */
const RETRIED_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'ENOTFOUND', 'EPIPE', '57P03', '53300', '57P01', '57P02']);

/** A connection that failed because the server is not there (yet): tried again; anything else (a refused login) is not. */
export function isRetriedConnectError(e: Error & { code?: string }): boolean {
  return RETRIED_CODES.has(e.code ?? '') || /timeout|terminat|ECONN/i.test(e.message);
}

export interface PgDbOptions {
  /** Told each time a connection could not be made, and when one is made again. */
  log?(line: string): void;
  /** The advisory lock every write transaction takes (one per store sharing the database). */
  writeLockKey: number;
  /** First and longest wait between connection attempts (ms). */
  retryMs?: { first: number; max: number };
  /** The leader's epoch, checked by every write transaction (several control planes on one database). */
  fence?: Fence;
}

/** A statement that only reads (sent on the writer outside a transaction even when fenced). */
const READ_ONLY_SQL = /^\s*SELECT\b/i;

/** The server's address for log lines: host, port and database, never the user or password. */
export function describeUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.hostname}:${u.port || '5432'}${u.pathname}`;
  } catch {
    return 'the database';
  }
}

const placeholders = new Map<string, string>();

/**
 * The repos' SQL with PostgreSQL's placeholders: each `?` becomes `$n` in order, `?N` becomes `$N`;
 * quoted strings, quoted names, comments and dollar-quoted bodies are left as they are.
 */
export function toPostgresPlaceholders(sql: string): string {
  const kept = placeholders.get(sql);
  if (kept !== undefined) return kept;
  let out = '';
  let n = 0;
  for (let i = 0; i < sql.length; ) {
    const c = sql[i];
    const skipTo = (end: number) => {
      const stop = end < 0 ? sql.length : end;
      out += sql.slice(i, stop);
      i = stop;
    };
    if (c === "'" || c === '"') skipTo(sql.indexOf(c, i + 1) + 1 || sql.length);
    else if (c === '-' && sql[i + 1] === '-') skipTo(sql.indexOf('\n', i));
    else if (c === '$' && sql[i + 1] === '$') skipTo(sql.indexOf('$$', i + 2) + 2 || sql.length);
    else if (c === '?') {
      const m = /^\?(\d+)/.exec(sql.slice(i, i + 8));
      out += m ? `$${m[1]}` : `$${++n}`;
      i += m ? m[0].length : 1;
    } else {
      out += c;
      i++;
    }
  }
  if (placeholders.size > 5000) placeholders.clear();
  placeholders.set(sql, out);
  return out;
}

/** One connection with its queue; made again (and again) when it is lost. */
class PgConnection {
  private queue: Promise<unknown> = Promise.resolve();
  queued = 0;
  closed = false;
  private client: pg.Client | null = null;
  private connecting: Promise<pg.Client> | null = null;
  statementsIssued = 0;

  constructor(
    private readonly url: string,
    private readonly opts: PgDbOptions,
    private readonly role: string,
  ) {}

  enqueue<T>(work: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error('database is closed'));
    this.queued++;
    const next = this.queue.then(work, work).finally(() => this.queued--);
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** The live client, or a new one once the server takes it (waiting as long as that takes). */
  connect(): Promise<pg.Client> {
    if (this.client) return Promise.resolve(this.client);
    this.connecting ??= this.connectWithRetries().finally(() => (this.connecting = null));
    return this.connecting;
  }

  private async connectWithRetries(): Promise<pg.Client> {
    const { first, max } = this.opts.retryMs ?? { first: 250, max: 5_000 };
    for (let wait = first, failures = 0; ; wait = Math.min(max, wait * 2)) {
      const c = new pg.Client({ connectionString: this.url, types, application_name: `tollgate-control-plane (${this.role})` });
      // A lost connection is noticed here (and by the failed statement); the next statement connects again.
      c.on('error', () => this.drop(c));
      c.on('end', () => this.drop(c));
      try {
        await c.connect();
        if (failures > 0) this.opts.log?.(`database: connected to ${describeUrl(this.url)} (${this.role}) after ${failures} failed attempt(s)`);
        this.client = c;
        return c;
      } catch (err) {
        const e = err as Error & { code?: string };
        c.end().catch(() => undefined);
        if (this.closed) throw new Error('database is closed');
        if (!isRetriedConnectError(e)) throw err;
        failures++;
        this.opts.log?.(`database: cannot reach ${describeUrl(this.url)} (${e.code ?? e.message}); trying again in ${wait} ms`);
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  }

  private drop(c: pg.Client): void {
    if (this.client !== c) return;
    this.client = null;
    c.end().catch(() => undefined);
  }

  /**
   * One statement on client `c`. A job of the queue (a statement, a transaction, a read) runs all its
   * statements on the client it started with: one lost midway fails the rest of the job, never
   * sends them on a new connection outside the transaction they belong to.
   */
  private async query(c: pg.Client, sql: string, params?: Param[]): Promise<pg.QueryResult> {
    if (this.client !== c) throw new Error('database connection lost');
    this.statementsIssued++;
    try {
      return await c.query(params === undefined ? sql : { text: toPostgresPlaceholders(sql), values: params as unknown[] });
    } catch (err) {
      // A statement cut by a lost connection: the next job connects again.
      const e = err as Error & { code?: string };
      if (RETRIED_CODES.has(e.code ?? '') || /terminat|not queryable|ECONN|EPIPE/i.test(e.message)) this.drop(c);
      throw err;
    }
  }

  /** Statements on client `c` only (see query). */
  on(c: pg.Client): Queryable {
    return {
      dialect: 'postgres',
      run: async (sql, params = []) => ({ changes: (await this.query(c, sql, params)).rowCount ?? 0, lastID: 0 }),
      get: async <T>(sql: string, params: Param[] = []) => (await this.query(c, sql, params)).rows[0] as T | undefined,
      all: async <T>(sql: string, params: Param[] = []) => (await this.query(c, sql, params)).rows as T[],
      exec: async (sql) => void (await this.query(c, sql)),
      // Statements are not named on PostgreSQL: a plan kept across a dropped partition would fail.
      runPrepared: async (sql, params) => ({ changes: (await this.query(c, sql, params)).rowCount ?? 0, lastID: 0 }),
    };
  }

  /** Queues `work`, run on the client live when its turn comes (connecting first when there is none). */
  job<T>(work: (q: Queryable) => Promise<T>): Promise<T> {
    return this.enqueue(async () => work(this.on(await this.connect())));
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.queue;
    const c = this.client ?? (await this.connecting?.catch(() => null)) ?? null;
    this.client = null;
    await c?.end().catch(() => undefined);
  }
}

export class PgDb implements Db {
  readonly dialect = 'postgres' as const;
  txObserver: ((seconds: number, committed: boolean) => void) | null = null;
  private readonly writer: PgConnection;
  private readonly reader: PgConnection;
  private readonly beginSql: string;
  private readonly fence: Fence | null;
  /** Set once this store must write no more (its leader lost the lead): every write is refused at once. */
  private refusal: Error | null = null;

  private constructor(url: string, opts: PgDbOptions) {
    this.writer = new PgConnection(url, opts, 'writer');
    this.reader = new PgConnection(url, opts, 'reader');
    this.fence = opts.fence ?? null;
    const fenceSql = this.fence ? `; SELECT tollgate_fence(${Math.trunc(this.fence.epoch)})` : '';
    this.beginSql = `BEGIN; SELECT pg_advisory_xact_lock(${Math.trunc(opts.writeLockKey)})${fenceSql}`;
  }

  /** From now on every write is refused here, before it reaches the database (the lead was lost). */
  refuseWrites(reason: string): void {
    // A catalog error: the lead lost is an answer (UNAVAILABLE), not a bug to log with its stack.
    this.refusal ??= new CpError('NOT_LEADER', reason.startsWith('write refused') ? reason : `write refused: ${reason}`);
  }

  /** Connects (trying again until the server takes the connection) and returns the store. */
  static async open(url: string, opts: PgDbOptions): Promise<PgDb> {
    const db = new PgDb(url, opts);
    await db.writer.connect();
    return db;
  }

  get statementsIssued(): number {
    return this.writer.statementsIssued + this.reader.statementsIssued;
  }

  get queueDepth(): number {
    return this.writer.queued;
  }

  async readerQueueDepth(): Promise<number> {
    return this.reader.queued;
  }

  async forgetStatements(): Promise<void> {}

  // Fenced, a statement that may write goes in a transaction of its own, after the fence.
  run(sql: string, params?: Param[]): Promise<RunResult> {
    return this.fence ? this.txWith((t) => t.run(sql, params), null) : this.writer.job((q) => q.run(sql, params));
  }
  get<T = Record<string, unknown>>(sql: string, params?: Param[]): Promise<T | undefined> {
    return this.fence && !READ_ONLY_SQL.test(sql) ? this.txWith((t) => t.get<T>(sql, params), null) : this.writer.job((q) => q.get<T>(sql, params));
  }
  all<T = Record<string, unknown>>(sql: string, params?: Param[]): Promise<T[]> {
    return this.fence && !READ_ONLY_SQL.test(sql) ? this.txWith((t) => t.all<T>(sql, params), null) : this.writer.job((q) => q.all<T>(sql, params));
  }
  exec(sql: string): Promise<void> {
    return this.fence ? this.txWith((t) => t.exec(sql), null) : this.writer.job((q) => q.exec(sql));
  }
  runPrepared(sql: string, params: Param[]): Promise<RunResult> {
    return this.fence ? this.txWith((t) => t.runPrepared(sql, params), null) : this.writer.job((q) => q.runPrepared(sql, params));
  }

  read<T>(fn: (q: Queryable) => Promise<T>): Promise<T> {
    return this.writer.job(fn);
  }

  readOnly<T>(fn: (q: Queryable) => Promise<T>): Promise<T> {
    return this.reader.job(async (q) => {
      await q.exec('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      try {
        return await fn(q);
      } finally {
        await q.exec('COMMIT').catch(() => undefined);
      }
    });
  }

  tx<T>(fn: (tx: Tx) => Promise<T>): Promise<T> {
    return this.txWith(fn, currentTxRider());
  }

  /** A lone statement sent in a transaction of its own (fenced) carries no rider: it is not a change's transaction. */
  private txWith<T>(fn: (tx: Tx) => Promise<T>, rider: TxRider | null): Promise<T> {
    return this.writer.job(async (q) => {
      if (this.refusal) throw this.refusal;
      try {
        return await runTransaction(q, this.beginSql, fn, this.txObserver, this.fence === null, rider);
      } catch (err) {
        // The epoch check refused it: another control plane leads. Nothing more is written from here.
        if ((err as { code?: string }).code === FENCED_SQLSTATE && this.fence) {
          this.refuseWrites((err as Error).message);
          this.fence.onFenced(err as Error);
          throw this.refusal;
        }
        throw err;
      }
    });
  }

  async close(): Promise<void> {
    await Promise.all([this.writer.close(), this.reader.close()]);
  }
}
