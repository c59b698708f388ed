// The node's report journal: every report (a batch of usage, last_used_at and request logs) is
// appended here before it is sent, and forgotten once the control plane acknowledged it. With a data
// directory the journal is a set of append-only segment files; a node killed with SIGKILL finds its
// unacknowledged reports there on restart and sends them again (the control plane deduplicates by
// node, instance and seq). Memory holds only an index entry per unacknowledged report and the newest
// few reports' bytes, so an outage of any length costs disk, not memory. Without a data directory
// the journal lives in memory, bounded by the same cap.
//
// What a kill can lose (docs/billing-endings.md): nothing answered. Each usage record is written to
// the current segment (`writeUsage`, a write(2) into the page cache, no fsync) when the request
// completes, before its answer's last byte goes out; a report is written the same way when it is
// sealed, and it covers every usage record before it in its segment. A restarted node seals the
// records after the last report of its last segment into a report of its own. fsync runs once per
// flush (every 250 ms) and at each segment's end: a machine that loses power can lose what was
// written since the last fsync, at most one flush interval of usage; a killed process loses nothing.
// Segments roll over only right after a report, so every closed segment ends with one. The segment
// files' format, and reading them back, is journal-segments.ts.
import { closeSync, existsSync, fdatasync, fdatasyncSync, mkdirSync, openSync, readFileSync, ftruncateSync, unlinkSync, writevSync } from 'node:fs';
import { open, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { HEADER_BYTES, MAX_ENTRY_BYTES, peekReport, readSegment, recordHeader, segmentIds, segmentName, USAGE_FLAG } from './journal-segments.js';

/** A segment is closed and a new one started past this size. */
const SEGMENT_BYTES = 4 * 1024 * 1024;
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
  /** Usage records written after the segment's last report (not yet covered by one). */
  trailingUsage: number;
}

export interface JournalOptions {
  /** The folder for segment files; null keeps the journal in memory. */
  dir: string | null;
  /** Unacknowledged bytes beyond which `overCap` is true. */
  maxBytes: number;
  log(line: string): void;
}

export class Journal {
  /** Unacknowledged entries by id, oldest first (a Map keeps insertion order and deletes in O(1)). */
  private readonly byId = new Map<string, JournalEntry>();
  private readonly segments = new Map<number, Segment>();
  private current: Segment | null = null;
  /** The current segment's file, opened for appending. */
  private fd: number | null = null;
  private unackedBytes = 0;
  private cachedBytes = 0;
  /** Appended entries whose write failed, retried at the next `sync()`. */
  private pending: JournalEntry[] = [];
  /** Segments being deleted (maybeDelete), awaited by close(). */
  private readonly unlinking = new Set<Promise<void>>();
  /** Written entries waiting for the next fsync. */
  private unsynced: JournalEntry[] = [];
  private syncing: Promise<void> | null = null;
  private failedLogged = false;
  private usageFailedLogged = false;
  private closed = false;
  /** Usage records a previous process wrote after its last report: theirs to bill (takeOrphanUsage). */
  private orphans: Buffer[] = [];
  /**
   * Entries looked at by `waiting()` and the lookups: the journal's work, counted so a test can see it
   * grows with the reports, not with their square.
   */
  entriesVisited = 0;

  constructor(private readonly opts: JournalOptions) {
    if (opts.dir) {
      mkdirSync(opts.dir, { recursive: true });
      this.load(opts.dir);
    }
  }

  /** Unacknowledged reports and their bytes (what an outage has piled up). */
  get depth(): { batches: number; bytes: number } {
    return { batches: this.byId.size, bytes: this.unackedBytes };
  }

  /** Whether usage records are written to disk as they come (a journal with a directory). */
  get writesUsage(): boolean {
    return this.opts.dir !== null && !this.closed;
  }

  get maxBytes(): number {
    return this.opts.maxBytes;
  }

  get overCap(): boolean {
    return this.unackedBytes >= this.opts.maxBytes;
  }

  /** The unacknowledged entries, oldest first, as a new array (O(n): for tests and diagnosis). */
  get unacked(): readonly JournalEntry[] {
    return [...this.byId.values()];
  }

  /** An unacknowledged entry, or undefined. O(1). */
  find(instanceId: string, seq: number): JournalEntry | undefined {
    this.entriesVisited++;
    return this.byId.get(idOf(instanceId, seq));
  }

  /** Whether an entry is still unacknowledged. O(1). */
  isUnacked(e: JournalEntry): boolean {
    this.entriesVisited++;
    return this.byId.get(idOf(e.instanceId, e.seq)) === e;
  }

  /**
   * The unacknowledged entries, oldest first, lazily: a caller that stops after a few has looked at
   * only those (plus the ones it skipped).
   */
  *waiting(): Generator<JournalEntry> {
    for (const e of this.byId.values()) {
      this.entriesVisited++;
      yield e;
    }
  }

