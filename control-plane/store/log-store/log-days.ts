// What the parts of the request-log store share: the file, the options, the UTC day a row belongs to,
// and the day partitions that exist (each day is a few tables named logblocks_YYYYMMDD,
// logkeys_YYYYMMDD and the view logsink_YYYYMMDD: sqlite-log-store.ts says what they hold).
import type { Db } from '../db.js';

export const DAY_MS = 86_400_000;
export const DAY_TABLE_RE = /^logblocks_(\d{8})$/;

export interface SqliteLogStoreOptions {
  retentionDays: number;
  now(): number;
  log?(line: string): void;
  /** How often the key index of the blocks written since is written (default INDEX_EVERY_MS). */
  indexEveryMs?: number;
}

export function dayOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10).replace(/-/g, '');
}

export function dayStartMs(day: string): number {
  return Date.UTC(Number(day.slice(0, 4)), Number(day.slice(4, 6)) - 1, Number(day.slice(6, 8)));
}

export class LogDays {
  /** Day partitions that exist (kept in step with CREATE and DROP). */
  private readonly days = new Set<string>();

  constructor(
    readonly db: Db,
    readonly opts: SqliteLogStoreOptions,
  ) {}

  has(day: string): boolean {
    return this.days.has(day);
  }

  add(day: string): void {
    this.days.add(day);
  }

  delete(day: string): void {
    this.days.delete(day);
  }

  /** The day partitions that exist, oldest first. */
  sorted(): string[] {
    return [...this.days].sort();
  }
}
