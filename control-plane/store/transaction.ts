// One write transaction on a connection whose queue holds it (the same rules on both stores): BEGIN
// goes with the first statement, so a transaction that issues none costs none, and one whose only
// statement is `runLast` runs it alone (committed once it succeeded; an error `fn` throws after it is
// thrown after the hooks ran, as a hook's is). Hooks from afterCommit run right after COMMIT (all of
// them; if one throws, the call rejects after the others ran, and the work is committed). A fenced
// leader's store sends a lone runLast in a transaction too, after its fence. A rider (below) adds its
// row to the first transaction of its caller that writes, before COMMIT: both commit or neither.
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Param, Queryable, Tx } from './db.js';

/**
 * A row that must commit with the change it records (a console call's audit entry,
 * audit/audit-recorder.ts): set for an async context, it rides on the first of its transactions that
 * writes something; when that transaction rolls back, it stays pending for the next.
 */
export interface TxRider {
  /** The row's INSERT, or null when there is nothing (left) to write. */
  pending(): { sql: string; params: Param[] } | null;
  /** The transaction that carried the row committed. */
  carried(): void;
}

const riders = new AsyncLocalStorage<TxRider>();

export function runWithTxRider<T>(rider: TxRider, fn: () => T): T {
  return riders.run(rider, fn);
}

/** The rider of the async context running now (db.tx takes it when called, before queueing). */
export function currentTxRider(): TxRider | null {
  return riders.getStore() ?? null;
}

/** Statements that write (get/all may write too: INSERT … RETURNING). */
const READS = /^\s*(SELECT|WITH|PRAGMA|EXPLAIN)\b/i;

export async function runTransaction<T>(
  d: Queryable,
  beginSql: string,
  fn: (tx: Tx) => Promise<T>,
  observe: ((seconds: number, committed: boolean) => void) | null,
  /** False: a lone runLast is sent inside BEGIN … COMMIT too (a leader's fence must run first). */
  runLastAlone = true,
  rider: TxRider | null = null,
): Promise<T> {
  const hooks: (() => void)[] = [];
  // A rider's row needs the transaction around it, also for a lone runLast.
  if (rider) runLastAlone = false;
  let wrote = false;
  const writes = (sql: string) => void (wrote ||= !READS.test(sql));
  // idle: nothing sent; open: BEGIN sent; closing: runLast sent in the transaction; alone: runLast sent without one.
  const at: { phase: 'idle' | 'open' | 'closing' | 'alone'; beginning: Promise<void> | null; aloneDone: boolean } = { phase: 'idle', beginning: null, aloneDone: false };
  const inTransaction = () => at.phase === 'open' || at.phase === 'closing';
  // Every statement waits for BEGIN, also one sent while BEGIN is on its way (statements issued together).
  const begin = (): Promise<void> => {
    if (at.phase === 'idle') {
      at.phase = 'open';
      at.beginning = d.exec(beginSql);
    } else if (at.phase !== 'open') return Promise.reject(new Error('no statement may follow runLast in a transaction'));
    return at.beginning!;
  };
  const tx: Tx = {
    dialect: d.dialect,
    run: async (sql, params) => (await begin(), writes(sql), d.run(sql, params)),
    get: async <R>(sql: string, params?: Param[]) => (await begin(), writes(sql), d.get<R>(sql, params)),
    all: async <R>(sql: string, params?: Param[]) => (await begin(), writes(sql), d.all<R>(sql, params)),
    exec: async (sql) => (await begin(), writes(sql), d.exec(sql)),
    runPrepared: async (sql, params) => (await begin(), writes(sql), d.runPrepared(sql, params)),
    runLast: async (sql, params) => {
      wrote = true;
      if (at.phase === 'idle' && runLastAlone) {
        at.phase = 'alone';
        const r = await d.runPrepared(sql, params);
        at.aloneDone = true;
        return r;
      }
      await begin();
      at.phase = 'closing';
      return d.runPrepared(sql, params);
    },
    afterCommit: (h) => void hooks.push(h),
  };
  const began = performance.now();
  let result: T | undefined;
  // An error after a lone runLast committed: thrown once the hooks ran, like a hook's (below).
  let hookError: unknown = null;
  try {
    result = await fn(tx);
    const ride = rider && wrote && inTransaction() ? rider.pending() : null;
    if (ride) await d.runPrepared(ride.sql, ride.params);
    if (inTransaction()) await d.exec('COMMIT');
    if (ride) rider!.carried();
  } catch (err) {
    if (!at.aloneDone) {
      if (inTransaction()) await d.exec('ROLLBACK').catch(() => undefined);
      observe?.((performance.now() - began) / 1000, false);
      throw err;
    }
    hookError = err;
  }
  observe?.((performance.now() - began) / 1000, true);
  // Every hook runs, even after one threw (each publishes its own part of what was committed);
  // then the first error is thrown: the transaction is committed all the same.
  for (const h of hooks) {
    try {
      h();
    } catch (err) {
      hookError ??= err;
    }
  }
  if (hookError !== null) throw hookError;
  return result as T;
}
