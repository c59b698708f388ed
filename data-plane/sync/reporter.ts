// Usage records, last_used_at and request logs, batched off the request path into numbered reports.
// Usage is summed per key, model, minute and lease epoch as it is recorded, and request logs are
// packed into one encoded block per UTC day, so the control plane's work per report grows with the
// keys in it, not with the requests. Each report is encoded once, appended to the node's journal (journal.ts) and sent; it is forgotten
// when its ReportAck arrives. On reconnect every unacknowledged report goes again, in order, at most
// WINDOW at a time (the control plane deduplicates by node, instance and seq), so neither side holds
// more than a window of reports in memory however long the control plane was away.
// Each usage record is also written to the journal as it is recorded (journal.ts, `writeUsage`), so a
// process killed before its next flush loses none of what it answered; the next process bills the
// records its predecessor left after its last report. Work per acknowledgement is O(1) amortized: the
// journal finds entries by id, and the next reports to send are the oldest not in flight.
import { Report, UsageRecord, type LastUsed, type NodeMessage, type StoredResponse } from '../../proto/gen/tollgate/v1/sync.js';
import { clampCount, LogBlocksBuilder, type LogRow } from '../../proto/lib/log-columns.js';
import { UsageTotals } from '../../proto/lib/usage-totals.js';
import type { Clock } from '../limits/clock.js';
import type { Journal, JournalEntry } from './journal.js';

/** The part of the gRPC duplex stream the reporter writes to. */
export interface ReportStream {
  write(msg: NodeMessage): boolean;
  once(event: 'drain', fn: () => void): unknown;
}

export interface ReporterOptions {
  /** This process's instance id: the numbering space of its reports. */
  instanceId: string;
  journal: Journal;
  log(line: string): void;
  flushEveryMs?: number;
  /**
   * Reports go to the control plane at most this often (default 1000 ms), several in one message:
   * the control plane's cost is per message, so a loaded node sending 4 reports a second costs it a
   * quarter of what sending each would. Reports are journaled every flush regardless; 0 sends each
   * at once.
   */
  sendEveryMs?: number;
}

/**
 * Request-log rows plus usage totals per report; a full one is flushed at once. Under a node's full
 * load, reports still go about every flush interval: the control plane's cost per report is mostly
 * fixed, so fewer, fuller reports cost it less per request.
 */
const MAX_ROWS_PER_REPORT = 10_000;
/** Reports sent on a stream and not yet acknowledged. */
const WINDOW = 16;
/** Reports in one message at most, and their bytes at most (the control plane holds a few messages per node). */
const MAX_BATCH_REPORTS = 8;
const MAX_BATCH_BYTES = 4 * 1024 * 1024;
/** Past the journal's cap times this, whole reports (usage too) are dropped rather than kept. */
const HARD_CAP_FACTOR = 1.5;

export interface ReporterStatus {
  journalBatches: number;
  journalBytes: number;
  droppedLogRows: number;
}

