// The control plane's record of stored responses (the Responses API): each id written once whatever
// replays it, sent to a connecting node after the seq it holds and then as written, and deleted once
// past the 30-day retention.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { StoredResponse } from '../../proto/gen/tollgate/v1/sync.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { STORED_RESPONSE_RETENTION_MS, StoredResponsesFanout } from '../../control-plane/sync/stored-responses.js';

const DAY = 24 * 60 * 60 * 1000;
const rec = (id: string, createdAtMs: number): StoredResponse => ({ responseId: id, projectId: 'p1', model: 'm', createdAtMs, seq: 0, deployment: '' });

test('records are written once, sent after the seq a node holds then live, and pruned past retention', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-stored-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  let now = 40 * DAY;
  const lines: string[] = [];
  const fanout = new StoredResponsesFanout(db, () => now, (l) => lines.push(l));
  // The catch-up reads the database in steps (the highest seq, then a page), each queued behind the
  // statement before it: three statements queued after it have run once its page was sent.
  const caughtUp = async () => {
    for (let i = 0; i < 3; i++) await db.get('SELECT 1');
  };
  const live: StoredResponse[][] = [];
  const detachLive = fanout.attach((r) => live.push(r), 0);

  const old = now - STORED_RESPONSE_RETENTION_MS - 1;
  await db.tx((tx) => fanout.write(tx, [rec('resp_old', old), rec('resp_a', now - DAY), rec('resp_b', now), rec('', now), rec('resp_bad', Number.NaN)]));
  // A replay (or another node naming the same id) adds nothing.
  await db.tx((tx) => fanout.write(tx, [rec('resp_a', now)]));
  await new Promise((r) => setImmediate(r));
  // Already past retention when reported: not kept.
  assert.deepEqual(live.flat().map((r) => r.responseId), ['resp_a', 'resp_b']);
  const seqOfA = live.flat().find((r) => r.responseId === 'resp_a')!.seq;
  detachLive();

  // A node holding up to resp_a's seq is sent only what came after; one holding nothing, all within retention.
  const after: StoredResponse[][] = [];
  fanout.attach((r) => after.push(r), seqOfA)();
  const all: StoredResponse[][] = [];
  const detachAll = fanout.attach((r) => all.push(r), 0);
  await caughtUp();
  assert.deepEqual(after.flat().map((r) => r.responseId), []);
  assert.deepEqual(all.flat().map((r) => r.responseId), ['resp_a', 'resp_b']);
  detachAll();
  const fresh: StoredResponse[][] = [];
  const detachFresh = fanout.attach((r) => fresh.push(r), seqOfA);
  await caughtUp();
  assert.deepEqual(fresh.flat().map((r) => r.responseId), ['resp_b']);
  detachFresh();

  // Retention: a record is deleted once older than 30 days.
  fanout.start();
  fanout.stop();
  await db.get('SELECT 1');
  assert.deepEqual((await db.all<{ response_id: string }>('SELECT response_id FROM stored_responses ORDER BY seq')).map((r) => r.response_id), ['resp_a', 'resp_b']);
  now += STORED_RESPONSE_RETENTION_MS;
  fanout.start();
  fanout.stop();
  await db.get('SELECT 1');
  assert.deepEqual((await db.all<{ response_id: string }>('SELECT response_id FROM stored_responses ORDER BY seq')).map((r) => r.response_id), ['resp_b']);
  assert.deepEqual(lines, []);
});

test("each project keeps its newest records up to the bound; another project's are never deleted for it", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-stored-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  const now = 40 * DAY;
  const fanout = new StoredResponsesFanout(db, () => now, () => {}, () => 3);
  const of = (project: string, id: string): StoredResponse => ({ ...rec(id, now), projectId: project });
  await db.tx((tx) => fanout.write(tx, [of('p2', 'b1'), ...Array.from({ length: 8 }, (_, i) => of('p1', `a${i}`)), of('p2', 'b2')]));
  await fanout.prune();
  const left = await db.all<{ response_id: string }>('SELECT response_id FROM stored_responses ORDER BY seq');
  assert.deepEqual(left.map((r) => r.response_id), ['b1', 'a5', 'a6', 'a7', 'b2']);
});

test("a node placing records by project is sent its projects' only; a project it asks for, all its retained records, then that project caught up, then each new one", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-stored-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  const now = 40 * DAY;
  const fanout = new StoredResponsesFanout(db, () => now, () => {});
  const of = (project: string, id: string): StoredResponse => ({ ...rec(id, now), projectId: project });
  await db.tx((tx) => fanout.write(tx, [of('p1', 'resp_p1_a'), of('p2', 'resp_p2_a'), of('p3', 'resp_p3_a')]));
  // Messages as sent: [ids, caught-up projects].
  const sent: Array<[string[], string[]]> = [];
  const sub = fanout.attachByProject((records, caughtUp) => sent.push([records.map((r) => r.responseId), caughtUp]), 0, ['p1']);
  const settle = async () => {
    for (let i = 0; i < 4; i++) await db.get('SELECT 1');
  };
  await settle();
  assert.deepEqual(sent, [[['resp_p1_a'], []]], "the catch-up after its seq: its project's records only");
  sent.length = 0;
  sub.want(['p2']);
  await settle();
  assert.deepEqual(sent, [[['resp_p2_a'], ['p2']]]);
  sent.length = 0;
  // Asked again: nothing more.
  sub.want(['p2']);
  await db.tx((tx) => fanout.write(tx, [of('p1', 'resp_p1_b'), of('p2', 'resp_p2_b'), of('p3', 'resp_p3_b')]));
  await settle();
  assert.deepEqual(sent, [[['resp_p1_b', 'resp_p2_b'], []]], 'new records: of its projects only');
  sub.detach();
  await db.tx((tx) => fanout.write(tx, [of('p1', 'resp_p1_c')]));
  await settle();
  assert.equal(sent.length, 1, 'nothing after the detach');
});
