// Issue 35, deliverable 5: a console call's audit entry is written in the transaction of the change it
// records, on both stores. A change that rolls back leaves no entry; an entry that cannot be written
// rolls the change back (the call fails); a change that committed has its entry even when the call then
// fails; the entry is there when the answer is. Refusals, which write nothing, are recorded on their own.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { status, type ServiceError } from '@grpc/grpc-js';
import type { ConsoleServiceServer } from '../../proto/gen/tollgate/v1/console.js';
import { auditHandlers } from '../../control-plane/audit/audit-actions.js';
import { AuditRecorder, auditScope } from '../../control-plane/audit/audit-recorder.js';
import { queryAudit } from '../../control-plane/audit/audit-query.js';
import type { Db } from '../../control-plane/store/db.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { PgDb } from '../../control-plane/store/pg-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

type Kind = 'sqlite' | 'postgres';
const KINDS: Kind[] = ['sqlite', 'postgres'];

async function openDb(t: test.TestContext, kind: Kind): Promise<Db> {
  let db: Db;
  if (kind === 'postgres') {
    db = await PgDb.open(await server.createDatabase(), { writeLockKey: 1 });
    t.after(() => db.close());
  } else {
    const dir = mkdtempSync(join(tmpdir(), 'tollgate-audit-tx-'));
    db = await SqliteDb.open(join(dir, 'tollgate.db'));
    t.after(async () => {
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    });
  }
  await runMigrations(db);
  return db;
}

type Handler = (req: Record<string, unknown>) => Promise<Record<string, unknown>>;

/** One console method (createProject: `project.create`, changes) behind the audit wrapper; resolves with the answer. */
function callThrough(db: Db, handler: Handler, actor = 'operator'): Promise<{ err: ServiceError | null; res: unknown }> {
  const recorder = new AuditRecorder(db, { now: () => 1_000, retentionDays: 30, log: () => undefined });
  const raw = {
    createProject: (call: { request: Record<string, unknown> }, cb: (err: ServiceError | null, res?: unknown) => void) => {
      auditScope()!.actor = actor;
      handler(call.request).then(
        (res) => cb(null, res),
        (e: Error) => cb(Object.assign(e, { code: (e as { code?: number }).code ?? status.INTERNAL }) as ServiceError),
      );
    },
  } as unknown as ConsoleServiceServer;
  const wrapped = auditHandlers(recorder, raw);
  return new Promise((resolve) => {
    const call = { request: { orgId: 'org_a', name: 'p' }, getPeer: () => 'ipv4:127.0.0.1:5000' };
    (wrapped.createProject as unknown as (c: unknown, cb: (err: ServiceError | null, res?: unknown) => void) => void)(call, (err, res) => resolve({ err, res }));
  });
}

const marks = async (db: Db) => (await db.all<{ mark: string }>('SELECT mark FROM webhook_marks ORDER BY mark')).map((r) => r.mark);
const entries = (db: Db) => queryAudit(db, { visibleOrgs: 'all', limit: 10 });

for (const kind of KINDS) {
  test(`${kind}: a change's entry commits with it, and is there when the answer is`, async (t) => {
    const db = await openDb(t, kind);
    const { err } = await callThrough(db, async () => {
      await db.tx(async (tx) => {
        await tx.run('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?)', ['m1', 1]);
      });
      return { id: 'proj_made' };
    });
    assert.equal(err, null);
    // No waiting: the entry was written before COMMIT, so it is there as soon as the answer is.
    const rows = await entries(db);
    assert.deepEqual(rows.map((r) => [r.action, r.outcome, r.org_id, r.actor]), [['project.create', 'ok', 'org_a', 'operator']]);
    assert.deepEqual(await marks(db), ['m1']);
  });

  test(`${kind}: a change whose transaction rolls back leaves no entry`, async (t) => {
    const db = await openDb(t, kind);
    const { err } = await callThrough(db, async () =>
      db.tx(async (tx) => {
        await tx.run('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?)', ['m1', 1]);
        throw Object.assign(new Error('conflict'), { code: status.FAILED_PRECONDITION });
      }),
    );
    assert.equal(err?.code, status.FAILED_PRECONDITION);
    assert.deepEqual(await marks(db), []);
    assert.deepEqual(await entries(db), []);
  });

  test(`${kind}: an entry that cannot be written rolls its change back, and the call fails`, async (t) => {
    const db = await openDb(t, kind);
    await db.exec('ALTER TABLE audit_log RENAME TO audit_log_away');
    const { err } = await callThrough(db, async () => {
      await db.tx(async (tx) => {
        await tx.run('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?)', ['m1', 1]);
      });
      return { id: 'proj_made' };
    });
    assert.ok(err, 'the call fails');
    assert.deepEqual(await marks(db), [], 'the change was rolled back with its entry');
    await db.exec('ALTER TABLE audit_log_away RENAME TO audit_log');
    assert.deepEqual(await entries(db), []);
  });

  test(`${kind}: a change that committed keeps its one entry when the call fails afterwards; a lone runLast carries it too`, async (t) => {
    const db = await openDb(t, kind);
    const { err } = await callThrough(db, async () => {
      await db.tx((tx) => tx.runLast('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?)', ['m1', 1]));
      await db.tx(async (tx) => {
        await tx.run('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?)', ['m2', 1]);
      });
      throw Object.assign(new Error('later step failed'), { code: status.UNAVAILABLE });
    });
    assert.equal(err?.code, status.UNAVAILABLE);
    assert.deepEqual(await marks(db), ['m1', 'm2']);
    assert.deepEqual((await entries(db)).map((r) => [r.action, r.outcome]), [['project.create', 'ok']], 'one entry, written by the first transaction');
  });

  test(`${kind}: a refusal (nothing written) is recorded on its own; a transaction that only reads carries nothing`, async (t) => {
    const db = await openDb(t, kind);
    const { err } = await callThrough(
      db,
      async () => {
        await db.tx(async (tx) => void (await tx.get('SELECT COUNT(*) AS n FROM webhook_marks')));
        throw Object.assign(new Error('admin role required'), { code: status.PERMISSION_DENIED });
      },
      'acct_x',
    );
    assert.equal(err?.code, status.PERMISSION_DENIED);
    assert.deepEqual((await entries(db)).map((r) => [r.action, r.outcome, r.actor]), [['project.create', 'denied', 'acct_x']]);
  });

  test(`${kind}: work outside a console call's scope writes no entry`, async (t) => {
    const db = await openDb(t, kind);
    await db.tx(async (tx) => {
      await tx.run('INSERT INTO webhook_marks (mark, at_ms) VALUES (?, ?)', ['m1', 1]);
    });
    assert.deepEqual(await entries(db), []);
  });
}
