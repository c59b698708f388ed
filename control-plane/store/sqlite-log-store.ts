// Request logs in their own SQLite file (WAL), one table per UTC day (`logs_YYYYMMDD`), so retention
// drops whole tables instead of deleting rows. A report's rows go in with prepared multi-row INSERTs
// in one transaction together with the report's cursor (log_cursors), which makes a replay a no-op.
// Each day table is indexed by (key_id, at_ms) and (org_id, at_ms): the leak question ("who used this
// key between T1 and T2") is a range scan of one index per day.
import type { LogRow } from '../../proto/lib/log-columns.js';
import { Db, type Param, type Queryable } from './db.js';
import type { LogFilter, LogPage, LogSource, LogStore, StoredLog } from './log-store.js';

const DAY_MS = 86_400_000;
/** Rows per multi-row INSERT (21 columns each: well under SQLite's bound-parameter limit). */
const CHUNK_ROWS = 64;
const COLUMNS = [
  'request_id', 'at_ms', 'node_id', 'key_id', 'project_id', 'org_id', 'client_ip', 'user_agent', 'method', 'path', 'status',
  'latency_us', 'bytes_in', 'bytes_out', 'model', 'prompt_tokens', 'completion_tokens', 'cost_micros', 'reason', 'key_prefix',
] as const;
const TABLE_RE = /^logs_(\d{8})$/;

export interface SqliteLogStoreOptions {
  retentionDays: number;
  now(): number;
  log?(line: string): void;
}

export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10).replace(/-/g, '');
}

function dayStartMs(day: string): number {
  return Date.UTC(Number(day.slice(0, 4)), Number(day.slice(4, 6)) - 1, Number(day.slice(6, 8)));
}

export class SqliteLogStore implements LogStore {
  /** Day tables that exist (kept in step with CREATE and DROP). */
  private readonly days = new Set<string>();

  private constructor(
    private readonly db: Db,
    private readonly opts: SqliteLogStoreOptions,
  ) {}

  static async open(path: string, opts: SqliteLogStoreOptions): Promise<SqliteLogStore> {
    const db = await Db.open(path);
    await db.exec(`CREATE TABLE IF NOT EXISTS log_cursors (
      node_id TEXT NOT NULL, instance_id TEXT NOT NULL, last_seq INTEGER NOT NULL, PRIMARY KEY (node_id, instance_id)
    ) WITHOUT ROWID`);
    const store = new SqliteLogStore(db, opts);
    for (const r of await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'logs_%'")) {
      const m = TABLE_RE.exec(r.name);
      if (m) store.days.add(m[1]);
    }
    return store;
  }

  /** The oldest day kept: rows of older days are neither stored nor kept. */
  private oldestKeptDay(): string {
    return dayOf(this.opts.now() - (this.opts.retentionDays - 1) * DAY_MS);
  }

  private async ensureDay(q: Queryable, day: string, added: string[]): Promise<void> {
    if (this.days.has(day)) return;
    added.push(day);
    const t = `logs_${day}`;
    await q.exec(`CREATE TABLE IF NOT EXISTS ${t} (
      request_id TEXT NOT NULL, at_ms INTEGER NOT NULL, node_id TEXT NOT NULL, key_id TEXT NOT NULL, project_id TEXT NOT NULL,
      org_id TEXT NOT NULL, client_ip TEXT NOT NULL, user_agent TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
      status INTEGER NOT NULL, latency_us INTEGER NOT NULL, bytes_in INTEGER NOT NULL, bytes_out INTEGER NOT NULL, model TEXT NOT NULL,
      prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL, reason TEXT NOT NULL,
      key_prefix TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS ${t}_by_key ON ${t} (key_id, at_ms);
    CREATE INDEX IF NOT EXISTS ${t}_by_org ON ${t} (org_id, at_ms);`);
    this.days.add(day);
  }

  async writeBatch(source: LogSource, seq: number, rows: readonly LogRow[]): Promise<{ duplicate: boolean; written: number }> {
    const oldest = this.oldestKeptDay();
    const byDay = new Map<string, LogRow[]>();
    for (const r of rows) {
      const day = dayOf(r.atMs);
      if (day < oldest) continue;
      const list = byDay.get(day);
      if (list) list.push(r);
      else byDay.set(day, [r]);
    }
    const added: string[] = [];
    try {
      return await this.writeDays(source, seq, byDay, added);
    } catch (err) {
      // Created inside the transaction that rolled back: they do not exist.
      for (const d of added) this.days.delete(d);
      throw err;
    }
  }

  private writeDays(source: LogSource, seq: number, byDay: Map<string, LogRow[]>, added: string[]): Promise<{ duplicate: boolean; written: number }> {
    return this.db.tx(async (tx) => {
      const cur = await tx.get<{ last_seq: number }>('SELECT last_seq FROM log_cursors WHERE node_id = ? AND instance_id = ?', [source.nodeId, source.instanceId]);
      if (cur && seq <= cur.last_seq) return { duplicate: true, written: 0 };
      let written = 0;
      for (const [day, list] of byDay) {
        await this.ensureDay(tx, day, added);
        written += await this.insertRows(tx, `logs_${day}`, source.nodeId, list);
      }
      await tx.runPrepared(
        'INSERT INTO log_cursors (node_id, instance_id, last_seq) VALUES (?, ?, ?) ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = excluded.last_seq',
        [source.nodeId, source.instanceId, seq],
      );
      return { duplicate: false, written };
    });
  }