  /** Adds a report and writes it to the current segment at once (no fsync: `sync()` does that). */
  append(instanceId: string, seq: number, payload: Buffer): JournalEntry {
    if (payload.length > MAX_ENTRY_BYTES) throw new Error(`report ${seq} is ${payload.length} bytes, over the journal's ${MAX_ENTRY_BYTES}`);
    const e: JournalEntry = { instanceId, seq, bytes: payload.length, payload, segment: -1, offset: -1, durable: this.opts.dir === null };
    this.byId.set(idOf(instanceId, seq), e);
    this.unackedBytes += payload.length;
    this.cachedBytes += payload.length;
    if (this.opts.dir && !this.closed) {
      if (this.pending.length > 0 || !this.writeReport(e)) this.pending.push(e);
    }
    this.evict();
    return e;
  }

  /**
   * Writes one usage record (an encoded UsageRecord) to the current segment now, before the request's
   * answer ends: a killed process loses nothing it answered. A write(2), not an fsync. Without a
   * directory, or when the disk refuses, it is only in memory (said once per episode).
   */
  writeUsage(payload: Buffer): void {
    if (!this.opts.dir || this.closed) return;
    try {
      const seg = this.segmentNow();
      this.writeRecord(seg, payload, USAGE_FLAG);
      seg.trailingUsage++;
      this.usageFailedLogged = false;
    } catch (err) {
      if (!this.usageFailedLogged) {
        this.usageFailedLogged = true;
        this.opts.log(`journal: writing usage to ${this.opts.dir} failed (${(err as Error).message}); usage is kept in memory until the next report`);
      }
    }
  }

  /** The usage records a killed process left after its last report (each an encoded UsageRecord); taken once. */
  takeOrphanUsage(): Buffer[] {
    const o = this.orphans;
    this.orphans = [];
    return o;
  }

