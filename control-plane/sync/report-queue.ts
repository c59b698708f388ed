// The report queue of the sync service: usage reports in from every node's stream, written in order
// one unit at a time per node (report-ingest.ts), and acknowledged once committed. Reports written
// together are acknowledged together.
import { status } from '@grpc/grpc-js';
import type { Report } from '../../proto/gen/tollgate/v1/sync.js';
import { countIngest } from '../metrics.js';
import type { MoneyLeaseLedger } from '../leases/money-lease-ledger.js';
import type { MoneyPools } from '../leases/money-pools.js';
import { failCall, type NodeSession } from './node-session.js';
import type { ReportIngest } from './report-ingest.js';

/**
 * Ingest backpressure: a node's stream is paused (no more messages read from it, so HTTP/2 flow
 * control holds the node back) while this many of its reports wait, or while all nodes together have
 * MAX_PENDING_REPORTS waiting; it is resumed as they are written. Memory for reports is bounded by
 * these counts (and by each node's window of unacknowledged reports), not by how much nodes replay.
 */
const MAX_QUEUED_REPORTS_PER_NODE = 2;
const MAX_PENDING_REPORTS = 64;

export class ReportQueue {
  /** Reports waiting to be written, over all nodes. */
  pendingReports = 0;

  constructor(
    private readonly ingest: ReportIngest,
    /** Every connected node's session (the sync service's set). */
    private readonly sessions: ReadonlySet<NodeSession>,
    private readonly moneyLeases: MoneyLeaseLedger,
    /** Projects' caps and keys' own limits (leases/money-pools.ts): charged after each report is written. */
    private readonly moneyPools: MoneyPools,
    private readonly log: (line: string) => void,
  ) {}

  /** Queues a report for writing; pauses the node's stream while its ingest is behind. */
  queueReport(s: NodeSession, reports: Report[]): void {
    s.reports.push(reports);
    this.pendingReports++;
    if (!s.paused && (s.reports.length >= MAX_QUEUED_REPORTS_PER_NODE || this.pendingReports >= MAX_PENDING_REPORTS)) {
      s.paused = true;
      s.call.pause();
    }
    void this.ingestNext(s);
  }

  /** Writes a node's queued reports one at a time, in order (a cursor must never pass a report that failed). */
  private async ingestNext(s: NodeSession): Promise<void> {
    if (s.ingesting) return;
    s.ingesting = true;
    try {
      while (s.reports.length > 0 && !s.closed) {
        const unit = s.reports[0];
        try {
          // A cost counts against this connection's slice only if it was reserved from it.
          const written = await this.ingest.ingestMany(
            { nodeId: s.nodeId, instanceId: s.instanceId },
            unit,
            (orgId, cost, epoch) => {
              if (epoch !== 0 && epoch === s.leaseEpoch) this.moneyLeases.consume(s.connId, orgId, cost);
            },
            (costs) => this.moneyPools.charge(this.moneyLeases, s.connId, s.leaseEpoch, costs),
          );
          countIngest(written);
        } catch (err) {
          this.log(`sync: reports ${unit[0].seq}..${unit[unit.length - 1].seq} from node ${s.nodeId} not written: ${(err as Error).message}`);
          s.drop();
          failCall(s.call, status.UNAVAILABLE, 'report not written; reconnect and resend');
          return;
        }
        if (s.closed) return;
        s.reports.shift();
        this.pendingReports--;
        // Reports written together are acknowledged in one message (docs/design.md#what-a-report-publishes).
        if (unit.length === 1) s.enqueue({ reportAck: { seq: unit[0].seq, instanceId: unit[0].instanceId } });
        else s.enqueue({ reportAcks: { acks: unit.map((r) => ({ seq: r.seq, instanceId: r.instanceId })) } });
        this.resumeReaders();
      }
    } finally {
      s.ingesting = false;
    }
  }

  /** Resumes paused streams whose node has room again, while the total has room. */
  private resumeReaders(): void {
    for (const x of this.sessions) {
      if (this.pendingReports >= MAX_PENDING_REPORTS) return;
      if (x.paused && x.reports.length < MAX_QUEUED_REPORTS_PER_NODE) {
        x.paused = false;
        x.call.resume();
      }
    }
  }

  /** A dropped session's queued reports are forgotten (the node resends them when it reconnects). */
  forget(s: NodeSession): void {
    this.pendingReports -= s.reports.length;
    s.reports.length = 0;
    this.resumeReaders();
  }
}
