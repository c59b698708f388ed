// Reads the rows of an encoded LogColumns (a stored log block) that match a filter, without decoding
// the whole message: one pass records where each string and each packed column lies, the filter's
// text values are found in the string table by comparing bytes, then every row's numbers are read in
// step from the packed columns and a row becomes an object only when it matches. A query touching
// hundreds of blocks spends its time on the rows it returns, not on the blocks' other rows. A
// message this reader does not expect (a column split in two, an unpacked column, a truncated
// field) is read by the generated decoder instead, so the answer is the same either way.
import { LogColumns } from '../gen/tollgate/v1/sync.js';
import { assembleLogRow, matchLogColumns, OPTIONAL_FIELDS, type LogNumberField, type LogOptionalField, type LogRow, type LogRowFilter, type LogTextField } from './log-columns.js';

/** Field numbers of LogColumns (sync.proto). */
const F_STRINGS = 1;
const F_REQUEST_ID = 2;
const F_AT_DELTA = 3;
/** Optional columns (indexes into the strings, like the text columns), in OPTIONAL_FIELDS order: may be absent or short. */
const F_OPTIONAL: Readonly<Record<LogOptionalField, number>> = { responseId: 800, deployment: 340, attempts: 341 };
const OPTIONAL_SLOT = new Map<number, number>(OPTIONAL_FIELDS.map((f, k) => [F_OPTIONAL[f], k]));
/** Packed numeric columns, fields 3..20, in field order. */
const FIRST_PACKED = 3;
const LAST_PACKED = 20;
const PACKED = LAST_PACKED - FIRST_PACKED + 1;
// Column slots (field number - FIRST_PACKED).
const C_AT = F_AT_DELTA - FIRST_PACKED;
const C_KEY = 4 - FIRST_PACKED;
const C_PROJECT = 5 - FIRST_PACKED;
const C_ORG = 6 - FIRST_PACKED;
const C_IP = 7 - FIRST_PACKED;
const C_UA = 8 - FIRST_PACKED;
const C_METHOD = 9 - FIRST_PACKED;
const C_PATH = 10 - FIRST_PACKED;
const C_STATUS = 11 - FIRST_PACKED;
const C_LATENCY = 12 - FIRST_PACKED;
const C_BYTES_IN = 13 - FIRST_PACKED;
const C_BYTES_OUT = 14 - FIRST_PACKED;
const C_MODEL = 15 - FIRST_PACKED;
const C_PROMPT = 16 - FIRST_PACKED;
const C_COMPLETION = 17 - FIRST_PACKED;
const C_COST = 18 - FIRST_PACKED;
const C_REASON = 19 - FIRST_PACKED;
const C_PREFIX = 20 - FIRST_PACKED;

const TEXT_SLOT: Record<LogTextField, number> = {
  keyId: C_KEY,
  projectId: C_PROJECT,
  orgId: C_ORG,
  clientIp: C_IP,
  userAgent: C_UA,
  method: C_METHOD,
  path: C_PATH,
  model: C_MODEL,
  reason: C_REASON,
  keyPrefix: C_PREFIX,
};
const NUMBER_SLOT: Record<LogNumberField, number> = {
  status: C_STATUS,
  latencyUs: C_LATENCY,
  bytesIn: C_BYTES_IN,
  bytesOut: C_BYTES_OUT,
  promptTokens: C_PROMPT,
  completionTokens: C_COMPLETION,
  costMicros: C_COST,
};

class Unexpected extends Error {}

/** A varint at `pos`; numbers past 2^53 lose precision (they are clamped later anyway). */
function varint(buf: Uint8Array, pos: { p: number }, end: number): number {
  let result = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (pos.p >= end) throw new Unexpected('truncated varint');
    const b = buf[pos.p++];
    result += (b & 0x7f) * scale;
    if (b < 0x80) return result;
    scale *= 128;
  }
  throw new Unexpected('varint too long');
}

interface Layout {
  /** Start and end of each string-table entry. */
  strings: number[];
  /** Start and end of each request id. */
  requestIds: number[];
  /** Start and end of each packed column (-1 when absent). */
  colStart: Int32Array;
  colEnd: Int32Array;
  /** Start and end of each optional column, in OPTIONAL_FIELDS order (-1 when absent). */
  optStart: number[];
  optEnd: number[];
}

