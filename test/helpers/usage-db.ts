// Reads the control plane's usage rows straight from its SQLite file (read-only, beside the running
// process in WAL mode), for tests that assert what was recorded for one request: status and cost.
import sqlite3 from 'sqlite3';
import { eventually } from './data-plane.js';

export interface UsageRow {
  request_id: string;
  key_id: string;
  model: string;
  path: string;
  status: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_micros: number;
}

export function usageRowsOfKey(dbPath: string, keyId: string): Promise<UsageRow[]> {
  return new Promise((resolve, reject) => {
    const db = new sqlite3.Database(dbPath, sqlite3.OPEN_READONLY, (err) => {
      if (err) return reject(err);
      db.all('SELECT * FROM usage WHERE key_id = ? ORDER BY at_ms, request_id', [keyId], (e, rows) => {
        db.close();
        if (e) reject(e);
        else resolve(rows as UsageRow[]);
      });
    });
  });
}

/** Waits until the key has `n` usage rows (reports reach the database asynchronously by design). */
export async function waitForUsageRows(dbPath: string, keyId: string, n: number, timeoutMs = 10_000): Promise<UsageRow[]> {
  let rows: UsageRow[] = [];
  await eventually(async () => (rows = await usageRowsOfKey(dbPath, keyId)).length >= n, `${n} usage rows of ${keyId}`, timeoutMs);
  return rows;
}
