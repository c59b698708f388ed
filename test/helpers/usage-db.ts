// Reads what the control plane recorded straight from its SQLite files (read-only, beside the running
// process in WAL mode): each model call as the request logs hold it (status, tokens, cost), usage as
// the state database sums it per key, model and minute, and counts of log rows.
import { dirname, join } from 'node:path';
import sqlite3 from 'sqlite3';
import { LogColumns } from '../../proto/gen/tollgate/v1/sync.js';
import { matchLogColumns, type LogRow } from '../../proto/lib/log-columns.js';
import { eventually } from './data-plane.js';

export interface UsageRow {
  request_id: string;
  key_id: string;
  model: string;
  path: string;
  status: number;
  reason: string;
  prompt_tokens: number;
  completion_tokens: number;
  cost_micros: number;
}

export function queryDb<T>(path: string, sql: string, params: unknown[] = []): Promise<T[]> {
  return new Promise((resolve, reject) => {
    const db = new sqlite3.Database(path, sqlite3.OPEN_READONLY, (err) => {
      if (err) return reject(err);
      db.all(sql, params, (e, rows) => {
        db.close();
        if (e) reject(e);
        else resolve(rows as T[]);
      });
    });
  });
}

/** The request-log file beside a control plane's state database (its default --logs-db). */
export function logsDbOf(dbPath: string): string {
  return join(dirname(dbPath), 'logs.db');
}

/** Every request-log row of the given keys (all keys when none are given), oldest first. */
export async function logRowsOf(dbPath: string, keyIds?: string[]): Promise<(LogRow & { nodeId: string })[]> {
  const logsPath = logsDbOf(dbPath);
  const tables = await queryDb<{ name: string }>(logsPath, "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'logblocks_%'").catch(() => []);
  const out: (LogRow & { nodeId: string })[] = [];
  for (const t of tables) {
    const blocks = await queryDb<{ node_id: string; columns: Buffer }>(logsPath, `SELECT node_id, columns FROM ${t.name} ORDER BY id`);
    for (const b of blocks) {
      const cols = LogColumns.decode(b.columns);
      for (const keyId of keyIds ?? [undefined]) {
        for (const { row } of matchLogColumns(cols, { keyId })) out.push({ ...row, nodeId: b.node_id });
      }
    }
  }
  return out.sort((a, b) => a.atMs - b.atMs || a.requestId.localeCompare(b.requestId));
}

/** A key's model calls, one per request, as its request logs record them. */
export async function usageRowsOfKey(dbPath: string, keyId: string): Promise<UsageRow[]> {
  return (await logRowsOf(dbPath, [keyId]))
    .filter((r) => r.model !== '')
    .map((r) => ({
      request_id: r.requestId,
      key_id: r.keyId,
      model: r.model,
      path: r.path,
      status: r.status,
      reason: r.reason,
      prompt_tokens: r.promptTokens,
      completion_tokens: r.completionTokens,
      cost_micros: r.costMicros,
    }));
}

/** Waits until the key has `n` model calls in the request logs (reports reach the database asynchronously by design). */
export async function waitForUsageRows(dbPath: string, keyId: string, n: number, timeoutMs = 10_000): Promise<UsageRow[]> {
  let rows: UsageRow[] = [];
  await eventually(async () => (rows = await usageRowsOfKey(dbPath, keyId)).length >= n, `${n} model calls of ${keyId} in the request logs`, timeoutMs);
  return rows;
}

export interface UsageTotalRow {
  model: string;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_micros: number;
}

/** A key's usage as the state database sums it (usage_minutes), per model. */
export function usageTotalsOfKey(dbPath: string, keyId: string): Promise<UsageTotalRow[]> {
  return queryDb<UsageTotalRow>(
    dbPath,
    `SELECT model, SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,
       SUM(cost_micros) AS cost_micros FROM usage_minutes WHERE key_id = ? GROUP BY model ORDER BY model`,
    [keyId],
  );
}

/** Waits until the key's summed usage counts `n` model calls. */
export async function waitForUsageTotals(dbPath: string, keyId: string, n: number, timeoutMs = 10_000): Promise<UsageTotalRow[]> {
  let rows: UsageTotalRow[] = [];
  await eventually(async () => (rows = await usageTotalsOfKey(dbPath, keyId)).reduce((s, r) => s + r.requests, 0) >= n, `${n} model calls of ${keyId} in usage`, timeoutMs);
  return rows;
}