function layout(buf: Uint8Array): Layout {
  const strings: number[] = [];
  const requestIds: number[] = [];
  const colStart = new Int32Array(PACKED).fill(-1);
  const colEnd = new Int32Array(PACKED).fill(-1);
  const optStart = OPTIONAL_FIELDS.map(() => -1);
  const optEnd = OPTIONAL_FIELDS.map(() => -1);
  const pos = { p: 0 };
  const end = buf.length;
  while (pos.p < end) {
    const tag = varint(buf, pos, end);
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (wire !== 2) throw new Unexpected(`field ${field} with wire type ${wire}`);
    const len = varint(buf, pos, end);
    const start = pos.p;
    const stop = start + len;
    if (stop > end) throw new Unexpected('truncated field');
    if (field === F_STRINGS) strings.push(start, stop);
    else if (field === F_REQUEST_ID) requestIds.push(start, stop);
    else if (field >= FIRST_PACKED && field <= LAST_PACKED) {
      const c = field - FIRST_PACKED;
      if (colStart[c] !== -1) throw new Unexpected(`column ${field} in two parts`);
      colStart[c] = start;
      colEnd[c] = stop;
    } else if (OPTIONAL_SLOT.has(field)) {
      const k = OPTIONAL_SLOT.get(field)!;
      if (optStart[k] !== -1) throw new Unexpected(`column ${field} in two parts`);
      optStart[k] = start;
      optEnd[k] = stop;
    }
    // Unknown fields (a newer node) are skipped.
    pos.p = stop;
  }
  return { strings, requestIds, colStart, colEnd, optStart, optEnd };
}

const decoder = new TextDecoder();

function indexOfString(buf: Uint8Array, l: Layout, value: string | undefined): number | undefined | null {
  if (value === undefined) return undefined;
  const want = Buffer.from(value, 'utf8');
  for (let i = 0; i < l.strings.length; i += 2) {
    const s = l.strings[i];
    const e = l.strings[i + 1];
    if (e - s !== want.length) continue;
    let same = true;
    for (let j = 0; j < want.length; j++) {
      if (buf[s + j] !== want[j]) {
        same = false;
        break;
      }
    }
    if (same) return i / 2;
  }
  return null;
}

/** The rows of an encoded LogColumns that match `filter`, each with its position in the block. */
export function scanLogBlock(bytes: Uint8Array, filter: LogRowFilter): { i: number; row: LogRow }[] {
  try {
    return scan(bytes, filter);
  } catch (err) {
    if (!(err instanceof Unexpected)) throw err;
    return matchLogColumns(LogColumns.decode(bytes), filter);
  }
}

function scan(buf: Uint8Array, filter: LogRowFilter): { i: number; row: LogRow }[] {
  const l = layout(buf);
  const out: { i: number; row: LogRow }[] = [];
  const key = indexOfString(buf, l, filter.keyId);
  const project = indexOfString(buf, l, filter.projectId);
  const org = indexOfString(buf, l, filter.orgId);
  const ip = indexOfString(buf, l, filter.clientIp);
  if (key === null || project === null || org === null || ip === null) return out;
  const since = filter.sinceMs ?? -Infinity;
  const until = filter.untilMs ?? Infinity;
  const rows = l.requestIds.length / 2;
  const pos = Array.from({ length: PACKED }, (_, c) => ({ p: l.colStart[c] }));
  const v = new Float64Array(PACKED);
  const nStrings = l.strings.length / 2;
  const str = (i: number): string | undefined => (i < nStrings ? decoder.decode(buf.subarray(l.strings[2 * i], l.strings[2 * i + 1])) : undefined);
  const optPos = l.optStart.map((p) => ({ p }));
  const optIndex = OPTIONAL_FIELDS.map(() => -1);
  let at = 0;
  for (let i = 0; i < rows; i++) {
    // The optional columns: read in step with the rows while each lasts.
    for (let k = 0; k < optIndex.length; k++) optIndex[k] = l.optStart[k] !== -1 && optPos[k].p < l.optEnd[k] ? varint(buf, optPos[k], l.optEnd[k]) : -1;
    // Every column's next value; a column that ended early ends the whole rows there.
    for (let c = 0; c < PACKED; c++) {
      if (l.colStart[c] === -1 || pos[c].p >= l.colEnd[c]) return out;
      v[c] = varint(buf, pos[c], l.colEnd[c]);
    }
    const z = v[C_AT];
    at += z % 2 === 0 ? z / 2 : -(z + 1) / 2;
    if (
      (key !== undefined && v[C_KEY] !== key) ||
      (project !== undefined && v[C_PROJECT] !== project) ||
      (org !== undefined && v[C_ORG] !== org) ||
      (ip !== undefined && v[C_IP] !== ip) ||
      (filter.status !== undefined && v[C_STATUS] !== filter.status) ||
      at < since ||
      at >= until
    ) {
      continue;
    }
    const row = assembleLogRow(
      decoder.decode(buf.subarray(l.requestIds[2 * i], l.requestIds[2 * i + 1])),
      at,
      (f) => str(v[TEXT_SLOT[f]]),
      (f) => v[NUMBER_SLOT[f]],
      (f) => {
        const k = OPTIONAL_FIELDS.indexOf(f);
        return optIndex[k] === -1 ? '' : (str(optIndex[k]) ?? '');
      },
    );
    if (row) out.push({ i, row });
  }
  return out;
}
