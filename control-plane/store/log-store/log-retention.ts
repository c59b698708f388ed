// Retention of the request logs, in whole days: rows of days older than the retention are neither
// stored nor kept, and a day past it is dropped as whole tables (its view, blocks and key index)
// instead of deleting rows.
import { DAY_MS, dayOf, type LogDays } from './log-days.js';

/** What keeps something in memory per day, and forgets it when the day is dropped. */
export interface DayMemory {
  forgetDay(day: string): void;
}

/** The oldest day kept: rows of older days are neither stored nor kept. */
export function oldestKeptDay(days: LogDays): string {
  return dayOf(days.opts.now() - (days.opts.retentionDays - 1) * DAY_MS);
}

export class LogRetention {
  constructor(
    private readonly days: LogDays,
    private readonly memories: readonly DayMemory[],
  ) {}

  /** Drops whole partitions older than the retention; returns the partitions dropped. */
  async apply(): Promise<string[]> {
    const { db, opts } = this.days;
    const oldest = oldestKeptDay(this.days);
    const dropped: string[] = [];
    for (const day of this.days.sorted()) {
      if (day >= oldest) break;
      await db.forgetStatements(`_${day}`);
      await db.exec(`DROP VIEW IF EXISTS logsink_${day}; DROP TABLE IF EXISTS logblocks_${day}; DROP TABLE IF EXISTS logkeys_${day}; DELETE FROM log_index_cursor WHERE day = '${day}';`);
      this.days.delete(day);
      for (const m of this.memories) m.forgetDay(day);
      dropped.push(day);
    }
    if (dropped.length > 0) opts.log?.(`request logs: dropped ${dropped.length} day partition(s) older than ${opts.retentionDays} days (${dropped[0]}..${dropped[dropped.length - 1]})`);
    return dropped;
  }
}
