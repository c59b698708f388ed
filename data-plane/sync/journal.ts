// The node's report journal: every report (a batch of usage, last_used_at and request logs) is
// appended here before it is sent, and forgotten once the control plane acknowledged it. With a data
// directory the journal is a set of append-only segment files (fsync once per flush, not per batch);
// a node killed with SIGKILL finds its unacknowledged reports there on restart and sends them again
// (the control plane deduplicates by node, instance and seq). Memory holds only an index entry per
// unacknowledged report and the newest few reports' bytes, so an outage of any length costs disk,
// not memory. Without a data directory the journal lives in memory, bounded by the same cap.
//
// Segment file format, repeated: u32 length (LE) | u32 crc32 of the payload (LE) | payload (an
// encoded tollgate.v1.Report with its instance_id set). A torn or corrupt tail is cut off at start.
import { closeSync, existsSync, fstatSync, mkdirSync, openSync, readdirSync, readFileSync, ftruncateSync, unlinkSync } from 'node:fs';
import { open, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';

const HEADER_BYTES = 8;
/** A segment is closed and a new one started past this size. */
const SEGMENT_BYTES = 4 * 1024 * 1024;
/** Reports bigger than this are refused (a report is at most a few thousand rows). */
const MAX_ENTRY_BYTES = 64 * 1024 * 1024;
/** The newest reports' bytes are kept in memory up to this much, so sending them reads no disk. */
const MEMORY_CACHE_BYTES = 8 * 1024 * 1024;

export interface JournalEntry {
  instanceId: string;
  seq: number;
  bytes: number;
  /** The payload, while cached in memory (always, for a journal without a directory). */
  payload: Buffer | null;
  segment: number;
  offset: number;
  /** Written to the file and fsynced. */
  durable: boolean;
}

interface Segment {
  id: number;
  path: string;
  size: number;
  unacked: number;
}

export interface JournalOptions {
  /** The folder for segment files; null keeps the journal in memory. */
  dir: string | null;
  /** Unacknowledged bytes beyond which `overCap` is true. */
  maxBytes: number;
  log(line: string): void;
}

export class Journal {
  /** Unacknowledged entries, oldest first. */
  private readonly entries: JournalEntry[] = [];
  private readonly byId = new Map<string, JournalEntry>();
  private readonly segments = new Map<number, Segment>();
  private current: Segment | null = null;
  private handle: FileHandle | null = null;
  private unackedBytes = 0;
  private cachedBytes = 0;
  /** Appended entries waiting for the next write + fsync. */
  private pending: JournalEntry[] = [];
  private writing: Promise<void> | null = null;
  private failedLogged = false;
  private closed = false;

  constructor(private readonly opts: JournalOptions) {
    if (opts.dir) {
      mkdirSync(opts.dir, { recursive: true });
      this.load(opts.dir);
    }
  }

  /** Unacknowledged reports and their bytes (what an outage has piled up). */
  get depth(): { batches: number; bytes: number } {
    return { batches: this.entries.length, bytes: this.unackedBytes };
  }

  get maxBytes(): number {
    return this.opts.maxBytes;
  }

  get overCap(): boolean {
    return this.unackedBytes >= this.opts.maxBytes;
  }

  /** The unacknowledged entries, oldest first (the caller must not change them). */
  get unacked(): readonly JournalEntry[] {
    return this.entries;
  }

  /** Adds a report; it is written to disk at the next `sync()` (the caller sends it meanwhile). */
  append(instanceId: string, seq: number, payload: Buffer): JournalEntry {
    if (payload.length > MAX_ENTRY_BYTES) throw new Error(`report ${seq} is ${payload.length} bytes, over the journal's ${MAX_ENTRY_BYTES}`);
    const e: JournalEntry = { instanceId, seq, bytes: payload.length, payload, segment: -1, offset: -1, durable: this.opts.dir === null };
    this.entries.push(e);
    this.byId.set(idOf(instanceId, seq), e);
    this.unackedBytes += payload.length;
    this.cachedBytes += payload.length;
    if (this.opts.dir) this.pending.push(e);
    this.evict();
    return e;
  }

  /** Forgets an acknowledged report; a segment whose reports are all acknowledged is deleted. */
  ack(instanceId: string, seq: number): boolean {
    const id = idOf(instanceId, seq);
    const e = this.byId.get(id);
    if (!e) return false;
    this.byId.delete(id);
    const i = this.entries.indexOf(e);
    if (i >= 0) this.entries.splice(i, 1);
    this.unackedBytes -= e.bytes;
    if (e.payload) this.cachedBytes -= e.bytes;
    e.payload = null;
    const seg = this.segments.get(e.segment);
    if (seg) {
      seg.unacked--;
      this.maybeDelete(seg);
    } else {
      // Acknowledged before it reached the disk: the write skips it.
      e.segment = -2;
    }
    return true;
  }

  /** The bytes of an unacknowledged entry, from memory or its segment. */
  async read(e: JournalEntry): Promise<Buffer> {
    if (e.payload) return e.payload;
    const seg = this.segments.get(e.segment);
    if (!seg) throw new Error(`report ${e.seq} is in no segment`);
    const fh = await open(seg.path, 'r');
    try {
      const buf = Buffer.allocUnsafe(e.bytes);
      await fh.read(buf, 0, e.bytes, e.offset + HEADER_BYTES);
      return buf;
    } finally {
      await fh.close();
    }
  }

  /** Writes every appended entry and fsyncs once. Calls do not overlap; a call during a write waits for it and writes what came since. */
  sync(): Promise<void> {
    if (!this.opts.dir) return Promise.resolve();
    const run = async (): Promise<void> => {
      while (this.pending.length > 0 && !this.closed) {
        const batch = this.pending;
        this.pending = [];
        try {
          await this.writeBatch(batch);
          this.failedLogged = false;
        } catch (err) {
          // Kept in memory (and counted) until the disk takes them; said once per episode.
          if (!this.failedLogged) {
            this.failedLogged = true;
            this.opts.log(`journal: write to ${this.opts.dir} failed (${(err as Error).message}); unacknowledged reports stay in memory until it works again`);
          }
          this.pending = batch.filter((e) => e.segment !== -2).concat(this.pending);
          return;
        }
      }
    };
    const prev = this.writing ?? Promise.resolve();
    const next = prev.then(run);
    this.writing = next.finally(() => {
      if (this.writing === next) this.writing = null;
    });
    return next;
  }

  async close(): Promise<void> {
    await this.sync().catch(() => undefined);
    this.closed = true;
    await this.handle?.close().catch(() => undefined);
    this.handle = null;
  }

  private async writeBatch(batch: JournalEntry[]): Promise<void> {
    const live = batch.filter((e) => e.segment !== -2 && e.payload);
    if (live.length === 0) return;
    let seg = await this.segmentFor();
    const chunks: Buffer[] = [];
    const placed: JournalEntry[] = [];
    for (const e of live) {
      // Acknowledged while an earlier part of this batch was written: nothing to keep.
      if (!e.payload || e.segment === -2) continue;
      if (seg.size >= SEGMENT_BYTES && chunks.length > 0) {
        await this.flushChunks(chunks, placed);
        chunks.length = 0;
        placed.length = 0;
      }
      if (seg.size >= SEGMENT_BYTES) seg = await this.rotate();
      const head = Buffer.allocUnsafe(HEADER_BYTES);
      head.writeUInt32LE(e.bytes, 0);
      head.writeUInt32LE(crc32(e.payload!), 4);
      e.segment = seg.id;
      e.offset = seg.size;
      seg.size += HEADER_BYTES + e.bytes;
      seg.unacked++;
      chunks.push(head, e.payload!);
      placed.push(e);
    }
    await this.flushChunks(chunks, placed);
  }

  private async flushChunks(chunks: Buffer[], placed: JournalEntry[]): Promise<void> {
    if (chunks.length === 0) return;
    await this.handle!.writev(chunks);
    await this.handle!.datasync();
    for (const e of placed) e.durable = true;
    this.evict();
    for (const seg of [...this.segments.values()]) this.maybeDelete(seg);
  }

  private async segmentFor(): Promise<Segment> {
    if (this.current && this.handle) return this.current;
    return this.rotate();
  }

  private async rotate(): Promise<Segment> {
    const prev = this.current;
    if (this.handle) await this.handle.close();
    this.handle = null;
    const id = Math.max(0, ...this.segments.keys()) + 1;
    const path = join(this.opts.dir!, segmentName(id));
    this.handle = await open(path, 'a');
    const seg: Segment = { id, path, size: 0, unacked: 0 };
    this.segments.set(id, seg);
    this.current = seg;
    if (prev) this.maybeDelete(prev);
    return seg;
  }

  private maybeDelete(seg: Segment): void {
    if (seg === this.current || seg.unacked > 0) return;
    this.segments.delete(seg.id);
    unlink(seg.path).catch(() => undefined);
  }

  /** Drops cached payloads of durable entries, oldest first, past the memory budget. */
  private evict(): void {
    if (!this.opts.dir) return;
    for (const e of this.entries) {
      if (this.cachedBytes <= MEMORY_CACHE_BYTES) return;
      if (e.payload && e.durable) {
        e.payload = null;
        this.cachedBytes -= e.bytes;
      }
    }
  }

  /** Reads the segments a previous process left: every whole record becomes an unacknowledged entry. */
  private load(dir: string): void {
    const ids = readdirSync(dir)
      .map((n) => /^seg-(\d{10})\.log$/.exec(n))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => Number(m[1]))
      .sort((a, b) => a - b);
    let found = 0;
    for (const id of ids) {
      const path = join(dir, segmentName(id));
      const data = readFileSync(path);
      const seg: Segment = { id, path, size: 0, unacked: 0 };
      let off = 0;
      while (off + HEADER_BYTES <= data.length) {
        const len = data.readUInt32LE(off);
        const crc = data.readUInt32LE(off + 4);
        if (len > MAX_ENTRY_BYTES || off + HEADER_BYTES + len > data.length) break;
        const payload = data.subarray(off + HEADER_BYTES, off + HEADER_BYTES + len);
        if (crc32(payload) !== crc) break;
        const head = peekReport(payload);
        if (head && !this.byId.has(idOf(head.instanceId, head.seq))) {
          const e: JournalEntry = { instanceId: head.instanceId, seq: head.seq, bytes: len, payload: null, segment: id, offset: off, durable: true };
          this.entries.push(e);
          this.byId.set(idOf(e.instanceId, e.seq), e);
          this.unackedBytes += len;
          seg.unacked++;
          found++;
        }
        off += HEADER_BYTES + len;
      }
      if (off < data.length) {
        // A record cut short by a crash (or damaged): everything from it on is dropped.
        this.opts.log(`journal: ${segmentName(id)} ends with ${data.length - off} unreadable bytes (a write cut short); cut off`);
        const fd = openSync(path, 'r+');
        try {
          ftruncateSync(fd, off);
        } finally {
          closeSync(fd);
        }
      }
      seg.size = off;
      if (seg.unacked === 0) {
        if (existsSync(path)) unlinkSync(path);
      } else this.segments.set(id, seg);
    }
    if (found > 0) this.opts.log(`journal: ${found} unacknowledged reports (${this.unackedBytes} bytes) found in ${dir}; sending them again`);
  }
}

function idOf(instanceId: string, seq: number): string {
  return `${instanceId}#${seq}`;
}

function segmentName(id: number): string {
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
