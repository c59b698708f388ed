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
// The key index follows the blocks (docs/scale.md, "The log index follows the blocks"): a block's
// entries are kept in memory once its report committed, and written for all blocks together once a
// minute (or when many wait), sorted by key, in one transaction that also moves log_index_cursor. A
// query reads those in memory beside the table. A control plane that stopped without writing them
// indexes the blocks past the cursor again when it opens (from their columns), so nothing is lost.
import type { LogBlock } from '../../proto/gen/tollgate/v1/sync.js';
import { scanLogBlock } from '../../proto/lib/log-block-scan.js';
import { decodeLogColumns, LogBlocksBuilder, type LogRow, type LogRowFilter } from '../../proto/lib/log-columns.js';
import { LogColumns } from '../../proto/gen/tollgate/v1/sync.js';
import { Db, type Param, type Queryable, type Tx } from './db.js';
import { KeptCursors } from './kept-cursors.js';
import type { LogFilter, LogPage, LogPart, LogSource, LogStore, StoredLog } from './log-store.js';

const DAY_MS = 86_400_000;
/** Blocks per multi-row INSERT. */
const BLOCK_CHUNK = 16;
/** Blocks read per SELECT while a page fills. */
const READ_CHUNK = 16;
const DAY_TABLE_RE = /^logblocks_(\d{8})$/;
/** day:at_ms:block:row of the last row of a page. */
const PAGE_TOKEN_RE = /^(\d{8}):(\d{1,16}):(\d{1,16}):(\d{1,9})$/;
/** The per-row tables of earlier versions, converted to blocks when the store opens. */
const OLD_TABLE_RE = /^logs_(\d{8})$/;

export interface SqliteLogStoreOptions {
  retentionDays: number;
  now(): number;
  log?(line: string): void;
  /** How often the key index of the blocks written since is written (default INDEX_EVERY_MS). */
  indexEveryMs?: number;
}

/** The key index is written this often (docs/scale.md, "The log index follows the blocks"). */
const INDEX_EVERY_MS = 60_000;
/** …or as soon as this many entries wait (memory: about 275 bytes each, some 55 MB in all). */
const INDEX_MAX_PENDING = 200_000;
/** Entries per INSERT of the key index. */
const INDEX_CHUNK = 20_000;

/** One row of logkeys_DAY: key_id, max_at, block, min_at, project_id, org_id, rows. */
type IndexEntry = [string, number, number, number, string, string, number];

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

export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10).replace(/-/g, '');
}

function dayStartMs(day: string): number {
  return Date.UTC(Number(day.slice(0, 4)), Number(day.slice(4, 6)) - 1, Number(day.slice(6, 8)));
}

interface Candidate {
  block: number;
  max_at: number;
}

/** A row in page order: newest first, then by block and position (both descending). */
interface Placed {
  atMs: number;
  block: number;
  i: number;
  row: StoredLog;
}

function before(a: { atMs: number; block: number; i: number }, b: { atMs: number; block: number; i: number }): boolean {
  return a.atMs !== b.atMs ? a.atMs > b.atMs : a.block !== b.block ? a.block > b.block : a.i > b.i;
}

const byPageOrder = (a: Placed, b: Placed): number => (before(a, b) ? -1 : before(b, a) ? 1 : 0);

export class SqliteLogStore implements LogStore {
  /** Day partitions that exist (kept in step with CREATE and DROP). */
  private readonly days = new Set<string>();
  /** Node instances' log cursors as committed (this store is the file's only writer). */
  private readonly cursors = new KeptCursors();
  /** Each day's next block id, once read (blocks are numbered here so that one insert writes them all). */
  private readonly nextBlock = new Map<string, number>();
  /** Key index entries of committed blocks not written yet, by day. */
  private pending = new Map<string, IndexEntry[]>();
  private pendingCount = 0;
  /** Entries being written (still read by queries until their transaction committed). */
  private writing: Map<string, IndexEntry[]> | null = null;
  private indexing: Promise<void> | null = null;
  private readonly indexTimer: NodeJS.Timeout;

  private constructor(
    private readonly db: Db,
    private readonly opts: SqliteLogStoreOptions,
  ) {
    this.indexTimer = setInterval(() => void this.writeIndex(), opts.indexEveryMs ?? INDEX_EVERY_MS);
    this.indexTimer.unref();
  }

