// Model calls summed per key, model, minute (of completion) and lease epoch: how a node queues usage
// for a report (Report.usage_totals), and how the control plane reads an older node's per-call
// records. Every figure is made a safe integer as it is added, so no call can make a report
// unencodable. Pure; shared by the node and the control plane.
import type { UsageRecord, UsageTotal } from '../gen/tollgate/v1/sync.js';
import { clampCount } from './log-columns.js';

export class UsageTotals {
  private readonly byId = new Map<string, UsageTotal>();
  /** Calls added. */
  calls = 0;

  add(u: UsageRecord): void {
    const minute = Math.floor(clampCount(u.atMs) / 60_000);
    const epoch = clampCount(u.leaseEpoch);
    const id = `${u.keyId}\u0000${u.model}\u0000${minute}\u0000${epoch}`;
    let t = this.byId.get(id);
    if (!t) {
      t = { keyId: u.keyId, orgId: u.orgId, projectId: u.projectId, model: u.model, minute, leaseEpoch: epoch, requests: 0, promptTokens: 0, completionTokens: 0, costMicros: 0 };
      this.byId.set(id, t);
    }
    t.requests++;
    t.promptTokens = clampCount(t.promptTokens + clampCount(u.promptTokens));
    t.completionTokens = clampCount(t.completionTokens + clampCount(u.completionTokens));
    t.costMicros = clampCount(t.costMicros + clampCount(u.costMicros));
    this.calls++;
  }

  /** Totals kept (one per key, model, minute and lease epoch). */
  get size(): number {
    return this.byId.size;
  }

  totals(): UsageTotal[] {
    return [...this.byId.values()];
  }
}
