// The request-log store: one small interface, so a column store (ClickHouse) can take the request
// logs when one SQLite file is not enough, while the control state stays in SQLite.
import type { LogRow } from '../../proto/lib/log-columns.js';

export interface StoredLog extends LogRow {
  nodeId: string;
}

export interface LogSource {
  nodeId: string;
  instanceId: string;
}

export interface LogFilter {
  keyId?: string;
  projectId?: string;
  orgId?: string;
  /** Only the sampled 401s of unknown keys. */
  unknownKeys?: boolean;
  /** Inclusive, ms since epoch. */
  sinceMs?: number;
  /** Exclusive, ms since epoch. */
  untilMs?: number;
  clientIp?: string;
  status?: number;
}

export interface LogPage {
  logs: StoredLog[];
  /** '' when there is nothing more. */
  next: string;
}

export interface LogStore {
  /**
   * Writes one report's rows in one transaction, exactly once: a (node, instance, seq) at or below
   * the last one written is a replay and changes nothing. Resolves after COMMIT.
   */
  writeBatch(source: LogSource, seq: number, rows: readonly LogRow[]): Promise<{ duplicate: boolean; written: number }>;
  /** Newest first; `pageToken` from the previous page's `next`. */
  query(filter: LogFilter, limit: number, pageToken: string): Promise<LogPage>;
  /** Drops whole partitions older than the retention; returns the partitions dropped. */
  applyRetention(): Promise<string[]>;
  close(): Promise<void>;
}
