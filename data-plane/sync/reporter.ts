// Usage records and last_used_at, batched off the request path and sent to the control plane as
// numbered reports. A report is kept until its ReportAck arrives; on reconnect every unacked report is
// sent again, in order (the control plane deduplicates by node, instance and seq).
import type { LastUsed, NodeMessage, UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import type { Clock } from '../limits/clock.js';

/** The part of the gRPC duplex stream the reporter writes to. */
export interface ReportStream {
  write(msg: NodeMessage): boolean;
  once(event: 'drain', fn: () => void): unknown;
}

interface PendingReport {
  seq: number;
  usage: UsageRecord[];
  lastUsed: LastUsed[];
}

const MAX_RECORDS_PER_REPORT = 1000;

export class Reporter {
  private seq = 0;
  private usage: UsageRecord[] = [];
  private lastUsed: LastUsed[] = [];
  /** key id → the second its last_used_at was last queued (at most once per key per second). */
  private readonly touchedSec = new Map<string, number>();
  private readonly unacked: PendingReport[] = [];
  /** How many of `unacked` were written on the current stream. */
  private sent = 0;
  private stream: ReportStream | null = null;
  private waitingDrain = false;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly clock: Clock,
    flushEveryMs = 250,
  ) {
    this.timer = setInterval(() => this.flush(), flushEveryMs);
    this.timer.unref();
  }

  /** Queues one usage record (in memory only: no I/O on the request path). */
  record(u: UsageRecord): void {
    this.usage.push(u);
  }

  /** Notes that a key authenticated a request now. */
  touch(keyId: string): void {
    const nowMs = this.clock.now();
    const sec = Math.floor(nowMs / 1000);
    if (this.touchedSec.get(keyId) === sec) return;
    this.touchedSec.set(keyId, sec);
    this.lastUsed.push({ keyId, atMs: nowMs });
  }

  /** Turns what is queued into numbered reports and sends them if connected. */
  flush(): void {
    while (this.usage.length > 0 || this.lastUsed.length > 0) {
      const usage = this.usage.splice(0, MAX_RECORDS_PER_REPORT);
      const lastUsed = this.lastUsed.splice(0, MAX_RECORDS_PER_REPORT);
      this.unacked.push({ seq: ++this.seq, usage, lastUsed });
    }
    this.send();
  }

  /** A new stream: everything unacked goes again, in order. */
  attach(stream: ReportStream): void {
    this.stream = stream;
    this.sent = 0;
    this.waitingDrain = false;
    this.send();
  }

  detach(): void {
    this.stream = null;
    this.sent = 0;
    this.waitingDrain = false;
  }

  ack(seq: number): void {
    const i = this.unacked.findIndex((r) => r.seq === seq);
    if (i === -1) return;
    this.unacked.splice(i, 1);
    if (i < this.sent) this.sent--;
  }

  get unackedCount(): number {
    return this.unacked.length + (this.usage.length > 0 || this.lastUsed.length > 0 ? 1 : 0);
  }

  /** Flushes and waits (bounded) until every report is acknowledged. For shutdown. */
  async drain(timeoutMs: number): Promise<boolean> {
    this.flush();
    const deadline = Date.now() + timeoutMs;
    while (this.unacked.length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    return this.unacked.length === 0;
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private send(): void {
    const stream = this.stream;
    if (!stream || this.waitingDrain) return;
    while (this.sent < this.unacked.length) {
      const r = this.unacked[this.sent++];
      // Respect the stream's backpressure: wait for 'drain' before writing more.
      if (!stream.write({ report: { seq: r.seq, usage: r.usage, lastUsed: r.lastUsed } })) {
        this.waitingDrain = true;
        stream.once('drain', () => {
          if (this.stream !== stream) return;
          this.waitingDrain = false;
          this.send();
        });
        return;
      }
    }
  }
}
