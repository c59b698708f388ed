// Who leads among control planes on one PostgreSQL database (issue 35, deliverable 2), on a real
// server: the leader lock is one session's, taking it raises the epoch, a leader whose lock
// connection is terminated is told at once, and a former leader's write (a lone statement included)
// fails the epoch check in the database and lands nothing; its store then refuses every write.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { PgDb } from '../../control-plane/store/pg-db.js';
import { PgLeadership } from '../../control-plane/store/pg-leadership.js';
import { FENCED_SQLSTATE, STATE_WRITE_LOCK } from '../../control-plane/store/pg-locks.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { toServiceError } from '../../control-plane/errors.js';

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

const quiet = { log: () => undefined, retryMs: 50 };

async function adminOf(url: string, t: { after(fn: () => unknown): void }): Promise<pg.Client> {
  const admin = new pg.Client({ connectionString: server.adminUrl(new URL(url).pathname.slice(1)) });
  await admin.connect();
  t.after(() => admin.end());
  return admin;
}

test('one control plane leads (epoch 1); another stands by and reads the address the leader wrote', async (t) => {
  const url = await server.createDatabase();
  const a = new PgLeadership(url, quiet);
  const b = new PgLeadership(url, quiet);
  t.after(() => Promise.all([a.stop(), b.stop()]));
  assert.equal(await a.tryLead(), true);
  assert.equal(a.epoch, 1);
  await a.advertise('10.0.0.1:50051');
  assert.equal(await b.tryLead(), false);
  assert.equal(b.leaderAddress, '10.0.0.1:50051');
  // Stopping ends the lock's session: the standby leads at once, with the next epoch.
  await a.stop();
  assert.equal(await b.tryLead(), true);
  assert.equal(b.epoch, 2);
});

test('a leader whose lock connection is terminated is told at once; the standby then leads with the next epoch', async (t) => {
  const url = await server.createDatabase();
  const admin = await adminOf(url, t);
  const a = new PgLeadership(url, quiet);
  const b = new PgLeadership(url, quiet);
  t.after(() => Promise.all([a.stop(), b.stop()]));
  assert.equal(await a.tryLead(), true);
  const lost = new Promise<string>((resolve) => a.onLost(resolve));
  assert.equal(await b.tryLead(), false);
  await admin.query(
    "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objid = $1 AND l.granted",
    [0x7011_0003],
  );
  assert.match(await lost, /lock connection/);
  assert.equal(await b.waitToLead(() => undefined), true);
  assert.equal(b.epoch, 2);
});

test("a former leader's write fails the epoch check and lands nothing, a lone statement too; then its store refuses writes before sending them", async (t) => {
  const url = await server.createDatabase();
  const a = new PgLeadership(url, quiet);
  t.after(() => a.stop());
  assert.equal(await a.tryLead(), true);
  const fenced: Error[] = [];
  const old = await PgDb.open(url, { writeLockKey: STATE_WRITE_LOCK, fence: { epoch: a.epoch, onFenced: (e) => fenced.push(e) } });
  t.after(() => old.close());
  await old.exec('CREATE TABLE t (v INTEGER)');
  await old.run('INSERT INTO t (v) VALUES (1)');

  // Another control plane takes the lead.
  await a.stop();
  const b = new PgLeadership(url, quiet);
  t.after(() => b.stop());
  assert.equal(await b.tryLead(), true);
  await b.advertise('10.0.0.2:50051');

  // A lone statement (what a report is) runs fenced too: refused by the database.
  const err = await old.tx((tx) => tx.runLast('INSERT INTO t (v) VALUES (2)', [])).then(
    () => null,
    (e: Error & { code?: string }) => e,
  );
  assert.match(err!.message, /this control plane led in epoch 1, another leads in epoch 2: the leader is at 10\.0\.0\.2:50051/);
  assert.equal(fenced.length, 1);
  assert.equal((fenced[0] as Error & { code?: string }).code, FENCED_SQLSTATE, 'the database refused it');
  // The caller gets the lead lost, a catalog error, not a bug logged with its stack (the leader gate
  // then answers the call as a standby's).
  const logged: string[] = [];
  const answered = toServiceError(err, (line) => logged.push(line));
  assert.equal(answered.code, GrpcStatus.FAILED_PRECONDITION);
  assert.match(String(answered.details), /write refused: this control plane led in epoch 1/);
  assert.deepEqual(logged, []);
  // From now on nothing is sent: refused here at once.
  const sent = old.statementsIssued;
  await assert.rejects(old.run('INSERT INTO t (v) VALUES (3)'), /write refused/);
  assert.equal(old.statementsIssued, sent);

  // The new leader's store writes; what the former leader tried after the takeover never landed.
  const current = await PgDb.open(url, { writeLockKey: STATE_WRITE_LOCK, fence: { epoch: b.epoch, onFenced: () => assert.fail('the leader was fenced') } });
  t.after(() => current.close());
  await current.tx((tx) => tx.runLast('INSERT INTO t (v) VALUES (4)', []));
  assert.deepEqual(await current.all('SELECT v FROM t ORDER BY v'), [{ v: 1 }, { v: 4 }]);
});
