// SyncService.QueryUsage shares a small number of slots (the database queue is also ingest's): one key
// may hold at most two of them, so a key sending slow reads from many connections or nodes cannot
// make everyone else's `GET /v1/usage` answer 503. (Found by the security review: the only bound was
// eight in flight in total.)
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Metadata, status } from '@grpc/grpc-js';
import { MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_KEY, queryUsageHandler } from '../../control-plane/sync/usage-query.js';

test('one key holds at most two usage-query slots; other keys still get theirs; a finished query frees its slot', async () => {
  const pending: Array<() => void> = [];
  // A database whose reads finish only when the test says so; every read finds no key (NOT_FOUND).
  const state = { db: { readOnly: () => new Promise((resolve) => pending.push(() => resolve(null))) } };
  const handler = queryUsageHandler(state as never, 'node-token', () => {});
  const md = new Metadata();
  md.set('authorization', 'Bearer node-token');
  const answers: Array<[string, number | null]> = [];
  const ask = (keyId: string) =>
    handler({ metadata: md, request: { keyId, sinceMs: 0, untilMs: 0, groupBy: 'model' } } as never, (err) => {
      answers.push([keyId, (err as { code?: number } | null)?.code ?? null]);
    });
  assert.equal(MAX_IN_FLIGHT_PER_KEY, 2);
  assert.ok(MAX_IN_FLIGHT > MAX_IN_FLIGHT_PER_KEY);
  for (let i = 0; i < 5; i++) ask('key_greedy');
  assert.deepEqual(answers, [['key_greedy', status.RESOURCE_EXHAUSTED], ['key_greedy', status.RESOURCE_EXHAUSTED], ['key_greedy', status.RESOURCE_EXHAUSTED]]);
  ask('key_other');
  assert.equal(answers.length, 3, "another key's query runs");
  assert.equal(pending.length, 3);
  pending.shift()!();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(answers[3], ['key_greedy', status.NOT_FOUND]);
  ask('key_greedy');
  assert.equal(answers.length, 4, 'the freed slot is the key’s again');
  for (const p of pending.splice(0)) p();
  await new Promise((r) => setImmediate(r));
  assert.equal(answers.length, 7);
});
