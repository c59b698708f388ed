// Usage is journaled, then folded (docs/design.md#usage-is-journaled-then-folded). A report's usage rows are appended to usage_journal
// in the report's transaction, before it is acknowledged; this folds the journal into usage_folded,
// summed per project, minute, key and model, every FOLD_EVERY_MS or as soon as FOLD_AT_ROWS rows wait,
// in one transaction that adds the rows in and deletes them (usage-repo.ts foldUsage). Readers see
// both tables through the view usage_minutes, so a fold changes no sum: it only moves rows, and the
// pages of usage_folded it dirties are written once per fold instead of once per report.
import type { Db } from '../store/db.js';
import { foldUsage, usageJournalExtent } from '../store/usage-repo.js';

/** How often the journal is folded while rows wait. */
export const FOLD_EVERY_MS = 10_000;
/** A fold starts at once when this many journal rows wait (bounds what readers of the view scan). */
export const FOLD_AT_ROWS = 20_000;
/** The most journal rows one fold transaction takes (a backlog after a restart folds in several). */
export const MAX_FOLD_ROWS = 100_000;

export class UsageFold {
  /** Journal rows committed and not folded yet (an estimate between folds: each fold recounts its extent). */
  private waiting = 0;
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<number> | null = null;
  private closed = false;
  /** The last fold failed: wait for the timer rather than retry after each report. */
  private failing = false;

  private readonly maxRows: number;

  constructor(
    private readonly db: Db,
    private readonly log: (line: string) => void = () => undefined,
    opts: { maxRows?: number } = {},
  ) {
    this.maxRows = opts.maxRows ?? MAX_FOLD_ROWS;
  }

  /** Counts what a former process left in the journal, and folds it every FOLD_EVERY_MS from now on. */
  async start(): Promise<void> {
    const extent = await this.db.read((q) => usageJournalExtent(q));
    this.waiting = extent.rows;
    this.timer = setInterval(() => void this.foldNow(), FOLD_EVERY_MS);
    this.timer.unref();
    if (this.waiting > 0) await this.foldNow();
  }

  /** A report's transaction committed `rows` journal rows (called from its afterCommit hook). */
  journaled(rows: number): void {
    this.waiting += rows;
    // After a failed fold only the timer retries: a fold that keeps failing is tried every
    // FOLD_EVERY_MS, not after every report (its rows still count meanwhile, through the view).
    if (this.waiting >= FOLD_AT_ROWS && !this.closed && !this.failing) void this.foldNow();
  }

  /** Journal rows waiting to be folded, as last counted. */
  get pending(): number {
    return this.waiting;
  }

  /**
   * Folds everything the journal holds (in transactions of at most MAX_FOLD_ROWS rows); one fold at a
   * time, a call while one runs shares it. Returns the rows folded. A failure is logged and the rows
   * not folded stay in the journal for a later fold: the view still counts them.
   */
  foldNow(): Promise<number> {
    if (this.running) return this.running;
    if (this.waiting === 0) return Promise.resolve(0);
    this.running = this.foldAll().finally(() => {
      this.running = null;
    });
    return this.running;
  }

  private async foldAll(): Promise<number> {
    let folded = 0;
    for (;;) {
      let done: { n: number; more: boolean };
      try {
        done = await this.db.tx(async (tx) => {
          const { first, last, rows } = await usageJournalExtent(tx);
          if (rows === 0) {
            tx.afterCommit(() => (this.waiting = 0));
            return { n: 0, more: false };
          }
          const upTo = Math.min(last, first + this.maxRows - 1);
          const n = await foldUsage(tx, upTo);
          tx.afterCommit(() => (this.waiting = Math.max(0, this.waiting - n)));
          return { n, more: upTo < last };
        });
      } catch (err) {
        this.failing = true;
        this.log(`usage: journal not folded (its rows still count, the next fold in ${FOLD_EVERY_MS / 1000} s retries): ${(err as Error).message}`);
        return folded;
      }
      this.failing = false;
      folded += done.n;
      if (!done.more) return folded;
    }
  }

  /** Stops the timer and folds what waits (a graceful stop leaves the journal empty). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.running;
    await this.foldNow();
  }
}
