// The audit log's reading side: newest first, limited to the organisations the caller may see.
import type { Queryable } from '../store/db.js';

export interface AuditRow {
  id: number;
  at_ms: number;
  actor: string;
  action: string;
  target_id: string;
  org_id: string;
  outcome: string;
  caller_address: string;
  detail: string;
}

export interface AuditQuery {
  /** 'all' for the operator; else the organisations whose entries the caller may read. */
  visibleOrgs: 'all' | readonly string[];
  orgId?: string;
  sinceMs?: number;
  action?: string;
  limit: number;
}

export async function queryAudit(q: Queryable, f: AuditQuery): Promise<AuditRow[]> {
  const where: string[] = [];
  const params: (string | number)[] = [];
  if (f.visibleOrgs !== 'all') {
    if (f.visibleOrgs.length === 0) return [];
    where.push(`org_id IN (${f.visibleOrgs.map(() => '?').join(', ')})`);
    params.push(...f.visibleOrgs);
  }
  if (f.orgId) {
    where.push('org_id = ?');
    params.push(f.orgId);
  }
  if (f.sinceMs) {
    where.push('at_ms >= ?');
    params.push(f.sinceMs);
  }
  if (f.action) {
    where.push('action = ?');
    params.push(f.action);
  }
  params.push(f.limit);
  return q.all<AuditRow>(
    `SELECT id, at_ms, actor, action, target_id, org_id, outcome, caller_address, detail FROM audit_log
     ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY at_ms DESC, id DESC LIMIT ?`,
    params,
  );
}
