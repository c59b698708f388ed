import type { Queryable, Tx } from './db.js';
import { utcDayOfMinute } from './dialect.js';

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

/** A node instance's report cursor: the last report seq written (null when none was). */
export async function reportCursor(q: Queryable, nodeId: string, instanceId: string): Promise<number | null> {
  const row = await q.get<{ last_seq: number }>('SELECT last_seq FROM report_cursors WHERE node_id = ? AND instance_id = ?', [nodeId, instanceId]);
  return row?.last_seq ?? null;
}

/** What reports write to the state database, written by writeReportRows in one statement. */
export interface ReportRows {
  /** Each node instance's new cursor (a cursor is never moved back). */
  cursors: readonly { nodeId: string; instanceId: string; lastSeq: number; at: string }[];
  /** Minutes of usage, appended to the journal (folded into usage_folded later). */
  usage: readonly UsageMinute[];
  /** Spend per organisation and month, added to org_spend and to the organisation's all-time spend. */
  spend: readonly { orgId: string; month: string; micros: number }[];
  /** Keys' last_used_at (ISO 8601), moved forward only. */
  lastUsed: readonly (readonly [keyId: string, at: string])[];
}

const REPORT_SINK_SQL = 'INSERT INTO report_sink (cursors, usage, spend, last_used) VALUES (?, ?, ?, ?)';

/**
 * Writes reports' rows (every table a report changes in the state database) by one statement,
 * however many keys and organisations they hold: one row into the view report_sink, whose trigger
 * does the five writes (039-report-sink.ts). The rows go in as JSON arrays (json_each), so the work
 * in the event loop and on the database queue per report stays constant (issue 19). Usage rows are
 * appended to usage_journal (a few pages at its tail) and folded into usage_folded later (foldUsage);
 * the view usage_minutes reads both. With `last`, it is the transaction's last statement (Tx.runLast).
 */
export async function writeReportRows(q: Queryable | Tx, rows: ReportRows, opts: { last?: boolean } = {}): Promise<void> {
  const json = <T>(list: readonly T[], row: (x: T) => unknown[]) => (list.length === 0 ? null : JSON.stringify(list.map(row)));
  const params = [
    json(rows.cursors, (c) => [c.nodeId, c.instanceId, c.lastSeq, c.at]),
    json(rows.usage, (r) => [r.projectId, r.minute, r.keyId, r.model, r.orgId, r.requests, r.promptTokens, r.completionTokens, r.costMicros]),
    json(rows.spend, (r) => [r.orgId, r.month, r.micros]),
    json(rows.lastUsed, (l) => [l[0], l[1]]),
  ];
  // The transaction's last statement (Tx.runLast): alone when nothing came before it.
  if (opts.last && 'runLast' in q) await q.runLast(REPORT_SINK_SQL, params);
  else await q.runPrepared(REPORT_SINK_SQL, params);
}

/** Appends minutes of usage to the journal in one statement; they count in usage_minutes at once. */
export async function addUsageMinutes(q: Queryable, rows: readonly UsageMinute[]): Promise<void> {
  if (rows.length === 0) return;
  await writeReportRows(q, { cursors: [], usage: rows, spend: [], lastUsed: [] });
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

// PostgreSQL refuses an upsert that touches one row twice: the journal's rows are summed per folded
// row first (the organisation still the first that came, as above).
const FOLD_USAGE_PG_SQL = `INSERT INTO usage_folded AS f (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros)
  SELECT project_id, minute, key_id, model, (array_agg(org_id ORDER BY id))[1], SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_micros)
  FROM usage_journal WHERE id <= ? GROUP BY project_id, minute, key_id, model ORDER BY project_id, minute, key_id, model
  ON CONFLICT (project_id, minute, key_id, model) DO UPDATE SET requests = f.requests + excluded.requests,
    prompt_tokens = f.prompt_tokens + excluded.prompt_tokens, completion_tokens = f.completion_tokens + excluded.completion_tokens,
    cost_micros = f.cost_micros + excluded.cost_micros`;

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
  await q.runPrepared(q.dialect === 'postgres' ? FOLD_USAGE_PG_SQL : FOLD_USAGE_SQL, [upTo]);
  return (await q.runPrepared('DELETE FROM usage_journal WHERE id <= ?', [upTo])).changes;
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

const groupColumns = (q: Queryable): Record<UsageGroupBy, { select: string; group: string }> => ({
  key_model: { select: "key_id, model, '' AS day", group: 'key_id, model' },
  model: { select: "'' AS key_id, model, '' AS day", group: 'model' },
  key: { select: "key_id, '' AS model, '' AS day", group: 'key_id' },
  day: { select: `'' AS key_id, '' AS model, ${utcDayOfMinute(q, 'minute')} AS day`, group: 'day' },
});

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
  const g = groupColumns(q)[groupBy];
  return q.all<UsageGroupRow>(
    `SELECT ${g.select}, SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,
       SUM(cost_micros) AS cost_micros
     FROM usage_minutes WHERE ${col} = ? AND minute >= ? AND minute < ?
     GROUP BY ${g.group} ORDER BY ${g.group}`,
    [id, fromMinute, toMinute],
  );
}
