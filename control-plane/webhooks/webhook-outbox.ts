// The outbox's SQL (tables of migration 015). No I/O beyond the Queryable it is given. A delivery is
// pending (due at next_at_ms), held (its destination is paused: outside the due index's range, so a
// pass never reads it; pruned by age and count), delivered or failed. URLs are stored redacted
// (gateway-config/webhook-url.ts).
import type { Db, Queryable } from '../store/db.js';

export interface DeliveryRow {
  event_id: string;
  url: string;
  status: 'pending' | 'held' | 'delivered' | 'failed';
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

/** Writes an event and one delivery per url, due now (held when its destination is paused). */
export async function insertEvent(q: Queryable, e: { id: string; type: string; orgId: string; payload: string; atMs: number }, urls: readonly string[]): Promise<void> {
  await q.run('INSERT INTO webhook_events (id, type, org_id, payload, created_at_ms) VALUES (?, ?, ?, ?, ?)', [e.id, e.type, e.orgId, e.payload, e.atMs]);
  for (const url of urls) {
    await q.run(
      `INSERT INTO webhook_deliveries (event_id, url, status, window_start_ms, next_at_ms)
       VALUES (?, ?, CASE WHEN EXISTS (SELECT 1 FROM webhook_destinations w WHERE w.url = ? AND w.paused_at_ms > 0) THEN 'held' ELSE 'pending' END, ?, ?)`,
      [e.id, url, url, e.atMs, e.atMs],
    );
  }
}

const DELIVERY_SELECT = `SELECT d.*, e.type, e.org_id, e.payload, e.created_at_ms FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id`;

/** Pending deliveries due at `nowMs`, oldest first (a paused destination's are held: not read). */
export function dueDeliveries(q: Queryable, nowMs: number, limit: number): Promise<DeliveryRow[]> {
  return q.all<DeliveryRow>(
    `${DELIVERY_SELECT}
     WHERE d.status = 'pending' AND d.next_at_ms <= ?
     ORDER BY d.next_at_ms, e.created_at_ms LIMIT ?`,
    [nowMs, limit],
  );
}

/** When the next pending delivery is due; null when none is. */
export async function nextDueAtMs(q: Queryable): Promise<number | null> {
  const row = await q.get<{ at: number | null }>("SELECT MIN(d.next_at_ms) AS at FROM webhook_deliveries d WHERE d.status = 'pending'");
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

/** Pauses a destination: its pending deliveries are held until it resumes. */
export async function pauseDestination(q: Queryable, url: string, atMs: number, reason: string): Promise<void> {
  await q.run(
    `INSERT INTO webhook_destinations (url, paused_at_ms, paused_reason) VALUES (?, ?, ?)
     ON CONFLICT (url) DO UPDATE SET paused_at_ms = excluded.paused_at_ms, paused_reason = excluded.paused_reason`,
    [url, atMs, reason.slice(0, 300)],
  );
  await q.run("UPDATE webhook_deliveries SET status = 'held' WHERE url = ? AND status = 'pending'", [url]);
}

/** Resumes a paused destination: its held deliveries are due now, with a fresh retry window. */
export async function resumeDestination(q: Queryable, url: string, atMs: number): Promise<boolean> {
  const r = await q.run("UPDATE webhook_destinations SET paused_at_ms = 0, paused_reason = '', consecutive_failures = 0 WHERE url = ? AND paused_at_ms > 0", [url]);
  if (r.changes === 0) return false;
  await q.run("UPDATE webhook_deliveries SET status = 'pending', next_at_ms = ?, window_start_ms = ? WHERE url = ? AND status IN ('pending', 'held')", [atMs, atMs, url]);
  return true;
}

/**
 * Drops a paused destination's held deliveries created before `beforeMs`, then all but its newest
 * `keep`: what a destination paused for long holds stays bounded. Returns how many went, per url.
 */
export async function pruneHeld(q: Queryable, beforeMs: number, keep: number): Promise<Map<string, number>> {
  const dropped = new Map<string, number>();
  const paused = await q.all<{ url: string }>('SELECT url FROM webhook_destinations WHERE paused_at_ms > 0');
  for (const { url } of paused) {
    const old = await q.run(
      `DELETE FROM webhook_deliveries WHERE url = ? AND status = 'held'
         AND event_id IN (SELECT id FROM webhook_events WHERE created_at_ms < ?)`,
      [url, beforeMs],
    );
    const over = await q.run(
      `DELETE FROM webhook_deliveries WHERE url = ? AND status = 'held' AND event_id NOT IN (
         SELECT d.event_id FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id
         WHERE d.url = ? AND d.status = 'held' ORDER BY e.created_at_ms DESC, d.event_id DESC LIMIT ?)`,
      [url, url, keep],
    );
    if (old.changes + over.changes > 0) dropped.set(url, old.changes + over.changes);
  }
  return dropped;
}

/**
 * Rows written before the outbox stored URLs redacted (issue 35): each URL rewritten to its redacted
 * form, once, at start (a row that would then collide with one already redacted is dropped).
 */
export async function redactStoredUrls(db: Db, redact: (url: string) => string): Promise<number> {
  const rows = await db.all<{ url: string }>(
    "SELECT DISTINCT url FROM webhook_deliveries WHERE url LIKE '%?%' OR url LIKE '%#%' UNION SELECT url FROM webhook_destinations WHERE url LIKE '%?%' OR url LIKE '%#%'",
  );
  let rewritten = 0;
  for (const { url } of rows) {
    const to = redact(url);
    if (to === url || to === '') continue;
    await db.tx(async (tx) => {
      await tx.run('DELETE FROM webhook_deliveries WHERE url = ? AND event_id IN (SELECT event_id FROM webhook_deliveries WHERE url = ?)', [url, to]);
      await tx.run('UPDATE webhook_deliveries SET url = ? WHERE url = ?', [to, url]);
      await tx.run('DELETE FROM webhook_destinations WHERE url = ? AND EXISTS (SELECT 1 FROM webhook_destinations w WHERE w.url = ?)', [url, to]);
      await tx.run('UPDATE webhook_destinations SET url = ? WHERE url = ?', [to, url]);
    });
    rewritten++;
  }
  return rewritten;
}

export function listDestinationRows(q: Queryable): Promise<DestinationRow[]> {
  return q.all<DestinationRow>('SELECT * FROM webhook_destinations');
}

export function pendingCounts(q: Queryable): Promise<{ url: string; pending: number; failed: number }[]> {
  return q.all(
    `SELECT url, SUM(CASE WHEN status IN ('pending', 'held') THEN 1 ELSE 0 END) AS pending, SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed FROM webhook_deliveries GROUP BY url`,
  );
}

export function listDeliveries(q: Queryable, opts: { failedOnly: boolean; limit: number }): Promise<DeliveryRow[]> {
  return q.all<DeliveryRow>(
    `${DELIVERY_SELECT} ${opts.failedOnly ? "WHERE d.status = 'failed' OR (d.status IN ('pending', 'held') AND d.attempts > 0)" : ''}
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
    `DELETE FROM webhook_events WHERE created_at_ms < ? AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = webhook_events.id AND d.status IN ('pending', 'held'))`,
    [beforeMs],
  );
  // A low-balance mark stays while the balance is low, however long: it is cleared when it recovers.
  await q.run("DELETE FROM webhook_marks WHERE at_ms < ? AND mark NOT LIKE 'org.balance.low:%'", [beforeMs]);
}
