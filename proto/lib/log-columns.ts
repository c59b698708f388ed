// Request-log rows <-> the LogColumns message of a report (sync.proto): one packed column per field,
// repeated text as indexes into one string table. Pure; shared by the node (encode) and the control
// plane (decode). Every number is made a safe non-negative integer here, so no row can make a report
// unencodable.
import type { LogColumns } from '../gen/tollgate/v1/sync.js';

export interface LogRow {
  requestId: string;
  atMs: number;
  keyId: string;
  projectId: string;
  orgId: string;
  clientIp: string;
  userAgent: string;
  method: string;
  path: string;
  status: number;
  latencyUs: number;
  bytesIn: number;
  bytesOut: number;
  model: string;
  promptTokens: number;
  completionTokens: number;
  costMicros: number;
  /** Why it was refused ('' when it was not). */
  reason: string;
  /** Unknown-key 401s only: the first characters of the presented value. */
  keyPrefix: string;
}

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
  return {
    strings: [],
    requestId: [],
    atMsDelta: [],
    keyId: [],
    projectId: [],
    orgId: [],
    clientIp: [],
    userAgent: [],
    method: [],
    path: [],
    status: [],
    latencyUs: [],
    bytesIn: [],
    bytesOut: [],
    model: [],
    promptTokens: [],
    completionTokens: [],
    costMicros: [],
    reason: [],
    keyPrefix: [],
  };
}

/** Builds one LogColumns, row by row. */
export class LogColumnsBuilder {
  readonly cols: LogColumns = emptyColumns();
  private readonly index = new Map<string, number>();
  private lastAt = 0;

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
  }
}

/**
 * The rows of a LogColumns. A malformed message (columns of different lengths, an index out of the
 * string table) yields the rows that are whole and says how many were not.
 */
export function decodeLogColumns(c: LogColumns | undefined): { rows: LogRow[]; malformed: number } {
  if (!c) return { rows: [], malformed: 0 };
  const n = c.requestId.length;
  const cols = [c.atMsDelta, c.keyId, c.projectId, c.orgId, c.clientIp, c.userAgent, c.method, c.path, c.status, c.latencyUs, c.bytesIn, c.bytesOut, c.model, c.promptTokens, c.completionTokens, c.costMicros, c.reason, c.keyPrefix];
  const whole = Math.min(n, ...cols.map((x) => x.length));
  const s = c.strings;
  const str = (i: number): string | undefined => s[i];
  const rows: LogRow[] = [];
  let malformed = n - whole;
  let at = 0;
  for (let i = 0; i < whole; i++) {
    at += c.atMsDelta[i];
    const keyId = str(c.keyId[i]);
    const projectId = str(c.projectId[i]);
    const orgId = str(c.orgId[i]);
    const clientIp = str(c.clientIp[i]);
    const userAgent = str(c.userAgent[i]);
    const method = str(c.method[i]);
    const path = str(c.path[i]);
    const model = str(c.model[i]);
    const reason = str(c.reason[i]);
    const keyPrefix = str(c.keyPrefix[i]);
    if (
      keyId === undefined || projectId === undefined || orgId === undefined || clientIp === undefined || userAgent === undefined ||
      method === undefined || path === undefined || model === undefined || reason === undefined || keyPrefix === undefined || !c.requestId[i]
    ) {
      malformed++;
      continue;
    }
    rows.push({
      requestId: c.requestId[i],
      atMs: clampCount(at),
      keyId,
      projectId,
      orgId,
      clientIp,
      userAgent,
      method,
      path,
      status: clampCount(c.status[i], 999),
      latencyUs: clampCount(c.latencyUs[i]),
      bytesIn: clampCount(c.bytesIn[i]),
      bytesOut: clampCount(c.bytesOut[i]),
      model,
      promptTokens: clampCount(c.promptTokens[i]),
      completionTokens: clampCount(c.completionTokens[i]),
      costMicros: clampCount(c.costMicros[i]),
      reason,
      keyPrefix,
    });
  }
  return { rows, malformed };
}