export class Reporter {
  private seq = 0;
  private usage = new UsageTotals();
  private lastUsed: LastUsed[] = [];
  /** Responses created here since the last report (the Responses API). */
  private storedResponses: StoredResponse[] = [];
  private logs = new LogBlocksBuilder();
  /** key id → the second its last_used_at was last queued (at most once per key per second). */
  private touchedSec = new Map<string, number>();
  private stream: ReportStream | null = null;
  private readonly inFlight = new Set<JournalEntry>();
  private waitingDrain = false;
  private pumping = false;
  private pumpAgain = false;
  private flushScheduled = false;
  private droppedLogRows = 0;
  private droppedReports = 0;
  private capEpisode = false;
  private lastSendAt = -Infinity;
  private sendTimer: NodeJS.Timeout | null = null;
  /** Send what is journaled without waiting for sendEveryMs (a new stream, or shutting down). */
  private urgent = true;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly clock: Clock,
    private readonly opts: ReporterOptions,
  ) {
    this.timer = setInterval(() => this.flush(), opts.flushEveryMs ?? 250);
    this.timer.unref();
    this.adoptOrphans();
  }

  /**
   * Bills the usage records a killed predecessor wrote after its last report: sealed at once into a
   * report of this process, written right after them in their segment (so they are covered once).
   */
  private adoptOrphans(): void {
    const orphans = this.opts.journal.takeOrphanUsage();
    if (orphans.length === 0) return;
    let bad = 0;
    for (const b of orphans) {
      try {
        this.usage.add(UsageRecord.decode(b));
      } catch {
        bad++;
      }
    }
    if (bad > 0) this.opts.log(`reporter: ${bad} journaled usage records could not be read; dropped`);
    this.seal();
  }

  /**
   * Queues one usage record, and writes it to the journal file at once (a write, no fsync, no await):
   * a request's usage is on disk before its answer's last byte.
   */
  record(u: UsageRecord): void {
    this.usage.add(u);
    const journal = this.opts.journal;
    if (journal.writesUsage) journal.writeUsage(Buffer.from(UsageRecord.encode(u).finish()));
    this.checkFull();
  }

  /** Queues one request-log row. */
  log(row: LogRow): void {
    this.logs.add(row);
    this.checkFull();
  }

  /** Queues a response this node created, for the control plane to keep and send to the other nodes. */
  recordStoredResponse(responseId: string, projectId: string, model: string, createdAtMs: number, deployment = ''): void {
    this.storedResponses.push({ responseId, projectId, model, createdAtMs, seq: 0, deployment });
    this.checkFull();
  }

  /** Notes that a key authenticated a request now. */
  touch(keyId: string): void {
    const nowMs = this.clock.now();
    const sec = Math.floor(nowMs / 1000);
    if (this.touchedSec.get(keyId) === sec) return;
    if (this.touchedSec.size > 100_000) this.touchedSec = new Map();
    this.touchedSec.set(keyId, sec);
    this.lastUsed.push({ keyId, atMs: nowMs });
  }

  private checkFull(): void {
    if (this.flushScheduled || this.usage.size + this.logs.rows + this.storedResponses.length < MAX_ROWS_PER_REPORT) return;
    this.flushScheduled = true;
    setImmediate(() => this.flush());
  }

  /** How far behind the journal is, for `tollgate nodes list` and monitoring. */
  get status(): ReporterStatus {
    const d = this.opts.journal.depth;
    return { journalBatches: d.batches, journalBytes: d.bytes, droppedLogRows: this.droppedLogRows };
  }

  get unackedCount(): number {
    return this.opts.journal.depth.batches + (this.usage.calls > 0 || this.lastUsed.length > 0 || this.logs.rows > 0 || this.storedResponses.length > 0 ? 1 : 0);
  }

  /** Turns what is queued into a numbered report, journals it and sends what the window allows. */
  flush(): void {
    this.flushScheduled = false;
    try {
      if (this.usage.calls > 0 || this.lastUsed.length > 0 || this.logs.rows > 0 || this.storedResponses.length > 0) this.seal();
    } catch (err) {
      this.opts.log(`reporter: a report could not be made and was dropped: ${(err as Error).message}`);
    }
    void this.opts.journal.sync();
    this.pump();
  }

  private seal(): void {
    const journal = this.opts.journal;
    const usageTotals = this.usage.totals();
    const lastUsed = this.lastUsed.map((l) => ({ keyId: l.keyId, atMs: clampCount(l.atMs) }));
    let logs = this.logs;
    const storedResponses = this.storedResponses;
    this.storedResponses = [];
    this.usage = new UsageTotals();
    this.lastUsed = [];
    this.logs = new LogBlocksBuilder();
    const depth = journal.depth.bytes;
    if (journal.overCap) {
      if (!this.capEpisode) {
        this.capEpisode = true;
        this.opts.log(
          `journal full: ${depth} bytes of reports unacknowledged, at or over the cap (--journal-max-mib); request-log rows are dropped until the control plane catches up (usage is still kept)`,
        );
      }
      this.droppedLogRows += logs.rows;
      logs = new LogBlocksBuilder();
      if (depth >= this.hardCap()) {
        this.droppedReports++;
        if (this.droppedReports === 1 || this.droppedReports % 1000 === 0) {
          this.opts.log(`journal full: ${depth} bytes unacknowledged, over ${HARD_CAP_FACTOR}x the cap: ${this.droppedReports} whole reports (usage too) dropped so far`);
        }
        return;
      }
      if (usageTotals.length === 0 && lastUsed.length === 0 && storedResponses.length === 0) return;
    } else if (this.capEpisode) {
      this.capEpisode = false;
      this.opts.log(`journal below its cap again (${depth} bytes unacknowledged): request logs are kept again; ${this.droppedLogRows} rows were dropped`);
    }
    const seq = ++this.seq;
    const report: Report = { seq, usage: [], lastUsed, logs: undefined, instanceId: this.opts.instanceId, usageTotals, logBlocks: logs.rows > 0 ? logs.blocks() : [] };
    if (storedResponses.length > 0) report.storedResponses = { responses: storedResponses, caughtUpProjects: [] };
    const bytes = Report.encode(report).finish();
    // A view of the encoded bytes, not a copy: under load, reports are the node's largest garbage.
    journal.append(this.opts.instanceId, seq, Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  }

  private hardCap(): number {
    return this.opts.journal.maxBytes * HARD_CAP_FACTOR;
  }

  /** A new stream: everything unacknowledged goes again, in order. */
  attach(stream: ReportStream): void {
    this.stream = stream;
    this.inFlight.clear();
    this.waitingDrain = false;
    this.urgent = true;
    this.pump();
  }

  detach(): void {
    this.stream = null;
    this.inFlight.clear();
    this.waitingDrain = false;
  }

  /** The control plane wrote a report; `instanceId` '' means this process's own. */
  ack(seq: number, instanceId = ''): void {
    const journal = this.opts.journal;
    const inst = instanceId || this.opts.instanceId;
    const e = journal.find(inst, seq);
    if (e) this.inFlight.delete(e);
    journal.ack(inst, seq);
    this.pump();
  }

  /** Flushes and waits (bounded) until every report is acknowledged; then the journal is closed. For shutdown. */
  async drain(timeoutMs: number): Promise<boolean> {
    this.urgent = true;
    this.flush();
    const deadline = Date.now() + timeoutMs;
    while (this.opts.journal.depth.batches > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    const done = this.opts.journal.depth.batches === 0;
    await this.opts.journal.close();
    return done;
  }

  stop(): void {
    clearInterval(this.timer);
    if (this.sendTimer) clearTimeout(this.sendTimer);
  }

  private pump(): void {
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    this.pumping = true;
    void this.sendSome().finally(() => {
      this.pumping = false;
      if (this.pumpAgain) {
        this.pumpAgain = false;
        this.pump();
      }
    });
  }

  private async sendSome(): Promise<void> {
    const journal = this.opts.journal;
    const every = this.opts.sendEveryMs ?? 1000;
    for (;;) {
      const stream = this.stream;
      if (!stream || this.waitingDrain || this.inFlight.size >= WINDOW) return;
      // The oldest reports not in flight, at most a message's worth: the ones in flight are the
      // oldest (sent in order), at most WINDOW of them, so this looks at O(WINDOW) entries.
      const waiting: JournalEntry[] = [];
      for (const x of journal.waiting()) {
        if (this.inFlight.has(x)) continue;
        waiting.push(x);
        if (waiting.length >= MAX_BATCH_REPORTS) break;
      }
      if (waiting.length === 0) {
        this.urgent = false;
        return;
      }
      // Wait for the send interval unless a full message is waiting, or this is urgent.
      const wait = this.lastSendAt + every - Date.now();
      if (wait > 0 && !this.urgent && waiting.length < MAX_BATCH_REPORTS) {
        if (!this.sendTimer) {
          this.sendTimer = setTimeout(() => {
            this.sendTimer = null;
            this.pump();
          }, wait);
          this.sendTimer.unref();
        }
        return;
      }
      // Consecutive reports of one instance, within the message's bounds.
      const batch: { e: JournalEntry; report: Report }[] = [];
      let bytes = 0;
      for (const e of waiting) {
        if (batch.length >= Math.min(MAX_BATCH_REPORTS, WINDOW - this.inFlight.size)) break;
        if (batch.length > 0 && (e.instanceId !== batch[0].e.instanceId || bytes + e.bytes > MAX_BATCH_BYTES)) break;
        let report: Report;
        try {
          report = Report.decode(e.payload ?? (await journal.read(e)));
        } catch (err) {
          this.opts.log(`reporter: report ${e.seq} of instance ${e.instanceId} cannot be read from the journal (${(err as Error).message}); dropped`);
          journal.ack(e.instanceId, e.seq);
          continue;
        }
        report.instanceId = e.instanceId;
        batch.push({ e, report });
        bytes += e.bytes;
      }
      if (this.stream !== stream) continue;
      const live = batch.filter((b) => journal.isUnacked(b.e) && !this.inFlight.has(b.e));
      if (live.length === 0) continue;
      for (const b of live) this.inFlight.add(b.e);
      this.lastSendAt = Date.now();
      const msg: NodeMessage = live.length === 1 ? { report: live[0].report } : { reports: { reports: live.map((b) => b.report) } };
      // Respect the stream's backpressure: wait for 'drain' before writing more.
      if (!stream.write(msg)) {
        this.waitingDrain = true;
        stream.once('drain', () => {
          if (this.stream !== stream) return;
          this.waitingDrain = false;
          this.pump();
        });
        return;
      }
    }
  }
}
