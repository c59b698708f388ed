// `GET /v1/usage` (SyncService.QueryUsage) reads on the database's read-only connection. Before the
// fix every usage query took a place in the one queue that report ingest and money leases use: a
// burst of eight queries put a lease write ninth in line, behind all of them.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Metadata, status } from '@grpc/grpc-js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_KEY, queryUsageHandler } from '../../control-plane/sync/usage-query.js';

const KEYS = ['key_a', 'key_b', 'key_c', 'key_d'];

async function seeded(t: import('node:test').TestContext): Promise<SqliteDb> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-usage-reads-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  await db.tx(async (tx) => {
    await tx.exec(`
      INSERT INTO accounts (id, name, token_hash, created_at) VALUES ('acct', 'a', 'h', 't');
      INSERT INTO orgs (id, name, tier, created_at) VALUES ('org', 'o', 'free', 't');
      INSERT INTO projects (id, org_id, name, created_at) VALUES ('proj', 'org', 'p', 't');
    `);
    for (const [i, k] of KEYS.entries()) {
      await tx.run(
        "INSERT INTO api_keys (id, project_id, org_id, name, key_prefix, status, rpm_limit, tpm_limit, max_parallel_requests, created_at) VALUES (?, 'proj', 'org', 'k', 'sk-...', 'active', 20, 60000, 100, 't')",
        [k],
      );
      await tx.run('INSERT INTO credentials (key_hash, key_id) VALUES (?, ?)', [`hash_${k}`, k]);
      await tx.run(
        "INSERT INTO usage_folded (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros) VALUES ('proj', ?, ?, 'demo-chat', 'org', 3, 10, 20, 7)",
        [29_000_000 + i, k],
      );
    }
  });
  return db;
}

test('a burst of usage queries takes no place in the queue of ingest and lease writes', async (t) => {
  const db = await seeded(t);
  const handler = queryUsageHandler({ db } as never, 'node-token', () => {});
  const md = new Metadata();
  md.set('authorization', 'Bearer node-token');
  const answers: Array<Promise<{ code: number | null; requests: number }>> = [];
  // As many queries as may run at once: MAX_IN_FLIGHT_PER_KEY for each of the keys.
  assert.equal(KEYS.length * MAX_IN_FLIGHT_PER_KEY, MAX_IN_FLIGHT);
  for (const keyId of KEYS) {
    for (let i = 0; i < MAX_IN_FLIGHT_PER_KEY; i++) {
      answers.push(
        new Promise((resolve) =>
          handler({ metadata: md, request: { keyId, sinceMs: 0, untilMs: 0, groupBy: 'model' } } as never, (err, res) =>
            resolve({ code: (err as { code?: number } | null)?.code ?? null, requests: res?.buckets.reduce((n, b) => n + b.requests, 0) ?? -1 }),
          ),
        ),
      );
    }
  }
  assert.equal(db.queueDepth, 0, 'no usage query waits in the writer queue');
  // A money lease's write, issued in the middle of the burst, is first in its queue.
  let leaseRan = false;
  const lease = db.tx(async (tx) => {
    await tx.run("UPDATE orgs SET funds_version = funds_version + 1 WHERE id = 'org'");
    leaseRan = true;
  });
  assert.equal(db.queueDepth, 1, 'the lease write is first in line');
  await lease;
  assert.ok(leaseRan);
  // The queries still answer, from the last committed state (a key reads its whole project's usage).
  for (const a of await Promise.all(answers)) assert.deepEqual(a, { code: null, requests: 3 * KEYS.length });
  assert.equal(await db.readerQueueDepth(), 0);
});

test('the read-only connection sees each commit and cannot write', async (t) => {
  const db = await seeded(t);
  await db.tx((tx) => tx.run("UPDATE usage_folded SET requests = 5 WHERE key_id = 'key_a'"));
  assert.deepEqual(await db.readOnly((q) => q.get("SELECT requests FROM usage_minutes WHERE key_id = 'key_a'")), { requests: 5 });
  await assert.rejects(db.readOnly((q) => q.run("DELETE FROM usage_folded")), /SQLITE_READONLY/);
  assert.deepEqual(await db.readOnly((q) => q.get('SELECT COUNT(*) AS n FROM usage_minutes')), { n: KEYS.length });
  // A revoked key (its credential gone) is refused from the read-only connection too.
  await db.tx((tx) => tx.run("DELETE FROM credentials WHERE key_id = 'key_b'"));
  const handler = queryUsageHandler({ db } as never, 'node-token', () => {});
  const md = new Metadata();
  md.set('authorization', 'Bearer node-token');
  const code = await new Promise<number | null>((resolve) =>
    handler({ metadata: md, request: { keyId: 'key_b', sinceMs: 0, untilMs: 0, groupBy: 'model' } } as never, (err) => resolve((err as { code?: number } | null)?.code ?? null)),
  );
  assert.equal(code, status.NOT_FOUND);
});
