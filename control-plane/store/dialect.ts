// The few expressions SQLite and PostgreSQL spell differently. Every other statement of the repos is
// written once, in SQL both take (`?` placeholders, ON CONFLICT, RETURNING, CASE).
import type { Queryable } from './db.js';

/** The larger of two values: SQLite's two-argument MAX, PostgreSQL's GREATEST. */
export function greatest(q: Queryable, a: string, b: string): string {
  return q.dialect === 'postgres' ? `GREATEST(${a}, ${b})` : `MAX(${a}, ${b})`;
}

/** A subquery of the strings of a JSON array given as parameter `param` (`?` or `?N`): `x IN ${textList(q)}`. */
export function textList(q: Queryable, param = '?'): string {
  return q.dialect === 'postgres' ? `(SELECT value FROM jsonb_array_elements_text(${param}::jsonb))` : `(SELECT value FROM json_each(${param}))`;
}

/** The UTC day ("YYYY-MM-DD") of a minute number (minutes since the epoch). */
export function utcDayOfMinute(q: Queryable, minute: string): string {
  return q.dialect === 'postgres'
    ? `to_char(to_timestamp(${minute} * 60) AT TIME ZONE 'UTC', 'YYYY-MM-DD')`
    : `strftime('%Y-%m-%d', ${minute} * 60, 'unixepoch')`;
}
