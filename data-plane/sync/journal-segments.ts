// The journal's segment files (journal.ts): naming, and the record format, written and read back.
// Format, repeated: u32 length (LE) | u32 crc32 of the payload (LE) | payload. A report's payload is
// an encoded tollgate.v1.Report with its instance_id set; a usage record's length has its top bit set
// and its payload is an encoded tollgate.v1.UsageRecord. A torn or corrupt tail is not read (the
// journal cuts it off at start).
import { closeSync, fstatSync, mkdirSync, openSync, readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';

export const HEADER_BYTES = 8;
/** Set in a record's length: the record is a usage record, not a report. */
export const USAGE_FLAG = 0x8000_0000;
/** Reports bigger than this are refused (a report is at most a few thousand rows). */
export const MAX_ENTRY_BYTES = 64 * 1024 * 1024;

/** One whole record of a segment: where it starts, its kind, and its payload (a view of the segment's bytes). */
export interface SegmentRecord {
  offset: number;
  usage: boolean;
  payload: Buffer;
}

/** The header of a record holding `payload` (flag: USAGE_FLAG for a usage record, else 0). */
export function recordHeader(payload: Buffer, flag: number): Buffer {
  const head = Buffer.allocUnsafe(HEADER_BYTES);
  head.writeUInt32LE((payload.length | flag) >>> 0, 0);
  head.writeUInt32LE(crc32(payload), 4);
  return head;
}

/** The whole records of a segment's bytes, in order, and where they end (before a torn or corrupt tail). */
export function readSegment(data: Buffer): { records: SegmentRecord[]; end: number } {
  const records: SegmentRecord[] = [];
  let off = 0;
  while (off + HEADER_BYTES <= data.length) {
    const word = data.readUInt32LE(off);
    const usage = (word & USAGE_FLAG) !== 0;
    const len = (word & ~USAGE_FLAG) >>> 0;
    const crc = data.readUInt32LE(off + 4);
    if (len > MAX_ENTRY_BYTES || off + HEADER_BYTES + len > data.length) break;
    const payload = data.subarray(off + HEADER_BYTES, off + HEADER_BYTES + len);
    if (crc32(payload) !== crc) break;
    records.push({ offset: off, usage, payload });
    off += HEADER_BYTES + len;
  }
  return { records, end: off };
}

/** The ids of the segment files in `dir`, oldest first. */
export function segmentIds(dir: string): number[] {
  return readdirSync(dir)
    .map((n) => /^seg-(\d{10})\.log$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
}

export function segmentName(id: number): string {
  return `seg-${String(id).padStart(10, '0')}.log`;
}

/**
 * Reads a Report's seq (field 1, varint) and instance_id (field 5, string) without decoding the rest.
 * Returns null for bytes that are not a report with both.
 */
export function peekReport(buf: Buffer): { seq: number; instanceId: string } | null {
  let off = 0;
  let seq = 0;
  let instanceId = '';
  const varint = (): number => {
    let result = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (off >= buf.length) throw new Error('truncated');
      const b = buf[off++];
      result += (b & 0x7f) * mul;
      if ((b & 0x80) === 0) return result;
      mul *= 128;
    }
    throw new Error('varint too long');
  };
  try {
    while (off < buf.length) {
      const tag = varint();
      const field = Math.floor(tag / 8);
      const wire = tag & 7;
      if (wire === 0) {
        const v = varint();
        if (field === 1) seq = v;
      } else if (wire === 2) {
        const len = varint();
        if (field === 5) instanceId = buf.toString('utf8', off, off + len);
        off += len;
      } else if (wire === 1) off += 8;
      else if (wire === 5) off += 4;
      else return null;
    }
  } catch {
    return null;
  }
  return seq > 0 && instanceId ? { seq, instanceId } : null;
}

/** Checks a data directory is usable (created if missing); throws with the reason. */
export function checkDataDir(dir: string): void {
  mkdirSync(dir, { recursive: true });
  const probe = join(dir, '.probe');
  const fd = openSync(probe, 'w');
  fstatSync(fd);
  closeSync(fd);
  unlinkSync(probe);
}
