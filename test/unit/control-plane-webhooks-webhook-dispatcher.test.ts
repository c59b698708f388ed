import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { parseWebhooksConfig, type WebhookSettings } from '../../control-plane/gateway-config/webhook-config.js';
import { backoffMs, MAX_BACKOFF_MS, RETRY_WINDOW_MS, WebhookDispatcher } from '../../control-plane/webhooks/webhook-dispatcher.js';
import { WebhookEvents } from '../../control-plane/webhooks/webhook-events.js';
import { listDeliveries, listDestinationRows } from '../../control-plane/webhooks/webhook-outbox.js';
import { startWebhookReceiver } from '../helpers/webhook-receiver.js';

test('backoff doubles from the initial delay, jittered in [0.5, 1), capped', () => {
  const rows: [number, number, number, number][] = [
    // initial, failed attempts, random, expected
    [5000, 1, 0, 2500],
    [5000, 1, 0.999999, 4999],
    [5000, 2, 0, 5000],
    [5000, 3, 0.5, 15000],
    [5000, 12, 0, 5_120_000],
    [5000, 13, 0, MAX_BACKOFF_MS / 2],
    [5000, 200, 0.999999, 14_399_992],
  ];
  for (const [initial, failed, random, expected] of rows) assert.equal(backoffMs(initial, failed, random), expected, `${initial} ${failed} ${random}`);
});

async function setup(t: import('node:test').TestContext, url: string, secret: string) {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-webhooks-'));
  const db = await SqliteDb.open(join(dir, 'state.db'));
  t.after(async () => {
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  });
  await runMigrations(db);
  const settings: WebhookSettings = parseWebhooksConfig([{ url, secret_env: 'HOOK_SECRET', events: ['*'], retry_initial_ms: 1000 }], undefined, { HOOK_SECRET: secret });
  const clock = { ms: Date.now() };
  const now = () => clock.ms;
  // No timer fires: the test runs each pass itself, at the times it chooses.
  const dispatcher = new WebhookDispatcher(db, { now, settings: () => settings, random: () => 0, timers: { set: () => 0, clear: () => undefined }, log: () => undefined });
  const events = await WebhookEvents.open(db, { now, settings: () => settings });
  return { db, clock, dispatcher, events };
}

test('a failing destination is retried on the backoff schedule with the same webhook-id, and delivered once', async (t) => {
  const recv = await startWebhookReceiver();
  t.after(() => recv.close());
  const { db, clock, dispatcher, events } = await setup(t, recv.url, recv.secret);
  recv.answers = [500, 503];
  const id = await db.tx((tx) => events.enqueue(tx, 'node.disconnected', '', { node_id: 'n1' }));
  assert.ok(id);

  assert.equal(await dispatcher.runDue(), 1);
  assert.equal(recv.received.length, 1);
  // Not due yet: 1000 ms × 2^0 × 0.5 (random 0) = 500 ms later.
  clock.ms += 499;
  assert.equal(await dispatcher.runDue(), 0);
  clock.ms += 1;
  assert.equal(await dispatcher.runDue(), 1);
  // Second failure: 1000 ms × 2 × 0.5.
  clock.ms += 999;
  assert.equal(await dispatcher.runDue(), 0);
  clock.ms += 1;
  assert.equal(await dispatcher.runDue(), 1);
  clock.ms += 3_600_000;
  assert.equal(await dispatcher.runDue(), 0, 'delivered: never sent again');

  assert.deepEqual(recv.received.map((r) => r.answered), [500, 503, 204]);
  assert.deepEqual(new Set(recv.received.map((r) => r.id)), new Set([id]));
  for (const r of recv.received) assert.ok(r.signatureMatches, 'every attempt is signed afresh, and verifies');
  assert.ok(recv.received[0].verified, 'standardwebhooks verify() accepts the first attempt');
  assert.equal(recv.received[0].type, 'node.disconnected');
  const [d] = await listDeliveries(db, { failedOnly: false, limit: 10 });
  assert.equal(d.status, 'delivered');
  assert.equal(d.attempts, 3);
});

test('a destination that fails for 24 hours is paused; its later events wait, and a resume sends them', async (t) => {
  const recv = await startWebhookReceiver();
  t.after(() => recv.close());
  const { db, clock, dispatcher, events } = await setup(t, recv.url, recv.secret);
  recv.fallback = 500;
  const first = await db.tx((tx) => events.enqueue(tx, 'key.created', 'org_1', { key_id: 'key_1' }));
  const start = clock.ms;
  let attempts = 0;
  while (clock.ms - start < RETRY_WINDOW_MS + MAX_BACKOFF_MS) {
    attempts += await dispatcher.runDue();
    clock.ms += 60_000;
  }
  const [failed] = await listDeliveries(db, { failedOnly: true, limit: 10 });
  assert.equal(failed.event_id, first);
  assert.equal(failed.status, 'failed');
  assert.equal(failed.attempts, attempts);
  // Doubling from 1 s to at most 4 h (halved by the jitter) inside 24 h.
  assert.ok(attempts >= 10 && attempts <= 30, `attempts ${attempts}`);
  const [dest] = await listDestinationRows(db);
  assert.ok(dest.paused_at_ms > 0, 'paused');
  assert.match(dest.paused_reason, /undelivered for 24 h/);

  const held = await db.tx((tx) => events.enqueue(tx, 'key.revoked', 'org_1', { key_id: 'key_1' }));
  const before = recv.received.length;
  clock.ms += 3_600_000;
  assert.equal(await dispatcher.runDue(), 0, 'nothing is sent to a paused destination');
  assert.equal(recv.received.length, before);

  recv.fallback = 200;
  assert.equal(await dispatcher.resume(recv.url), true);
  assert.equal(await dispatcher.runDue(), 1);
  assert.equal(recv.received.at(-1)!.id, held);
  assert.ok(recv.received.at(-1)!.signatureMatches);
});
