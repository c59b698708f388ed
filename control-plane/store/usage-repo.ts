import type { Queryable } from './db.js';

export interface UsageInsert {
  request_id: string;
  key_id: string;
  org_id: string;
  project_id: string;
  model: string;
  path: string;
  status: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_micros: number;
  at_ms: number;
  month: string;
  node_id: string;
}

export interface UsageSummaryRow {
  key_id: string;
  model: string;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_micros: number;
}

export async function reportCursor(q: Queryable, nodeId: string, instanceId: string): Promise<number> {
  const row = await q.get<{ last_seq: number }>('SELECT last_seq FROM report_cursors WHERE node_id = ? AND instance_id = ?', [nodeId, instanceId]);
  return row?.last_seq ?? 0;
}

export async function setReportCursor(q: Queryable, nodeId: string, instanceId: string, seq: number, at: string): Promise<void> {
  await q.run(
    `INSERT INTO report_cursors (node_id, instance_id, last_seq, updated_at) VALUES (?, ?, ?, ?)
     ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at`,
    [nodeId, instanceId, seq, at],
  );
}

/** Inserts one usage row; false when its request_id was already recorded (a replay). */
export async function insertUsage(q: Queryable, u: UsageInsert): Promise<boolean> {
  const r = await q.run(
    `INSERT OR IGNORE INTO usage (request_id, key_id, org_id, project_id, model, path, status, prompt_tokens, completion_tokens, cost_micros, at_ms, month, node_id)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    [u.request_id, u.key_id, u.org_id, u.project_id, u.model, u.path, u.status, u.prompt_tokens, u.completion_tokens, u.cost_micros, u.at_ms, u.month, u.node_id],
  );
  return r.changes === 1;
}

export async function addSpend(q: Queryable, orgId: string, month: string, micros: number): Promise<void> {
  await q.run(
    `INSERT INTO org_spend (org_id, month, spend_micros) VALUES (?, ?, ?)
     ON CONFLICT (org_id, month) DO UPDATE SET spend_micros = spend_micros + excluded.spend_micros`,
    [orgId, month, micros],
  );
  await q.run('UPDATE orgs SET spend_total_micros = spend_total_micros + ? WHERE id = ?', [micros, orgId]);
}

export function usageSummary(q: Queryable, scope: { projectId: string } | { orgId: string }, month: string): Promise<UsageSummaryRow[]> {
  const [col, id] = 'projectId' in scope ? ['project_id', scope.projectId] : ['org_id', scope.orgId];
  return q.all<UsageSummaryRow>(
    `SELECT key_id, model, COUNT(*) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,
       SUM(cost_micros) AS cost_micros FROM usage WHERE ${col} = ? AND month = ? GROUP BY key_id, model ORDER BY key_id, model`,
    [id, month],
  );
}

/** How usage is grouped when read: per key and model (the console's default), or by one column. */
export type UsageGroupBy = 'key_model' | 'model' | 'day' | 'key';

export interface UsageGroupRow {
  /** Empty unless grouped by key (or key and model). */
  key_id: string;
  /** Empty unless grouped by model (or key and model). */
  model: string;
  /** "YYYY-MM-DD" (UTC) when grouped by day, else empty. */
  day: string;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_micros: number;
}

const GROUP_COLUMNS: Record<UsageGroupBy, { select: string; group: string }> = {
  key_model: { select: "key_id, model, '' AS day", group: 'key_id, model' },
  model: { select: "'' AS key_id, model, '' AS day", group: 'model' },
  key: { select: "key_id, '' AS model, '' AS day", group: 'key_id' },
  day: { select: "'' AS key_id, '' AS model, strftime('%Y-%m-%d', at_ms / 1000, 'unixepoch') AS day", group: 'day' },
};

/**
 * Usage of one project or organisation with `at_ms` in [sinceMs, untilMs), grouped. The month bounds
 * repeat the time bounds so the (project_id, month) and (org_id, month) indexes narrow the scan.
 */
export function usageInRange(
  q: Queryable,
  scope: { projectId: string } | { orgId: string },
  range: { sinceMs: number; untilMs: number | null },
  groupBy: UsageGroupBy,
): Promise<UsageGroupRow[]> {
  const [col, id] = 'projectId' in scope ? ['project_id', scope.projectId] : ['org_id', scope.orgId];
  const untilMs = range.untilMs ?? Number.MAX_SAFE_INTEGER;
  const fromMonth = new Date(Math.max(0, range.sinceMs)).toISOString().slice(0, 7);
  const toMonth = range.untilMs === null ? '9999-12' : new Date(Math.max(0, untilMs - 1)).toISOString().slice(0, 7);
  const g = GROUP_COLUMNS[groupBy];
  return q.all<UsageGroupRow>(
    `SELECT ${g.select}, COUNT(*) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,
       SUM(cost_micros) AS cost_micros
     FROM usage WHERE ${col} = ? AND month >= ? AND month <= ? AND at_ms >= ? AND at_ms < ?
     GROUP BY ${g.group} ORDER BY ${g.group}`,
    [id, fromMonth, toMonth, range.sinceMs, untilMs],
  );
}
