// One write transaction on a connection whose queue holds it (the same rules on both stores): BEGIN
// goes with the first statement, so a transaction that issues none costs none, and one whose only
// statement is `runLast` runs it alone (committed once it succeeded; an error `fn` throws after it is
// thrown after the hooks ran, as a hook's is). Hooks from afterCommit run right after COMMIT (all of
// them; if one throws, the call rejects after the others ran, and the work is committed). A fenced
// leader's store sends a lone runLast in a transaction too, after its fence.
import type { Param, Queryable, Tx } from './db.js';

export async function runTransaction<T>(
  d: Queryable,
  beginSql: string,
  fn: (tx: Tx) => Promise<T>,
  observe: ((seconds: number, committed: boolean) => void) | null,
  /** False: a lone runLast is sent inside BEGIN … COMMIT too (a leader's fence must run first). */
  runLastAlone = true,
): Promise<T> {
  const hooks: (() => void)[] = [];
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
    run: async (sql, params) => (await begin(), d.run(sql, params)),
    get: async <R>(sql: string, params?: Param[]) => (await begin(), d.get<R>(sql, params)),
    all: async <R>(sql: string, params?: Param[]) => (await begin(), d.all<R>(sql, params)),
    exec: async (sql) => (await begin(), d.exec(sql)),
    runPrepared: async (sql, params) => (await begin(), d.runPrepared(sql, params)),
    runLast: async (sql, params) => {
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
    if (inTransaction()) await d.exec('COMMIT');
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
