// The outbox's SQL (tables of migration 015). No I/O beyond the Queryable it is given.
import type { Queryable } from '../store/db.js';

export interface DeliveryRow {
  event_id: string;
  url: string;
  status: 'pending' | 'delivered' | 'failed';
  attempts: number;
  window_start_ms: number;
  next_at_ms: number;
  last_status: number;
  last_error: string;
  last_attempt_at_ms: number;
  delivered_at_ms: number;
  type: string;
  org_id: string;
  payload: string;
  created_at_ms: number;
}

export interface DestinationRow {
  url: string;
  paused_at_ms: number;
  paused_reason: string;
  consecutive_failures: number;
  last_success_at_ms: number;
  last_failure_at_ms: number;
}

/** Writes an event and one pending delivery per url, due now. */
export async function insertEvent(q: Queryable, e: { id: string; type: string; orgId: string; payload: string; atMs: number }, urls: readonly string[]): Promise<void> {
  await q.run('INSERT INTO webhook_events (id, type, org_id, payload, created_at_ms) VALUES (?, ?, ?, ?, ?)', [e.id, e.type, e.orgId, e.payload, e.atMs]);
  for (const url of urls) {
    await q.run('INSERT INTO webhook_deliveries (event_id, url, window_start_ms, next_at_ms) VALUES (?, ?, ?, ?)', [e.id, url, e.atMs, e.atMs]);
  }
}

const DELIVERY_SELECT = `SELECT d.*, e.type, e.org_id, e.payload, e.created_at_ms FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id`;

/** Pending deliveries due at `nowMs` to destinations not paused, oldest first. */
export function dueDeliveries(q: Queryable, nowMs: number, limit: number): Promise<DeliveryRow[]> {
  return q.all<DeliveryRow>(
    `${DELIVERY_SELECT}
     WHERE d.status = 'pending' AND d.next_at_ms <= ?
       AND NOT EXISTS (SELECT 1 FROM webhook_destinations w WHERE w.url = d.url AND w.paused_at_ms > 0)
     ORDER BY d.next_at_ms, e.created_at_ms LIMIT ?`,
    [nowMs, limit],
  );
}

/** When the next pending delivery to a destination not paused is due; null when none is. */
export async function nextDueAtMs(q: Queryable): Promise<number | null> {
  const row = await q.get<{ at: number | null }>(
    `SELECT MIN(d.next_at_ms) AS at FROM webhook_deliveries d
     WHERE d.status = 'pending' AND NOT EXISTS (SELECT 1 FROM webhook_destinations w WHERE w.url = d.url AND w.paused_at_ms > 0)`,
  );
  return row?.at ?? null;
}

export async function markDelivered(q: Queryable, eventId: string, url: string, atMs: number, httpStatus: number): Promise<void> {
  await q.run(
    `UPDATE webhook_deliveries SET status = 'delivered', attempts = attempts + 1, last_status = ?, last_error = '', last_attempt_at_ms = ?, delivered_at_ms = ?
     WHERE event_id = ? AND url = ? AND status = 'pending'`,
    [httpStatus, atMs, atMs, eventId, url],
  );
  await q.run(
    `INSERT INTO webhook_destinations (url, last_success_at_ms) VALUES (?, ?)
     ON CONFLICT (url) DO UPDATE SET consecutive_failures = 0, last_success_at_ms = excluded.last_success_at_ms`,
    [url, atMs],
  );
}

/** A failed attempt: retried at `nextAtMs`, or failed for good when `nextAtMs` is null. */
export async function markAttemptFailed(q: Queryable, eventId: string, url: string, atMs: number, httpStatus: number, error: string, nextAtMs: number | null): Promise<void> {
  await q.run(
    `UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, last_status = ?, last_error = ?, last_attempt_at_ms = ?, next_at_ms = ?
     WHERE event_id = ? AND url = ? AND status = 'pending'`,
    [nextAtMs === null ? 'failed' : 'pending', httpStatus, error.slice(0, 300), atMs, nextAtMs ?? atMs, eventId, url],
  );
  await q.run(
    `INSERT INTO webhook_destinations (url, consecutive_failures, last_failure_at_ms) VALUES (?, 1, ?)
     ON CONFLICT (url) DO UPDATE SET consecutive_failures = webhook_destinations.consecutive_failures + 1, last_failure_at_ms = excluded.last_failure_at_ms`,
    [url, atMs],
  );
}