  /** Forgets an acknowledged report; a segment whose reports are all acknowledged is deleted. */
  ack(instanceId: string, seq: number): boolean {
    const id = idOf(instanceId, seq);
    const e = this.byId.get(id);
    this.entriesVisited++;
    if (!e) return false;
    this.byId.delete(id);
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

  /**
   * Writes what a failed write left pending, then fsyncs the current segment once (off the event
   * loop). Calls do not overlap; a call during an fsync waits for it and then runs again.
   */
  sync(): Promise<void> {
    if (!this.opts.dir) return Promise.resolve();
    const run = async (): Promise<void> => {
      if (this.closed) return;
      if (this.pending.length > 0) {
        const batch = this.pending;
        this.pending = [];
        for (let i = 0; i < batch.length; i++) {
          const e = batch[i];
          // Acknowledged while waiting: nothing to keep.
          if (e.segment === -2 || !e.payload) continue;
          if (!this.writeReport(e)) {
            this.pending = batch.slice(i).filter((x) => x.segment !== -2).concat(this.pending);
            return;
          }
        }
      }
      const fd = this.fd;
      const written = this.unsynced;
      this.unsynced = [];
      if (fd === null || written.length === 0) return;
      await new Promise<void>((resolve) => fdatasync(fd, () => resolve()));
      for (const e of written) e.durable = true;
      this.evict();
    };
    const prev = this.syncing ?? Promise.resolve();
    const next = prev.then(run);
    this.syncing = next.finally(() => {
      if (this.syncing === next) this.syncing = null;
    });
    return next;
  }

  async close(): Promise<void> {
    await this.sync().catch(() => undefined);
    this.closed = true;
    await Promise.all(this.unlinking);
    if (this.fd !== null) {
      try {
        fdatasyncSync(this.fd);
        closeSync(this.fd);
      } catch {
        // closing anyway
      }
      this.fd = null;
    }
    // A last segment with nothing left to send (and no usage after its last report) is not kept.
    const cur = this.current;
    this.current = null;
    if (cur && cur.unacked === 0 && cur.trailingUsage === 0) {
      this.segments.delete(cur.id);
      try {
        unlinkSync(cur.path);
      } catch {
        // gone already
      }
    }
  }

  /** Writes a report record now; false (and said once per episode) when the disk refuses it. */
  private writeReport(e: JournalEntry): boolean {
    try {
      const seg = this.segmentNow();
      e.offset = this.writeRecord(seg, e.payload!, 0);
      e.segment = seg.id;
      seg.unacked++;
      // The report covers the usage records before it in its segment.
      seg.trailingUsage = 0;
      this.unsynced.push(e);
      this.failedLogged = false;
      // Segments roll over only right after a report: each closed one ends with one.
      if (seg.size >= SEGMENT_BYTES) this.rotate();
      return true;
    } catch (err) {
      if (!this.failedLogged) {
        this.failedLogged = true;
        this.opts.log(`journal: write to ${this.opts.dir} failed (${(err as Error).message}); unacknowledged reports stay in memory until it works again`);
      }
      return false;
    }
  }

  /** Writes one record at the segment's end; returns its offset. A partial write is cut back off. */
  private writeRecord(seg: Segment, payload: Buffer, flag: number): number {
    const head = recordHeader(payload, flag);
    const offset = seg.size;
    try {
      const n = writevSync(this.fd!, [head, payload]);
      if (n !== HEADER_BYTES + payload.length) throw new Error(`short write (${n} of ${HEADER_BYTES + payload.length} bytes)`);
    } catch (err) {
      // Never leave a torn record in the middle of a segment: what follows would be unreadable.
      try {
        ftruncateSync(this.fd!, offset);
      } catch {
        // the next load cuts it off
      }
      throw err;
    }
    seg.size += HEADER_BYTES + payload.length;
    return offset;
  }

  /** The current segment, opened (or started) if need be. */
  private segmentNow(): Segment {
    if (this.current && this.fd !== null) return this.current;
    return this.rotate();
  }

  /** Closes the current segment (fsynced) and starts the next. */
  private rotate(): Segment {
    const prev = this.current;
    if (this.fd !== null) {
      // The closed segment is fsynced off the event loop, then closed; nothing writes to it any more.
      const fd = this.fd;
      const written = this.unsynced;
      this.fd = null;
      this.unsynced = [];
      fdatasync(fd, () => {
        for (const e of written) e.durable = true;
        try {
          closeSync(fd);
        } catch {
          // closed already
        }
      });
    }
    const id = Math.max(0, ...this.segments.keys()) + 1;
    const path = join(this.opts.dir!, segmentName(id));
    this.fd = openSync(path, 'a');
    const seg: Segment = { id, path, size: 0, unacked: 0, trailingUsage: 0 };
    this.segments.set(id, seg);
    this.current = seg;
    if (prev) this.maybeDelete(prev);
    return seg;
  }

  private maybeDelete(seg: Segment): void {
    if (seg === this.current || seg.unacked > 0 || seg.trailingUsage > 0) return;
    this.segments.delete(seg.id);
    // Off the event loop; close() waits for it, so a closed journal leaves nothing acknowledged behind.
    const gone = unlink(seg.path).catch(() => undefined);
    this.unlinking.add(gone);
    void gone.then(() => this.unlinking.delete(gone));
  }

  /** Drops cached payloads of durable entries, oldest first, past the memory budget. */
  private evict(): void {
    if (!this.opts.dir || this.cachedBytes <= MEMORY_CACHE_BYTES) return;
    for (const e of this.byId.values()) {
      if (this.cachedBytes <= MEMORY_CACHE_BYTES) return;
      if (e.payload && e.durable) {
        e.payload = null;
        this.cachedBytes -= e.bytes;
      }
    }
  }

  /** Reads the segments a previous process left: every whole record becomes an unacknowledged entry. */
  private load(dir: string): void {
    const ids = segmentIds(dir);
    let found = 0;
    let last: Segment | null = null;
    for (const id of ids) {
      const path = join(dir, segmentName(id));
      const data = readFileSync(path);
      const seg: Segment = { id, path, size: 0, unacked: 0, trailingUsage: 0 };
      // Usage records after the segment's last report: not in any report yet.
      let trailing: Buffer[] = [];
      const { records, end: off } = readSegment(data);
      for (const r of records) {
        if (r.usage) {
          trailing.push(Buffer.from(r.payload));
          continue;
        }
        trailing = [];
        const head = peekReport(r.payload);
        if (head && !this.byId.has(idOf(head.instanceId, head.seq))) {
          const e: JournalEntry = { instanceId: head.instanceId, seq: head.seq, bytes: r.payload.length, payload: null, segment: id, offset: r.offset, durable: true };
          this.byId.set(idOf(e.instanceId, e.seq), e);
          this.unackedBytes += r.payload.length;
          seg.unacked++;
          found++;
        }
      }
      // Only the last segment can end with usage records (a segment rolls over right after a report).
      if (id === ids[ids.length - 1]) {
        this.orphans = trailing;
        seg.trailingUsage = trailing.length;
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
      if (seg.unacked === 0 && seg.trailingUsage === 0) {
        if (existsSync(path)) unlinkSync(path);
      } else {
        this.segments.set(id, seg);
        last = seg;
      }
    }
    if (found > 0) this.opts.log(`journal: ${found} unacknowledged reports (${this.unackedBytes} bytes) found in ${dir}; sending them again`);
    if (this.orphans.length > 0 && last) {
      // Appended to in place: the report that takes these records over must follow them in their segment.
      this.current = last;
      this.fd = openSync(last.path, 'a');
      this.opts.log(`journal: ${this.orphans.length} usage records written after the last report found in ${dir}; billing them`);
    }
  }
}

function idOf(instanceId: string, seq: number): string {
  return `${instanceId}#${seq}`;
}
