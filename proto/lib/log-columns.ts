// Request-log rows <-> the LogColumns message of a report (sync.proto): one packed column per field,
// repeated text as indexes into one string table. Pure; shared by the node (encode) and the control
// plane (decode). Every number is made a safe non-negative integer here, so no row can make a report
// unencodable.
import type { RequestLog } from '../gen/tollgate/v1/console.js';
import { LogColumns, type LogBlock, type LogBlockKey } from '../gen/tollgate/v1/sync.js';

/** One request-log entry as a node records it: the console's RequestLog without the node (the
 * control plane knows which node sent it). */
export type LogRow = Omit<RequestLog, 'nodeId'>;

const U32_MAX = 0xffff_ffff;
/** Text fields are cut to this many characters (a user agent or path is no place for a novel). */
export const MAX_TEXT = 256;

/** A safe integer in [0, max]; anything else (NaN, fractions, strings, negatives) becomes a clamp of it. */
export function clampCount(v: unknown, max = Number.MAX_SAFE_INTEGER): number {
  const n = typeof v === 'number' ? v : typeof v === 'bigint' ? Number(v) : NaN;
  if (!Number.isFinite(n)) return n === Infinity ? max : 0;
  if (n <= 0) return 0;
  return Math.min(max, Math.ceil(n));
}

function text(v: unknown): string {
  if (typeof v !== 'string') return '';
  return v.length > MAX_TEXT ? v.slice(0, MAX_TEXT) : v;
}

export function emptyColumns(): LogColumns {
  return LogColumns.create();
}

/** Builds one LogColumns, row by row. */
export class LogColumnsBuilder {
  readonly cols: LogColumns = emptyColumns();
  private readonly index = new Map<string, number>();
  private lastAt = 0;
  /** Per key: its project, organisation, rows and time range (the block's index entries). */
  private readonly keys = new Map<string, LogBlockKey>();
  private minAt = Number.MAX_SAFE_INTEGER;
  private maxAt = 0;

  get rows(): number {
    return this.cols.requestId.length;
  }

  private str(v: unknown): number {
    const s = text(v);
    let i = this.index.get(s);
    if (i === undefined) {
      i = this.cols.strings.length;
      this.cols.strings.push(s);
      this.index.set(s, i);
    }
    return i;
  }

  add(r: LogRow): void {
    const c = this.cols;
    const at = clampCount(r.atMs);
    c.requestId.push(text(r.requestId));
    c.atMsDelta.push(at - this.lastAt);
    this.lastAt = at;
    c.keyId.push(this.str(r.keyId));
    c.projectId.push(this.str(r.projectId));
    c.orgId.push(this.str(r.orgId));
    c.clientIp.push(this.str(r.clientIp));
    c.userAgent.push(this.str(r.userAgent));
    c.method.push(this.str(r.method));
    c.path.push(this.str(r.path));
    c.status.push(clampCount(r.status, 999));
    c.latencyUs.push(clampCount(r.latencyUs, U32_MAX));
    c.bytesIn.push(clampCount(r.bytesIn));
    c.bytesOut.push(clampCount(r.bytesOut));
    c.model.push(this.str(r.model));
    c.promptTokens.push(clampCount(r.promptTokens));
    c.completionTokens.push(clampCount(r.completionTokens));
    c.costMicros.push(clampCount(r.costMicros));
    c.reason.push(this.str(r.reason));
    c.keyPrefix.push(this.str(r.keyPrefix));
    // An optional column exists from the first row that has a value (earlier rows get "").
    for (const f of OPTIONAL_FIELDS) {
      const v = r[f];
      const col = c[f];
      if (!v && col.length === 0) continue;
      if (col.length === 0) {
        const none = this.str('');
        for (let i = 1; i < c.requestId.length; i++) col.push(none);
      }
      col.push(this.str(v ?? ''));
    }
    if (at < this.minAt) this.minAt = at;
    if (at > this.maxAt) this.maxAt = at;
    const keyId = text(r.keyId);
    const k = this.keys.get(keyId);
    if (k) {
      k.rows++;
      if (at < k.minAtMs) k.minAtMs = at;
      if (at > k.maxAtMs) k.maxAtMs = at;
    } else {
      this.keys.set(keyId, { keyId, projectId: text(r.projectId), orgId: text(r.orgId), minAtMs: at, maxAtMs: at, rows: 1 });
    }
  }

  /** The rows as one LogBlock: the encoded columns and their index entries. */
  block(): LogBlock {
    const bytes = LogColumns.encode(this.cols).finish();
    return {
      columns: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength),
      rows: this.rows,
      minAtMs: this.rows > 0 ? this.minAt : 0,
      maxAtMs: this.maxAt,
      keys: [...this.keys.values()],
    };
  }
}

/** ms since epoch → the UTC day, as days since epoch (a LogBlock holds one day's rows). */
export function dayNumber(ms: number): number {
  return Math.floor(ms / 86_400_000);
}

/** Rows queued for one report, one builder per UTC day (a report that spans midnight has two). */
export class LogBlocksBuilder {
  private readonly days = new Map<number, LogColumnsBuilder>();
  rows = 0;

  add(r: LogRow): void {
    const day = dayNumber(clampCount(r.atMs));
    let b = this.days.get(day);
    if (!b) {
      b = new LogColumnsBuilder();
      this.days.set(day, b);
    }
    b.add(r);
    this.rows++;
  }

