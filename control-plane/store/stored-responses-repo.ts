// Owned upstream objects of the Responses API (stored responses, conversations, items) and the
// project that created each (migration 035).
import type { StoredResponse } from '../../proto/gen/tollgate/v1/sync.js';
import type { Queryable } from './db.js';

const INSERT_CHUNK = 200;

interface Row {
  seq: number;
  response_id: string;
  project_id: string;
  model: string;
  created_at_ms: number;
  deployment: string;
}

function recordOf(r: Row): StoredResponse {
  return { seq: r.seq, responseId: r.response_id, projectId: r.project_id, model: r.model, createdAtMs: r.created_at_ms, deployment: r.deployment };
}

/**
 * Records responses, each once (a replayed report, or an id already known, adds nothing); returns
 * the records added, with their sequence numbers, in ascending seq.
 */
export async function addStoredResponses(q: Queryable, records: readonly StoredResponse[]): Promise<StoredResponse[]> {
  const added: StoredResponse[] = [];
  for (let i = 0; i < records.length; i += INSERT_CHUNK) {
    const part = records.slice(i, i + INSERT_CHUNK);
    const params: (string | number)[] = [];
    for (const r of part) params.push(r.responseId, r.projectId, r.model, r.createdAtMs, r.deployment);
    const rows = await q.all<Row>(
      `INSERT INTO stored_responses (response_id, project_id, model, created_at_ms, deployment) VALUES ${part.map(() => '(?, ?, ?, ?, ?)').join(', ')}
       ON CONFLICT (response_id) DO NOTHING RETURNING seq, response_id, project_id, model, created_at_ms, deployment`,
      params,
    );
    for (const r of rows) added.push(recordOf(r));
  }
  return added.sort((a, b) => a.seq - b.seq);
}

/** Up to `limit` records after `afterSeq` still within retention (created at or after `sinceMs`). */
export async function storedResponsesAfter(q: Queryable, afterSeq: number, sinceMs: number, limit: number): Promise<StoredResponse[]> {
  const rows = await q.all<Row>(
    'SELECT seq, response_id, project_id, model, created_at_ms, deployment FROM stored_responses WHERE seq > ? AND created_at_ms >= ? ORDER BY seq LIMIT ?',
    [afterSeq, sinceMs, limit],
  );
  return rows.map(recordOf);
}

/** Up to `limit` of one project's records after `afterSeq` still within retention, in ascending seq. */
export async function storedResponsesOfProject(q: Queryable, projectId: string, afterSeq: number, sinceMs: number, limit: number): Promise<StoredResponse[]> {
  const rows = await q.all<Row>(
    'SELECT seq, response_id, project_id, model, created_at_ms, deployment FROM stored_responses WHERE project_id = ? AND seq > ? AND created_at_ms >= ? ORDER BY seq LIMIT ?',
    [projectId, afterSeq, sinceMs, limit],
  );
  return rows.map(recordOf);
}

/** Deletes the records created before `beforeMs`; returns how many. */
export async function deleteStoredResponsesBefore(q: Queryable, beforeMs: number): Promise<number> {
  return (await q.run('DELETE FROM stored_responses WHERE created_at_ms < ?', [beforeMs])).changes;
}

/**
 * Deletes each project's records past its newest `perProject` (a project over its bound loses its
 * own oldest, never another project's); returns how many.
 */
export async function deleteStoredResponsesOverBound(q: Queryable, perProject: number): Promise<number> {
  return (
    await q.run(
      `DELETE FROM stored_responses WHERE seq IN (
         SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER (PARTITION BY project_id ORDER BY seq DESC) AS rn FROM stored_responses) WHERE rn > ?)`,
      [perProject],
    )
  ).changes;
}
