// Usage reports from nodes, written idempotently: one transaction per report; a report whose seq is
// not above the (node_id, instance_id) cursor is a replay and changes nothing; a usage row whose
// request_id is already recorded is not counted again.
import { monthOf } from '../../proto/lib/money.js';
import type { Report } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../control-state.js';
import { touchLastUsed } from '../store/keys-repo.js';
import { addSpend, insertUsage, reportCursor, setReportCursor } from '../store/usage-repo.js';

export interface ReportSource {
  nodeId: string;
  instanceId: string;
}

export interface IngestResult {
  duplicate: boolean;
  inserted: number;
}

const safeCount = (n: number) => (Number.isSafeInteger(n) && n > 0 ? n : 0);

export class ReportIngest {
  constructor(private readonly state: ControlState) {}

  /**
   * `onSpend` runs right after COMMIT for each organisation's cost in this report, per lease epoch
   * the costs were reserved under (money leases).
   */
  ingest(source: ReportSource, report: Report, onSpend?: (orgId: string, costMicros: number, leaseEpoch: number) => void): Promise<IngestResult> {
    return this.state.db.tx(async (tx) => {
      const last = await reportCursor(tx, source.nodeId, source.instanceId);
      if (report.seq <= last) return { duplicate: true, inserted: 0 };
      const now = this.state.now();
      const affected = new Set<string>();
      const spent = new Map<string, { orgId: string; epoch: number; cost: number }>();
      const lastUsed = new Map<string, number>();
      let inserted = 0;
      for (const u of report.usage) {
        if (!u.requestId) continue;
        const atMs = Number.isSafeInteger(u.atMs) && u.atMs > 0 ? u.atMs : now;
        const cost = safeCount(u.costMicros);
        const fresh = await insertUsage(tx, {
          request_id: u.requestId,
          key_id: u.keyId,
          org_id: u.orgId,
          project_id: u.projectId,
          model: u.model,
          path: u.path,
          status: u.status,
          prompt_tokens: safeCount(u.promptTokens),
          completion_tokens: safeCount(u.completionTokens),
          cost_micros: cost,
          at_ms: atMs,
          month: monthOf(atMs),
          node_id: source.nodeId,
        });
        if (!fresh) continue;
        inserted++;
        if (cost > 0 && u.orgId) {
          await addSpend(tx, u.orgId, monthOf(atMs), cost);
          affected.add(u.orgId);
          const epoch = Number.isSafeInteger(u.leaseEpoch) ? u.leaseEpoch : 0;
          const id = `${epoch}:${u.orgId}`;
          const entry = spent.get(id) ?? { orgId: u.orgId, epoch, cost: 0 };
          entry.cost += cost;
          spent.set(id, entry);
        }
        if (u.keyId) lastUsed.set(u.keyId, Math.max(lastUsed.get(u.keyId) ?? 0, atMs));
      }
      for (const l of report.lastUsed) {
        if (l.keyId && Number.isSafeInteger(l.atMs) && l.atMs > 0) lastUsed.set(l.keyId, Math.max(lastUsed.get(l.keyId) ?? 0, l.atMs));
      }
      for (const [keyId, atMs] of lastUsed) await touchLastUsed(tx, keyId, new Date(atMs).toISOString());
      await setReportCursor(tx, source.nodeId, source.instanceId, report.seq, new Date(now).toISOString());
      if (affected.size > 0) await this.state.refreshOrgs(tx, affected);
      if (onSpend) tx.afterCommit(() => spent.forEach((e) => onSpend(e.orgId, e.cost, e.epoch)));
      return { duplicate: false, inserted };
    });
  }
}
