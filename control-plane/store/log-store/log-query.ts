// Reading request logs, newest first, a page at a time: by key, project or organisation through the
// key index (its entries still in memory included), else by the blocks' times; only the blocks found
// are decoded. A page token names the last row given (day, time, block, position).
import { scanLogBlock } from '../../../proto/lib/log-block-scan.js';
import type { LogRow, LogRowFilter } from '../../../proto/lib/log-columns.js';
import { DAY_MS, dayOf, dayStartMs, type LogDays } from './log-days.js';
import type { LogIndex } from './log-index.js';
import { oldestKeptDay } from './log-retention.js';
import type { LogFilter, LogPage, StoredLog } from './log-store.js';

/** Blocks read per SELECT while a page fills. */
const READ_CHUNK = 16;
/** day:at_ms:block:row of the last row of a page. */
const PAGE_TOKEN_RE = /^(\d{8}):(\d{1,16}):(\d{1,16}):(\d{1,9})$/;

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

export function isPageToken(token: string): boolean {
  return PAGE_TOKEN_RE.test(token);
}

export class LogQuery {
  constructor(
    private readonly days: LogDays,
    private readonly index: LogIndex,
  ) {}

  async query(filter: LogFilter, limit: number, pageToken: string): Promise<LogPage> {
    const oldest = oldestKeptDay(this.days);
    const until = filter.untilMs ?? this.days.opts.now() + DAY_MS;
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
    const days = this.days.sorted().filter((d) => d >= oldest && dayStartMs(d) < until && dayStartMs(d) + DAY_MS > since).reverse();
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
      const blocks = await this.days.db.all<{ id: number; node_id: string; columns: Buffer }>(
        `SELECT id, node_id, columns FROM logblocks_${day} WHERE id IN (${chunk.map(() => '?').join(',')})`,
        chunk.map((c) => c.block),
      );
      for (const b of blocks) {
        let matched: { i: number; row: LogRow }[];
        try {
          matched = scanLogBlock(b.columns, f);
        } catch {
          this.days.opts.log?.(`request logs: block ${b.id} of ${day} cannot be decoded; skipped`);
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
    const { db } = this.days;
    const range = [sinceMs, maxAt];
    let field: 0 | 4 | 5;
    let value: string;
    if (f.keyId !== undefined) [field, value] = [0, f.keyId];
    else if (f.projectId !== undefined) [field, value] = [4, f.projectId];
    else if (f.orgId !== undefined) [field, value] = [5, f.orgId];
    else return db.all<Candidate>(`SELECT id AS block, max_at FROM logblocks_${day} WHERE max_at >= ? AND min_at <= ? ORDER BY max_at DESC`, range);
    // The entries still in memory are taken before the table is read: a write that commits in
    // between moves them from one to the other, and each block is then found at least once.
    const found = new Map<number, number>();
    for (const held of this.index.held(day)) {
      for (const e of held) {
        if (e[field] === value && e[1] >= sinceMs && e[3] <= maxAt) found.set(e[2], Math.max(found.get(e[2]) ?? 0, e[1]));
      }
    }
    // A key has one entry per block; a project or an organisation one per key of theirs in it.
    const stored = await db.all<Candidate>(
      field === 0
        ? `SELECT block, max_at FROM logkeys_${day} WHERE key_id = ? AND max_at >= ? AND min_at <= ? ORDER BY max_at DESC`
        : `SELECT block, MAX(max_at) AS max_at FROM logkeys_${day} WHERE ${field === 4 ? 'project_id' : 'org_id'} = ? AND max_at >= ? AND min_at <= ? GROUP BY block ORDER BY max_at DESC`,
      [value, ...range],
    );
    if (found.size === 0) return stored;
    for (const c of stored) found.set(c.block, Math.max(found.get(c.block) ?? 0, c.max_at));
    return [...found].map(([block, max_at]) => ({ block, max_at })).sort((a, b) => b.max_at - a.max_at);
  }
}