  private async insertRows(q: Queryable, table: string, nodeId: string, rows: readonly LogRow[]): Promise<number> {
    let i = 0;
    while (i < rows.length) {
      const n = rows.length - i >= CHUNK_ROWS ? CHUNK_ROWS : 1;
      const params: Param[] = [];
      for (let j = i; j < i + n; j++) {
        const r = rows[j];
        params.push(r.requestId, r.atMs, nodeId, r.keyId, r.projectId, r.orgId, r.clientIp, r.userAgent, r.method, r.path, r.status,
          r.latencyUs, r.bytesIn, r.bytesOut, r.model, r.promptTokens, r.completionTokens, r.costMicros, r.reason, r.keyPrefix);
      }
      await q.runPrepared(insertSql(table, n), params);
      i += n;
    }
    return rows.length;
  }

  async query(filter: LogFilter, limit: number, pageToken: string): Promise<LogPage> {
    const oldest = this.oldestKeptDay();
    const until = filter.untilMs ?? this.opts.now() + DAY_MS;
    const since = filter.sinceMs ?? 0;
    let after: { day: string; atMs: number; rowid: number } | null = null;
    if (pageToken) {
      const m = /^(\d{8}):(\d+):(\d+)$/.exec(pageToken);
      if (!m) throw new Error('bad page token');
      after = { day: m[1], atMs: Number(m[2]), rowid: Number(m[3]) };
    }
    const days = [...this.days].filter((d) => d >= oldest && dayStartMs(d) < until && dayStartMs(d) + DAY_MS > since).sort().reverse();
    const out: StoredLog[] = [];
    let next = '';
    for (const day of days) {
      if (after && day > after.day) continue;
      const where: string[] = [];
      const params: Param[] = [];
      if (filter.unknownKeys) where.push("key_id = ''");
      else if (filter.keyId !== undefined) {
        where.push('key_id = ?');
        params.push(filter.keyId);
      }
      if (filter.orgId !== undefined) {
        where.push('org_id = ?');
        params.push(filter.orgId);
      }
      if (filter.projectId !== undefined) {
        where.push('project_id = ?');
        params.push(filter.projectId);
      }
      where.push('at_ms >= ?', 'at_ms < ?');
      params.push(since, until);
      if (filter.clientIp !== undefined) {
        where.push('client_ip = ?');
        params.push(filter.clientIp);
      }
      if (filter.status !== undefined) {
        where.push('status = ?');
        params.push(filter.status);
      }
      if (after && day === after.day) {
        where.push('(at_ms, rowid) < (?, ?)');
        params.push(after.atMs, after.rowid);
      }
      const want = limit + 1 - out.length;
      const rows = await this.db.all<Record<string, string | number> & { rid: number }>(
        `SELECT rowid AS rid, ${COLUMNS.join(', ')} FROM logs_${day} WHERE ${where.join(' AND ')} ORDER BY at_ms DESC, rowid DESC LIMIT ${want}`,
        params,
      );
      for (const r of rows) {
        if (out.length === limit) {
          const last = out[out.length - 1] as StoredLog & { rid?: number };
          next = `${dayOf(last.atMs)}:${last.atMs}:${last.rid}`;
          break;
        }
        out.push(storedOf(r));
      }
      if (next) break;
    }
    for (const o of out) delete (o as { rid?: number }).rid;
    return { logs: out, next };
  }

  async applyRetention(): Promise<string[]> {
    const oldest = this.oldestKeptDay();
    const dropped: string[] = [];
    for (const day of [...this.days].sort()) {
      if (day >= oldest) break;
      await this.db.forgetStatements(`logs_${day}`);
      await this.db.exec(`DROP TABLE IF EXISTS logs_${day}`);
      this.days.delete(day);
      dropped.push(day);
    }
    if (dropped.length > 0) this.opts.log?.(`request logs: dropped ${dropped.length} day partition(s) older than ${this.opts.retentionDays} days (${dropped[0]}..${dropped[dropped.length - 1]})`);
    return dropped;
  }

  /** The day partitions that exist (for tests and operators). */
  partitions(): string[] {
    return [...this.days].sort();
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

const insertSqlCache = new Map<string, string>();
function insertSql(table: string, rows: number): string {
  const k = `${table}/${rows}`;
  let sql = insertSqlCache.get(k);
  if (!sql) {
    const one = `(${COLUMNS.map(() => '?').join(',')})`;
    sql = `INSERT INTO ${table} (${COLUMNS.join(',')}) VALUES ${Array.from({ length: rows }, () => one).join(',')}`;
    if (insertSqlCache.size > 1000) insertSqlCache.clear();
    insertSqlCache.set(k, sql);
  }
  return sql;
}

function storedOf(r: Record<string, string | number> & { rid: number }): StoredLog & { rid: number } {
  return {
    rid: r.rid,
    requestId: String(r.request_id),
    atMs: Number(r.at_ms),
    nodeId: String(r.node_id),
    keyId: String(r.key_id),
    projectId: String(r.project_id),
    orgId: String(r.org_id),
    clientIp: String(r.client_ip),
    userAgent: String(r.user_agent),
    method: String(r.method),
    path: String(r.path),
    status: Number(r.status),
    latencyUs: Number(r.latency_us),
    bytesIn: Number(r.bytes_in),
    bytesOut: Number(r.bytes_out),
    model: String(r.model),
    promptTokens: Number(r.prompt_tokens),
    completionTokens: Number(r.completion_tokens),
    costMicros: Number(r.cost_micros),
    reason: String(r.reason),
    keyPrefix: String(r.key_prefix),
  };
}