export async function pauseDestination(q: Queryable, url: string, atMs: number, reason: string): Promise<void> {
  await q.run(
    `INSERT INTO webhook_destinations (url, paused_at_ms, paused_reason) VALUES (?, ?, ?)
     ON CONFLICT (url) DO UPDATE SET paused_at_ms = excluded.paused_at_ms, paused_reason = excluded.paused_reason`,
    [url, atMs, reason.slice(0, 300)],
  );
}

/** Resumes a paused destination: its held deliveries are due now, with a fresh retry window. */
export async function resumeDestination(q: Queryable, url: string, atMs: number): Promise<boolean> {
  const r = await q.run("UPDATE webhook_destinations SET paused_at_ms = 0, paused_reason = '', consecutive_failures = 0 WHERE url = ? AND paused_at_ms > 0", [url]);
  if (r.changes === 0) return false;
  await q.run("UPDATE webhook_deliveries SET next_at_ms = ?, window_start_ms = ? WHERE url = ? AND status = 'pending'", [atMs, atMs, url]);
  return true;
}

export function listDestinationRows(q: Queryable): Promise<DestinationRow[]> {
  return q.all<DestinationRow>('SELECT * FROM webhook_destinations');
}

export function pendingCounts(q: Queryable): Promise<{ url: string; pending: number; failed: number }[]> {
  return q.all(
    `SELECT url, SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END) AS pending, SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed FROM webhook_deliveries GROUP BY url`,
  );
}

export function listDeliveries(q: Queryable, opts: { failedOnly: boolean; limit: number }): Promise<DeliveryRow[]> {
  return q.all<DeliveryRow>(
    `${DELIVERY_SELECT} ${opts.failedOnly ? "WHERE d.status = 'failed' OR (d.status = 'pending' AND d.attempts > 0)" : ''}
     ORDER BY e.created_at_ms DESC, d.url LIMIT ?`,
    [opts.limit],
  );
}

/** Inserts a mark; true when it was not there (the event it guards fires now). */
export async function setMark(q: Queryable, mark: string, atMs: number): Promise<boolean> {
  const r = await q.run('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?) ON CONFLICT DO NOTHING', [mark, atMs]);
  return r.changes === 1;
}

export async function clearMark(q: Queryable, mark: string): Promise<void> {
  await q.run('DELETE FROM webhook_marks WHERE mark = ?', [mark]);
}

/** Moves a mark to `atMs` only if it is older than `olderThanMs` (or absent); true when it moved. */
export async function refreshMarkIfOlder(q: Queryable, mark: string, atMs: number, olderThanMs: number): Promise<boolean> {
  const r = await q.run(
    `INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?) ON CONFLICT (mark) DO UPDATE SET at_ms = excluded.at_ms WHERE webhook_marks.at_ms <= ?`,
    [mark, atMs, olderThanMs],
  );
  return r.changes === 1;
}

export function loadMarks(q: Queryable): Promise<{ mark: string; at_ms: number }[]> {
  return q.all('SELECT mark, at_ms FROM webhook_marks');
}

/** Forgets delivered events and old marks older than `beforeMs`. */
export async function pruneOutbox(q: Queryable, beforeMs: number): Promise<void> {
  await q.run(
    `DELETE FROM webhook_events WHERE created_at_ms < ? AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = webhook_events.id AND d.status = 'pending')`,
    [beforeMs],
  );
  // A low-balance mark stays while the balance is low, however long: it is cleared when it recovers.
  await q.run("DELETE FROM webhook_marks WHERE at_ms < ? AND mark NOT LIKE 'org.balance.low:%'", [beforeMs]);
}
