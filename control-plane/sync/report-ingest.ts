// Reports from nodes, written exactly once. A report carries a batch of usage, last_used_at and request
// logs, numbered per (node_id, instance_id). Its request logs go to the log store (their own file, their
// own cursor); its usage and money go to the state database in one transaction: usage rows by prepared
// multi-row INSERTs, spend added once per organisation and month, the report's cursor moved. A report
// at or below a cursor is a replay and changes nothing in that store, so a crash between the two
// writes is repaired by the node sending the report again.
import { decodeLogColumns } from '../../proto/lib/log-columns.js';
import { monthOf } from '../../proto/lib/money.js';
import type { Report, UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../control-state.js';
import type { Param, Tx } from '../store/db.js';
import { touchLastUsed } from '../store/keys-repo.js';
import type { LogStore } from '../store/log-store.js';
import { addSpend, insertUsage, reportCursor, setReportCursor } from '../store/usage-repo.js';

export interface ReportSource {
  nodeId: string;
  instanceId: string;
}

export interface IngestResult {
  duplicate: boolean;
  inserted: number;
  logs: number;
}

const safeCount = (n: number) => (Number.isSafeInteger(n) && n > 0 ? n : 0);
const USAGE_COLUMNS = 13;
const USAGE_CHUNK = 64;

interface UsageRow {
  u: UsageRecord;
  atMs: number;
  cost: number;
}

export class ReportIngest {
  constructor(
    private readonly state: ControlState,
    private readonly logs: LogStore | null = null,
  ) {}

  /**
   * `onSpend` runs right after COMMIT for each organisation's cost in this report, per lease epoch
   * the costs were reserved under (money leases).
   */
  async ingest(source: ReportSource, report: Report, onSpend?: (orgId: string, costMicros: number, leaseEpoch: number) => void): Promise<IngestResult> {
    // A node replaying its journal after a restart sends reports numbered by its former instance.
    const src = { nodeId: source.nodeId, instanceId: report.instanceId || source.instanceId };
    let logs = 0;
    if (this.logs && report.logs) {
      const { rows } = decodeLogColumns(report.logs);
      if (rows.length > 0) logs = (await this.logs.writeBatch(src, report.seq, rows)).written;
    }
    const r = await this.writeUsage(src, report, onSpend);
    return { ...r, logs };
  }

  private writeUsage(src: ReportSource, report: Report, onSpend?: (orgId: string, costMicros: number, leaseEpoch: number) => void): Promise<Omit<IngestResult, 'logs'>> {
    return this.state.db.tx(async (tx) => {
      const last = await reportCursor(tx, src.nodeId, src.instanceId);
      if (report.seq <= last) return { duplicate: true, inserted: 0 };
      const now = this.state.now();
      const rows: UsageRow[] = [];
      for (const u of report.usage) {
        if (!u.requestId) continue;
        rows.push({ u, atMs: Number.isSafeInteger(u.atMs) && u.atMs > 0 ? u.atMs : now, cost: safeCount(u.costMicros) });
      }
      // Normally every row is new (the cursor already excludes replays); a request id seen before
      // (only possible if a node reused one) falls back to row-by-row so it is never paid twice.
      let fresh = rows;
      if (rows.length > 0) {
        const changed = await insertUsageRows(tx, src.nodeId, rows);
        if (changed !== rows.length) fresh = await this.rowByRow(tx, src.nodeId, rows, changed);
      }
      const affected = new Set<string>();
      const spent = new Map<string, { orgId: string; epoch: number; cost: number }>();
      const monthly = new Map<string, { orgId: string; month: string; cost: number }>();
      const lastUsed = new Map<string, number>();
      for (const { u, atMs, cost } of fresh) {
        if (cost > 0 && u.orgId) {
          const month = monthOf(atMs);
          const mk = `${u.orgId}\u0000${month}`;
          const m = monthly.get(mk) ?? { orgId: u.orgId, month, cost: 0 };
          m.cost += cost;
          monthly.set(mk, m);
          affected.add(u.orgId);
          const epoch = Number.isSafeInteger(u.leaseEpoch) ? u.leaseEpoch : 0;
          const id = `${epoch}:${u.orgId}`;
          const entry = spent.get(id) ?? { orgId: u.orgId, epoch, cost: 0 };
          entry.cost += cost;
          spent.set(id, entry);
        }
        if (u.keyId) lastUsed.set(u.keyId, Math.max(lastUsed.get(u.keyId) ?? 0, atMs));
      }
      // Money aggregated per organisation and month: one update each, however many rows.
      for (const m of monthly.values()) await addSpend(tx, m.orgId, m.month, m.cost);
      for (const l of report.lastUsed) {
        if (l.keyId && Number.isSafeInteger(l.atMs) && l.atMs > 0) lastUsed.set(l.keyId, Math.max(lastUsed.get(l.keyId) ?? 0, l.atMs));
      }
      for (const [keyId, atMs] of lastUsed) await touchLastUsed(tx, keyId, new Date(atMs).toISOString());
      await setReportCursor(tx, src.nodeId, src.instanceId, report.seq, new Date(now).toISOString());
      if (affected.size > 0) await this.state.refreshOrgs(tx, affected);
      if (onSpend) tx.afterCommit(() => spent.forEach((e) => onSpend(e.orgId, e.cost, e.epoch)));
      return { duplicate: false, inserted: fresh.length };
    });
  }

  /** Some rows were already recorded: find which are new, one at a time (rare). */
  private async rowByRow(tx: Tx, nodeId: string, rows: UsageRow[], changedInBulk: number): Promise<UsageRow[]> {
    // The bulk insert added `changedInBulk` rows, which cannot be told apart: undo them and redo singly.
    if (changedInBulk > 0) {
      await tx.exec('ROLLBACK TO usage_bulk');
    }
    const fresh: UsageRow[] = [];
    for (const r of rows) {
      const ok = await insertUsage(tx, {
        request_id: r.u.requestId,
        key_id: r.u.keyId,
        org_id: r.u.orgId,
        project_id: r.u.projectId,
        model: r.u.model,
        path: r.u.path,
        status: r.u.status,
        prompt_tokens: safeCount(r.u.promptTokens),
        completion_tokens: safeCount(r.u.completionTokens),
        cost_micros: r.cost,
        at_ms: r.atMs,
        month: monthOf(r.atMs),
        node_id: nodeId,
      });
      if (ok) fresh.push(r);
    }
    return fresh;
  }
}

/** Inserts usage rows by multi-row prepared statements inside a savepoint; returns how many were new. */
async function insertUsageRows(tx: Tx, nodeId: string, rows: UsageRow[]): Promise<number> {
  await tx.exec('SAVEPOINT usage_bulk');
  let changed = 0;
  let i = 0;
  while (i < rows.length) {
    const n = rows.length - i >= USAGE_CHUNK ? USAGE_CHUNK : 1;
    const params: Param[] = [];
    for (let j = i; j < i + n; j++) {
      const { u, atMs, cost } = rows[j];
      params.push(u.requestId, u.keyId, u.orgId, u.projectId, u.model, u.path, u.status, safeCount(u.promptTokens), safeCount(u.completionTokens), cost, atMs, monthOf(atMs), nodeId);
    }
    changed += (await tx.runPrepared(usageInsertSql(n), params)).changes;
    i += n;
  }
  return changed;
}

const usageSql = new Map<number, string>();
function usageInsertSql(rows: number): string {
  let sql = usageSql.get(rows);
  if (!sql) {
    const one = `(${Array.from({ length: USAGE_COLUMNS }, () => '?').join(',')})`;
    sql = `INSERT OR IGNORE INTO usage (request_id, key_id, org_id, project_id, model, path, status, prompt_tokens, completion_tokens, cost_micros, at_ms, month, node_id) VALUES ${Array.from({ length: rows }, () => one).join(',')}`;
    usageSql.set(rows, sql);
  }
  return sql;
}
