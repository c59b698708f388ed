// Money limits below the organisation (docs/money-limits.md): keys' own limits, projects' monthly
// caps, and what was spent against them, summed from usage_minutes (its primary key starts with
// project_id, minute, so each sum reads one project's range).
import type { Queryable } from './db.js';
import { textList } from './dialect.js';

export async function setKeyLimit(q: Queryable, keyId: string, limitMicros: number, reset: string): Promise<void> {
  await q.run('UPDATE api_keys SET limit_micros = ?, limit_reset = ? WHERE id = ?', [limitMicros, reset, keyId]);
}

export async function setProjectCap(q: Queryable, projectId: string, capMicros: number | null): Promise<void> {
  await q.run('UPDATE projects SET cap_micros = ? WHERE id = ?', [capMicros, projectId]);
}

/** Projects with a cap (nodes hold them in the snapshot). */
export function cappedProjects(q: Queryable): Promise<{ id: string; cap_micros: number }[]> {
  return q.all('SELECT id, cap_micros FROM projects WHERE cap_micros IS NOT NULL');
}

/** What one key spent in the minutes [sinceMinute, untilMinute). */
export async function keySpendSince(q: Queryable, projectId: string, keyId: string, sinceMinute: number, untilMinute = Number.MAX_SAFE_INTEGER): Promise<number> {
  const r = await q.get<{ s: number | null }>('SELECT SUM(cost_micros) AS s FROM usage_minutes WHERE project_id = ? AND minute >= ? AND minute < ? AND key_id = ?', [projectId, sinceMinute, untilMinute, keyId]);
  return r?.s ?? 0;
}

/** What each of these projects spent in the minutes [sinceMinute, untilMinute) (absent: nothing). */
export async function projectSpendsSince(q: Queryable, projectIds: readonly string[], sinceMinute: number, untilMinute = Number.MAX_SAFE_INTEGER): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  if (projectIds.length === 0) return out;
  // Each table behind the view usage_minutes is read on its own: SQLite does not push an IN (subquery)
  // term into a compound view, so through the view usage_folded would be scanned whole.
  const rows = await q.all<{ project_id: string; s: number }>(
    `SELECT project_id, SUM(s) AS s FROM (
       SELECT project_id, SUM(cost_micros) AS s FROM usage_folded WHERE project_id IN ${textList(q, '?1')} AND minute >= ?2 AND minute < ?3 GROUP BY project_id
       UNION ALL
       SELECT project_id, SUM(cost_micros) AS s FROM usage_journal WHERE project_id IN ${textList(q, '?1')} AND minute >= ?2 AND minute < ?3 GROUP BY project_id
     ) AS spends GROUP BY project_id`,
    [JSON.stringify(projectIds), sinceMinute, untilMinute],
  );
  for (const r of rows) out.set(r.project_id, r.s);
  return out;
}
