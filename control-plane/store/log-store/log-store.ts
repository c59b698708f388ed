// The request-log store: one small interface, so a column store (ClickHouse) can take the request
// logs when one SQLite file is not enough, while the control state stays in SQLite.
import type { RequestLog } from '../../../proto/gen/tollgate/v1/console.js';
import type { LogBlock } from '../../../proto/gen/tollgate/v1/sync.js';

/** A stored entry: a node's row with the node that sent it (what the console answers). */
export type StoredLog = RequestLog;

export interface LogSource {
  nodeId: string;
  instanceId: string;
}

/** One report's blocks. */
export interface LogPart {
  seq: number;
  blocks: readonly LogBlock[];
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
   * Writes the blocks of one or more consecutive reports (seq ascending) in one transaction, exactly
   * once: a report whose (node, instance, seq) is at or below the last one written is a replay and
   * changes nothing. Resolves after COMMIT.
   */
  writeBlocks(source: LogSource, parts: readonly LogPart[]): Promise<{ duplicate: boolean; written: number }>;
  /** Whether a page token has the form this store gives (a token is never trusted beyond that). */
  isPageToken(token: string): boolean;
  /** Newest first; `pageToken` from the previous page's `next`. */
  query(filter: LogFilter, limit: number, pageToken: string): Promise<LogPage>;
  /** Drops whole partitions older than the retention; returns the partitions dropped. */
  applyRetention(): Promise<string[]>;
  close(): Promise<void>;
  /** PostgreSQL: every write is refused from now on (a leader that lost the lead). */
  refuseWrites?(reason: string): void;
}