  blocks(): LogBlock[] {
    return [...this.days.values()].map((b) => b.block());
  }
}

/** What a reader wants of a block's rows; text fields compare exactly, times are [sinceMs, untilMs). */
export interface LogRowFilter {
  keyId?: string;
  projectId?: string;
  orgId?: string;
  clientIp?: string;
  status?: number;
  sinceMs?: number;
  untilMs?: number;
}

/**
 * The rows of a LogColumns that match `filter`, each with its position in the block. Rows are made
 * into objects only when they match; a text filter absent from the block's string table matches
 * nothing without looking at a row. Malformed rows are skipped.
 */
export function matchLogColumns(c: LogColumns, filter: LogRowFilter): { i: number; row: LogRow }[] {
  const s = c.strings;
  const want = (v: string | undefined): number | undefined | null => (v === undefined ? undefined : s.indexOf(v) >= 0 ? s.indexOf(v) : null);
  const key = want(filter.keyId);
  const project = want(filter.projectId);
  const org = want(filter.orgId);
  const ip = want(filter.clientIp);
  const out: { i: number; row: LogRow }[] = [];
  if (key === null || project === null || org === null || ip === null) return out;
  const since = filter.sinceMs ?? -Infinity;
  const until = filter.untilMs ?? Infinity;
  const n = wholeRows(c);
  let at = 0;
  for (let i = 0; i < n; i++) {
    at += c.atMsDelta[i];
    if (
      (key !== undefined && c.keyId[i] !== key) ||
      (project !== undefined && c.projectId[i] !== project) ||
      (org !== undefined && c.orgId[i] !== org) ||
      (ip !== undefined && c.clientIp[i] !== ip) ||
      (filter.status !== undefined && c.status[i] !== filter.status) ||
      at < since ||
      at >= until
    ) {
      continue;
    }
    const row = rowAt(c, i, at);
    if (row) out.push({ i, row });
  }
  return out;
}

/** Text columns that only some rows have (absent from a block where no row has one). */
export type LogOptionalField = 'responseId' | 'deployment' | 'attempts';
export const OPTIONAL_FIELDS: readonly LogOptionalField[] = ['responseId', 'deployment', 'attempts'];

export type LogTextField = 'keyId' | 'projectId' | 'orgId' | 'clientIp' | 'userAgent' | 'method' | 'path' | 'model' | 'reason' | 'keyPrefix';
export type LogNumberField = 'status' | 'latencyUs' | 'bytesIn' | 'bytesOut' | 'promptTokens' | 'completionTokens' | 'costMicros';
const TEXT_FIELDS: readonly LogTextField[] = ['keyId', 'projectId', 'orgId', 'clientIp', 'userAgent', 'method', 'path', 'model', 'reason', 'keyPrefix'];

/**
 * A row from what a reader found in a block: null when a text value is missing (an index past the
 * string table) or the request id is empty. Every number is made a safe integer here.
 */
export function assembleLogRow(
  requestId: string | undefined,
  at: number,
  text: (f: LogTextField) => string | undefined,
  num: (f: LogNumberField) => number | undefined,
  optional: (f: LogOptionalField) => string = () => '',
): LogRow | null {
  if (!requestId) return null;
  const t = {} as Record<LogTextField, string>;
  for (const f of TEXT_FIELDS) {
    const v = text(f);
    if (v === undefined) return null;
    t[f] = v;
  }
  const row: LogRow = {
    requestId,
    atMs: clampCount(at),
    ...t,
    status: clampCount(num('status'), 999),
    latencyUs: clampCount(num('latencyUs')),
    bytesIn: clampCount(num('bytesIn')),
    bytesOut: clampCount(num('bytesOut')),
    promptTokens: clampCount(num('promptTokens')),
    completionTokens: clampCount(num('completionTokens')),
    costMicros: clampCount(num('costMicros')),
  };
  // Only on rows that have one (the Responses API; a pooled model).
  for (const f of OPTIONAL_FIELDS) {
    const v = optional(f);
    if (v) row[f] = v;
  }
  return row;
}

function rowAt(c: LogColumns, i: number, at: number): LogRow | null {
  return assembleLogRow(c.requestId[i], at, (f) => c.strings[c[f][i]], (f) => c[f][i], (f) => c.strings[c[f][i]] ?? '');
}

/**
 * The rows of a LogColumns. A malformed message (columns of different lengths, an index out of the
 * string table) yields the rows that are whole and says how many were not.
 */
/** Rows every column has a value for (a malformed message may have short columns). */
function wholeRows(c: LogColumns): number {
  const cols = [c.atMsDelta, c.keyId, c.projectId, c.orgId, c.clientIp, c.userAgent, c.method, c.path, c.status, c.latencyUs, c.bytesIn, c.bytesOut, c.model, c.promptTokens, c.completionTokens, c.costMicros, c.reason, c.keyPrefix];
  return Math.min(c.requestId.length, ...cols.map((x) => x.length));
}

export function decodeLogColumns(c: LogColumns | undefined): { rows: LogRow[]; malformed: number } {
  if (!c) return { rows: [], malformed: 0 };
  const n = c.requestId.length;
  const whole = wholeRows(c);
  const rows: LogRow[] = [];
  let malformed = n - whole;
  let at = 0;
  for (let i = 0; i < whole; i++) {
    at += c.atMsDelta[i];
    const row = rowAt(c, i, at);
    if (row) rows.push(row);
    else malformed++;
  }
  return { rows, malformed };
}