  static async open(path: string, opts: SqliteLogStoreOptions): Promise<SqliteLogStore> {
    const db = await Db.open(path);
    await db.exec(`CREATE TABLE IF NOT EXISTS log_cursors (
      node_id TEXT NOT NULL, instance_id TEXT NOT NULL, last_seq INTEGER NOT NULL, PRIMARY KEY (node_id, instance_id)
    ) WITHOUT ROWID`);
    const tables = (await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'log%'")).map((r) => r.name);
    if (!tables.includes('log_index_cursor')) {
      // Blocks written before the index followed them were indexed as they came: each day is
      // indexed up to its last block.
      await db.tx(async (tx) => {
        await tx.exec('CREATE TABLE log_index_cursor (day TEXT PRIMARY KEY, block INTEGER NOT NULL) WITHOUT ROWID');
        for (const name of tables) {
          const m = DAY_TABLE_RE.exec(name);
          if (m) await tx.run(`INSERT INTO log_index_cursor (day, block) SELECT ?, COALESCE(MAX(id), 0) FROM ${name}`, [m[1]]);
        }
      });
    }
    const store = new SqliteLogStore(db, opts);
    // A day's view without its tables (dropped by a version before the view) goes too.
    for (const { name } of await db.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'view' AND name LIKE 'logsink_%'")) {
      const day = /^logsink_(\d{8})$/.exec(name)?.[1];
      if (day && !tables.includes(`logblocks_${day}`)) await db.exec(`DROP VIEW ${name}`);
    }
    for (const name of tables) {
      const m = DAY_TABLE_RE.exec(name);
      if (!m) continue;
      store.days.add(m[1]);
      // Days written by a version before the sink get theirs.
      await db.exec(sinkSql(m[1]));
    }
    for (const name of tables) {
      const m = OLD_TABLE_RE.exec(name);
      if (m) await store.convertOldDay(m[1]);
    }
    await store.indexUnindexed();
    return store;
  }

  /** Blocks past their day's index cursor (the previous process stopped before writing their entries) are indexed now. */
  private async indexUnindexed(): Promise<void> {
    let indexed = 0;
    for (const day of [...this.days].sort()) {
      const cursor = (await this.db.get<{ block: number }>('SELECT block FROM log_index_cursor WHERE day = ?', [day]))?.block ?? 0;
      for (let after = cursor; ; ) {
        const blocks = await this.db.all<{ id: number; columns: Buffer }>(`SELECT id, columns FROM logblocks_${day} WHERE id > ? ORDER BY id LIMIT 256`, [after]);
        if (blocks.length === 0) break;
        const entries: IndexEntry[] = [];
        for (const b of blocks) {
          try {
            for (const e of entriesOfColumns(b.id, b.columns)) entries.push(e);
          } catch {
            this.opts.log?.(`request logs: block ${b.id} of ${day} cannot be decoded; not indexed`);
          }
        }
        after = blocks[blocks.length - 1].id;
        await this.db.tx((tx) => this.insertIndex(tx, day, entries, after));
        indexed += blocks.length;
      }
    }
    if (indexed > 0) this.opts.log?.(`request logs: ${indexed} block(s) written before the last stop indexed`);
  }

  /** The oldest day kept: rows of older days are neither stored nor kept. */
  private oldestKeptDay(): string {
    return dayOf(this.opts.now() - (this.opts.retentionDays - 1) * DAY_MS);
  }

  private async ensureDay(q: Queryable, day: string, added: string[]): Promise<void> {
    if (this.days.has(day)) return;
    added.push(day);
    await q.exec(`CREATE TABLE IF NOT EXISTS logblocks_${day} (
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
    ${sinkSql(day)}`);
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
    const oldest = this.oldestKeptDay();
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
          statements.push({ sql: `INSERT INTO logsink_${day} (id, node_id, min_at, max_at, rows, columns, instance_id, last_seq) VALUES ${part.map(() => '(?, ?, ?, ?, ?, ?, ?, ?)').join(', ')}`, params });
        }
        entries.set(day, dayEntries);
        nextIds.set(day, next);
      }
      // Nothing to store (every row empty or past retention): the cursor moves alone.
      if (statements.length === 0) {
        statements.push({
          sql: `INSERT INTO log_cursors (node_id, instance_id, last_seq) VALUES (?, ?, ?)
            ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq)`,
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
        this.queueIndex(entries);
      });
      return { duplicate: false, written };
    });
  }

  /** A transaction that may create day tables: if it rolls back, the tables it made do not exist. */
  private async inTx<T>(added: string[], work: (tx: Tx, added: string[]) => Promise<T>): Promise<T> {
    try {
      return await this.db.tx((tx) => work(tx, added));
    } catch (err) {
      for (const d of added) this.days.delete(d);
      // Read again next time (what memory holds is committed, but a failure is not the place to trust it).
      this.nextBlock.clear();
      throw err;
    }
  }

  /**
   * One day's blocks: one multi-row INSERT for the blocks (SQLite numbers the rows of one statement
   * one after the other, so the last id gives them all). Returns their key index entries.
   */
  private async insertBlocks(q: Queryable, day: string, nodeId: string, blocks: readonly LogBlock[]): Promise<IndexEntry[]> {
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

  /** Entries of committed blocks wait in memory for the next index write. */
  private queueIndex(byDay: Map<string, IndexEntry[]>): void {
    for (const [day, entries] of byDay) {
      if (entries.length === 0) continue;
      const list = this.pending.get(day);
      // (One push per entry: a report may hold more entries than a call takes arguments.)
      if (list) for (const e of entries) list.push(e);
      else this.pending.set(day, entries);
      this.pendingCount += entries.length;
    }
    if (this.pendingCount >= INDEX_MAX_PENDING) void this.writeIndex();
  }

  /**
   * Writes the waiting key index entries of every day in one transaction, each day's sorted by key
   * (neighbouring keys share pages), and moves the days' cursors past their blocks. On failure they
   * wait for the next try.
   */
  writeIndex(): Promise<void> {
    if (this.indexing) return this.indexing;
    if (this.pendingCount === 0) return Promise.resolve();
    const batch = this.pending;
    this.writing = batch;
    this.pending = new Map();
    this.pendingCount = 0;
    this.indexing = this.db
      .tx(async (tx) => {
        for (const [day, entries] of batch) {
          // A day dropped by retention meanwhile has no table any more.
          if (!this.days.has(day)) continue;
          entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
          let last = 0;
          for (const e of entries) if (e[2] > last) last = e[2];
          await this.insertIndex(tx, day, entries, last);
        }
      })
      .catch((err: Error) => {
        this.opts.log?.(`request logs: key index not written (${err.message}); trying again with the next`);
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

  private async insertIndex(tx: Queryable, day: string, entries: readonly IndexEntry[], lastBlock: number): Promise<void> {
    for (let i = 0; i < entries.length; i += INDEX_CHUNK) await tx.runPrepared(keysInsertSql(day), [JSON.stringify(entries.slice(i, i + INDEX_CHUNK))]);
    await tx.run('INSERT INTO log_index_cursor (day, block) VALUES (?, ?) ON CONFLICT (day) DO UPDATE SET block = MAX(block, excluded.block)', [day, lastBlock]);
  }

  isPageToken(token: string): boolean {
    return PAGE_TOKEN_RE.test(token);
  }

  async query(filter: LogFilter, limit: number, pageToken: string): Promise<LogPage> {
    const oldest = this.oldestKeptDay();
    const until = filter.untilMs ?? this.opts.now() + DAY_MS;
    const since = filter.sinceMs ?? 0;
    let after: { day: string; atMs: number; block: number; i: number } | null = null;
    if (pageToken) {
      const m = PAGE_TOKEN_RE.exec(pageToken);
      if (!m) throw new Error('bad page token');
      after = { day: m[1], atMs: Number(m[2]), block: Number(m[3]), i: Number(m[4]) };
    }
    const rowFilter: LogRowFilter = {
      keyId: filter.unknownKeys ? '' : filter.keyId,
      projectId: filter.projectId,
      orgId: filter.orgId,
      clientIp: filter.clientIp,
      status: filter.status,
      sinceMs: since,
      untilMs: until,
    };
    const days = [...this.days].filter((d) => d >= oldest && dayStartMs(d) < until && dayStartMs(d) + DAY_MS > since).sort().reverse();
    const out: Placed[] = [];
    for (const day of days) {
      if (after && day > after.day) continue;
      const cursor = after && day === after.day ? after : null;
      const want = limit + 1 - out.length;
      out.push(...(await this.queryDay(day, rowFilter, cursor, want)));
      if (out.length > limit) break;
    }
    let next = '';
    if (out.length > limit) {
      const last = out[limit - 1];
      next = `${dayOf(last.atMs)}:${last.atMs}:${last.block}:${last.i}`;
      out.length = limit;
    }
    return { logs: out.map((p) => p.row), next };
  }

  /** Up to `want` rows of one day in page order, after `cursor` when given. */
  private async queryDay(day: string, f: LogRowFilter, cursor: { atMs: number; block: number; i: number } | null, want: number): Promise<Placed[]> {
    const maxAt = cursor ? Math.min(cursor.atMs, f.untilMs! - 1) : f.untilMs! - 1;
    const candidates = await this.candidates(day, f, f.sinceMs!, maxAt);
    const found: Placed[] = [];
    let next = 0;
    while (next < candidates.length) {
      const chunk = candidates.slice(next, next + READ_CHUNK);
      next += chunk.length;
      const blocks = await this.db.all<{ id: number; node_id: string; columns: Buffer }>(
        `SELECT id, node_id, columns FROM logblocks_${day} WHERE id IN (${chunk.map(() => '?').join(',')})`,
        chunk.map((c) => c.block),
      );
      for (const b of blocks) {
        let matched: { i: number; row: LogRow }[];
        try {
          matched = scanLogBlock(b.columns, f);
        } catch {
          this.opts.log?.(`request logs: block ${b.id} of ${day} cannot be decoded; skipped`);
          continue;
        }
        for (const { i, row } of matched) {
          const p = { atMs: row.atMs, block: b.id, i, row: { ...row, nodeId: b.node_id } };
          if (!cursor || before(cursor, p)) found.push(p);
        }
      }
      // Every block not read yet holds rows no newer than its max_at: once `want` rows newer than
      // that are found, the page is complete.
      if (found.length >= want) {
        found.sort(byPageOrder);
        if (next >= candidates.length || found[want - 1].atMs > candidates[next].max_at) break;
      }
    }
    found.sort(byPageOrder);
    return found.slice(0, want);
  }

  /** Blocks of one day that may hold matching rows with at in [sinceMs, maxAt], newest first. */
  private async candidates(day: string, f: LogRowFilter, sinceMs: number, maxAt: number): Promise<Candidate[]> {
    const range = [sinceMs, maxAt];
    let field: 0 | 4 | 5;
    let value: string;
    if (f.keyId !== undefined) [field, value] = [0, f.keyId];
    else if (f.projectId !== undefined) [field, value] = [4, f.projectId];
    else if (f.orgId !== undefined) [field, value] = [5, f.orgId];
    else return this.db.all<Candidate>(`SELECT id AS block, max_at FROM logblocks_${day} WHERE max_at >= ? AND min_at <= ? ORDER BY max_at DESC`, range);
    // The entries still in memory are taken before the table is read: a write that commits in
    // between moves them from one to the other, and each block is then found at least once.
    const found = new Map<number, number>();
    for (const held of [this.writing, this.pending]) {
      for (const e of held?.get(day) ?? []) {
        if (e[field] === value && e[1] >= sinceMs && e[3] <= maxAt) found.set(e[2], Math.max(found.get(e[2]) ?? 0, e[1]));
      }
    }
    // A key has one entry per block; a project or an organisation one per key of theirs in it.
    const stored = await this.db.all<Candidate>(
      field === 0
        ? `SELECT block, max_at FROM logkeys_${day} WHERE key_id = ? AND max_at >= ? AND min_at <= ? ORDER BY max_at DESC`
        : `SELECT block, MAX(max_at) AS max_at FROM logkeys_${day} WHERE ${field === 4 ? 'project_id' : 'org_id'} = ? AND max_at >= ? AND min_at <= ? GROUP BY block ORDER BY max_at DESC`,
      [value, ...range],
    );
    if (found.size === 0) return stored;
    for (const c of stored) found.set(c.block, Math.max(found.get(c.block) ?? 0, c.max_at));
    return [...found].map(([block, max_at]) => ({ block, max_at })).sort((a, b) => b.max_at - a.max_at);
  }

  async applyRetention(): Promise<string[]> {
    const oldest = this.oldestKeptDay();
    const dropped: string[] = [];
    for (const day of [...this.days].sort()) {
      if (day >= oldest) break;
      await this.db.forgetStatements(`_${day}`);
      await this.db.exec(`DROP VIEW IF EXISTS logsink_${day}; DROP TABLE IF EXISTS logblocks_${day}; DROP TABLE IF EXISTS logkeys_${day}; DELETE FROM log_index_cursor WHERE day = '${day}';`);
      this.days.delete(day);
      this.nextBlock.delete(day);
      this.pendingCount -= this.pending.get(day)?.length ?? 0;
      this.pending.delete(day);
      dropped.push(day);
    }
    if (dropped.length > 0) this.opts.log?.(`request logs: dropped ${dropped.length} day partition(s) older than ${this.opts.retentionDays} days (${dropped[0]}..${dropped[dropped.length - 1]})`);
    return dropped;
  }

  /** Statements this store sent to SQLite so far (tests count them: a report's must not grow). */
  get statementsIssued(): number {
    return this.db.statementsIssued;
  }

  /** The day partitions that exist (for tests and operators). */
  partitions(): string[] {
    return [...this.days].sort();
  }

  /** Writes the waiting key index, then closes. */
  async close(): Promise<void> {
    clearInterval(this.indexTimer);
    await this.writeIndex();
    if (this.pendingCount > 0) await this.writeIndex();
    return this.db.close();
  }

  /**
   * A day table of row-per-request logs (earlier versions) becomes blocks, in one transaction, read
   * 20,000 rows at a time so a large table never sits in memory whole.
   */
  private async convertOldDay(day: string): Promise<void> {
    const added: string[] = [];
    let converted = 0;
    await this.inTx(added, async (tx) => {
      const builders = new Map<string, LogBlocksBuilder>();
      const flush = async (node: string, blocks: LogBlocksBuilder) => {
        for (const b of blocks.blocks()) {
          const day = dayOf(b.minAtMs);
          await this.ensureDay(tx, day, added);
          const entries = await this.insertBlocks(tx, day, node, [b]);
          await this.insertIndex(tx, day, entries, entries.reduce((m, e) => Math.max(m, e[2]), 0));
        }
        builders.delete(node);
      };
      let after = 0;
      for (;;) {
        const rows = await tx.all<Record<string, string | number> & { rid: number }>(`SELECT rowid AS rid, * FROM logs_${day} WHERE rowid > ? ORDER BY rowid LIMIT 20000`, [after]);
        if (rows.length === 0) break;
        for (const r of rows) {
          const node = String(r.node_id);
          let blocks = builders.get(node);
          if (!blocks) builders.set(node, (blocks = new LogBlocksBuilder()));
          blocks.add(oldRow(r));
          if (blocks.rows >= 2000) await flush(node, blocks);
        }
        after = rows[rows.length - 1].rid;
        converted += rows.length;
      }
      for (const [node, blocks] of [...builders]) await flush(node, blocks);
      await tx.exec(`DROP TABLE logs_${day}`);
    });
    this.opts.log?.(`request logs: ${converted} rows of ${day} converted to blocks`);
  }
}

function oldRow(r: Record<string, string | number>): LogRow {
  const s = (k: string) => String(r[k] ?? '');
  const n = (k: string) => Number(r[k] ?? 0);
  return {
    requestId: s('request_id'),
    atMs: n('at_ms'),
    keyId: s('key_id'),
    projectId: s('project_id'),
    orgId: s('org_id'),
    clientIp: s('client_ip'),
    userAgent: s('user_agent'),
    method: s('method'),
    path: s('path'),
    status: n('status'),
    latencyUs: n('latency_us'),
    bytesIn: n('bytes_in'),
    bytesOut: n('bytes_out'),
    model: s('model'),
    promptTokens: n('prompt_tokens'),
    completionTokens: n('completion_tokens'),
    costMicros: n('cost_micros'),
    reason: s('reason'),
    keyPrefix: s('key_prefix'),
  };
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
function keysInsertSql(day: string): string {
  let sql = keysSql.get(day);
  if (!sql) {
    sql = `INSERT OR IGNORE INTO logkeys_${day} (key_id, max_at, block, min_at, project_id, org_id, rows)
      SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6 FROM json_each(?)`;
    if (keysSql.size > 1000) keysSql.clear();
    keysSql.set(day, sql);
  }
  return sql;
}
