import type { Queryable } from './db.js';

/** Model calls of one key and model in one minute, summed. */
export interface UsageMinute {
  projectId: string;
  keyId: string;
  model: string;
  orgId: string;
  minute: number;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  costMicros: number;
}

/**
 * Moves a node instance's report cursor to `lastSeq` if it is below `firstSeq`, in one statement:
 * true when it moved (every report from firstSeq to lastSeq is new). False when some or all of them
 * are replays: the caller reads the cursor and takes only the reports past it.
 */
export async function advanceReportCursor(q: Queryable, nodeId: string, instanceId: string, firstSeq: number, lastSeq: number, at: string): Promise<boolean> {
  const r = await q.runPrepared(
    `INSERT INTO report_cursors (node_id, instance_id, last_seq, updated_at) VALUES (?, ?, ?, ?)
     ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at
     WHERE report_cursors.last_seq < ?`,
    [nodeId, instanceId, lastSeq, at, firstSeq],
  );
  return r.changes === 1;
}

export async function reportCursor(q: Queryable, nodeId: string, instanceId: string): Promise<number> {
  const row = await q.get<{ last_seq: number }>('SELECT last_seq FROM report_cursors WHERE node_id = ? AND instance_id = ?', [nodeId, instanceId]);
  return row?.last_seq ?? 0;
}

export async function setReportCursor(q: Queryable, nodeId: string, instanceId: string, seq: number, at: string): Promise<void> {
  await q.run(
    `INSERT INTO report_cursors (node_id, instance_id, last_seq, updated_at) VALUES (?, ?, ?, ?)
     ON CONFLICT (node_id, instance_id) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq), updated_at = excluded.updated_at`,
    [nodeId, instanceId, seq, at],
  );
}

// Rows of a report's usage and money are written by one statement per table however many keys and
// organisations the report holds: the rows go in as one JSON array (json_each), so the work in the
// event loop and on the database queue per report stays constant (issue 19). Usage rows are appended
// to usage_journal (a few pages at its tail) and folded into usage_folded later (foldUsage); the view
// usage_minutes reads both.
const JOURNAL_USAGE_SQL = `INSERT INTO usage_journal (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros)
  SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7, value ->> 8 FROM json_each(?)`;

/** Appends minutes of usage to the journal in one statement; they count in usage_minutes at once. */
export async function addUsageMinutes(q: Queryable, rows: readonly UsageMinute[]): Promise<void> {
  if (rows.length === 0) return;
  const json = JSON.stringify(rows.map((r) => [r.projectId, r.minute, r.keyId, r.model, r.orgId, r.requests, r.promptTokens, r.completionTokens, r.costMicros]));
  await q.runPrepared(JOURNAL_USAGE_SQL, [json]);
}

// Each journal row is added to its folded row in primary-key order (then in the order the rows came),
// so each page of usage_folded the fold touches is written once, a row's organisation is the first
// one that came, as when rows were upserted at ingest, and sums past 2^63 turn REAL as `+` does instead
// of failing as SUM() would (a fold that fails on one row would hold up every tenant's).
const FOLD_USAGE_SQL = `INSERT INTO usage_folded (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros)
  SELECT project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros
  FROM usage_journal WHERE id <= ? ORDER BY project_id, minute, key_id, model, id
  ON CONFLICT (project_id, minute, key_id, model) DO UPDATE SET requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens, completion_tokens = completion_tokens + excluded.completion_tokens,
    cost_micros = cost_micros + excluded.cost_micros`;

/** The journal's extent: its first and last row ids and how many rows it holds (0s when empty). */
export async function usageJournalExtent(q: Queryable): Promise<{ first: number; last: number; rows: number }> {
  const r = await q.get<{ first: number | null; last: number | null; rows: number }>('SELECT MIN(id) AS first, MAX(id) AS last, COUNT(*) AS rows FROM usage_journal');
  return { first: r?.first ?? 0, last: r?.last ?? 0, rows: r?.rows ?? 0 };
}

/**
 * Folds the journal's rows up to id `upTo` into usage_folded, added per project, minute, key and
 * model, and deletes them: two statements, to run inside one transaction so that a row is counted in
 * exactly one of the two tables. Returns the journal rows folded.
 */
export async function foldUsage(q: Queryable, upTo: number): Promise<number> {
  await q.runPrepared(FOLD_USAGE_SQL, [upTo]);
  return (await q.runPrepared('DELETE FROM usage_journal WHERE id <= ?', [upTo])).changes;
}

export async function addSpend(q: Queryable, orgId: string, month: string, micros: number): Promise<void> {
  await addSpendMany(q, [{ orgId, month, micros }]);
}

const ADD_MONTH_SPEND_SQL = `INSERT INTO org_spend (org_id, month, spend_micros) SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?) WHERE true
  ON CONFLICT (org_id, month) DO UPDATE SET spend_micros = spend_micros + excluded.spend_micros`;
const ADD_TOTAL_SPEND_SQL = `UPDATE orgs SET spend_total_micros = spend_total_micros + v.micros
  FROM (SELECT value ->> 0 AS id, SUM(value ->> 1) AS micros FROM json_each(?) GROUP BY 1) AS v WHERE orgs.id = v.id`;

/** Adds spend per organisation and month (and to each organisation's all-time spend): two statements in all. */
export async function addSpendMany(q: Queryable, rows: readonly { orgId: string; month: string; micros: number }[]): Promise<void> {
  if (rows.length === 0) return;
  await q.runPrepared(ADD_MONTH_SPEND_SQL, [JSON.stringify(rows.map((r) => [r.orgId, r.month, r.micros]))]);
  await q.runPrepared(ADD_TOTAL_SPEND_SQL, [JSON.stringify(rows.map((r) => [r.orgId, r.micros]))]);
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
  day: { select: "'' AS key_id, '' AS model, strftime('%Y-%m-%d', minute * 60, 'unixepoch') AS day", group: 'day' },
};

/**
 * Usage of one project or organisation in [sinceMs, untilMs), grouped. Usage is kept per minute: a
 * minute the range covers only in part is counted whole.
 */
export function usageInRange(
  q: Queryable,
  scope: { projectId: string } | { orgId: string },
  range: { sinceMs: number; untilMs: number | null },
  groupBy: UsageGroupBy,
): Promise<UsageGroupRow[]> {
  const [col, id] = 'projectId' in scope ? ['project_id', scope.projectId] : ['org_id', scope.orgId];
  const fromMinute = Math.floor(Math.max(0, range.sinceMs) / 60_000);
  const toMinute = range.untilMs === null ? Number.MAX_SAFE_INTEGER : Math.ceil(range.untilMs / 60_000);
  const g = GROUP_COLUMNS[groupBy];
  return q.all<UsageGroupRow>(
    `SELECT ${g.select}, SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,
       SUM(cost_micros) AS cost_micros
     FROM usage_minutes WHERE ${col} = ? AND minute >= ? AND minute < ?
     GROUP BY ${g.group} ORDER BY ${g.group}`,
    [id, fromMinute, toMinute],
  );
}
