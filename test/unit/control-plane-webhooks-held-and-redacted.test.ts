// Issue 35, deliverable 5, on both stores: a paused destination's deliveries are held, so a dispatcher
// pass never reads them, and they are pruned by age and count; a destination URL's query (a receiver's
// token) reaches the destination only: never the outbox, a log line, or the console's webhook answers.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Db, Param, Queryable } from '../../control-plane/store/db.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { PgDb } from '../../control-plane/store/pg-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { parseWebhooksConfig, type WebhookSettings } from '../../control-plane/gateway-config/webhook-config.js';
import { redactedUrl } from '../../control-plane/gateway-config/webhook-url.js';
import { RETRY_WINDOW_MS, WebhookDispatcher } from '../../control-plane/webhooks/webhook-dispatcher.js';
import { WebhookEvents } from '../../control-plane/webhooks/webhook-events.js';
import { WebhookAdmin } from '../../control-plane/webhooks/webhook-admin.js';
import { dueDeliveries, insertEvent, nextDueAtMs, pauseDestination, redactStoredUrls } from '../../control-plane/webhooks/webhook-outbox.js';
import { startWebhookReceiver } from '../helpers/webhook-receiver.js';
import { startPostgres, type PostgresServer } from '../helpers/postgres-server.js';

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(() => server?.stop());

type Kind = 'sqlite' | 'postgres';
const KINDS: Kind[] = ['sqlite', 'postgres'];
const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const PAUSED = 'http://127.0.0.1:1/paused';

async function openDb(t: test.TestContext, kind: Kind): Promise<Db> {
  let db: Db;
  if (kind === 'postgres') {
    db = await PgDb.open(await server.createDatabase(), { writeLockKey: 1 });
    t.after(() => db.close());
  } else {
    const dir = mkdtempSync(join(tmpdir(), 'tollgate-held-'));
    db = await SqliteDb.open(join(dir, 'tollgate.db'));
    t.after(async () => {
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    });
  }
  await runMigrations(db);
  return db;
}

function settingsOf(urls: string[]): WebhookSettings {
  return parseWebhooksConfig(
    urls.map((url) => ({ url, secret_env: 'HOOK_SECRET', events: ['*'], retry_initial_ms: 1000 })),
    undefined,
    { HOOK_SECRET: SECRET },
  );
}

function dispatcherOf(db: Db, settings: WebhookSettings, clock: { ms: number }, lines: string[] = [], held?: { ageMs: number; count: number }) {
  return new WebhookDispatcher(db, {
    now: () => clock.ms,
    settings: () => settings,
    random: () => 0,
    timers: { set: () => 0, clear: () => undefined },
    log: (line, fields) => void lines.push(`${line} ${JSON.stringify(fields ?? {})}`),
    heldMaxAgeMs: held?.ageMs,
    heldMaxCount: held?.count,
  });
}

/** The SQL and parameters a repo function sends (it runs nothing). */
async function sqlOf(dialect: Db['dialect'], fn: (q: Queryable) => Promise<unknown>): Promise<{ sql: string; params: Param[] }> {
  let seen: { sql: string; params: Param[] } | null = null;
  const grab = async (sql: string, params: Param[] = []) => ((seen = { sql, params }), []);
  await fn({ dialect, all: grab, get: async (sql: string, params?: Param[]) => (await grab(sql, params), undefined) } as unknown as Queryable);
  return seen!;
}

/** Rows of webhook_deliveries a statement reads: PostgreSQL's EXPLAIN ANALYZE; SQLite: its plan searches the due index from status = pending only, so it reads that range (counted). */
async function deliveryRowsRead(db: Db, stmt: { sql: string; params: Param[] }, nowMs: number): Promise<number> {
  if (db.dialect === 'postgres') {
    await db.exec('ANALYZE webhook_deliveries');
    const [row] = await db.all<{ 'QUERY PLAN': unknown }>(`EXPLAIN (ANALYZE, FORMAT JSON) ${stmt.sql}`, stmt.params);
    let read = 0;
    const walk = (n: Record<string, any>) => {
      if (n['Relation Name'] === 'webhook_deliveries') read += n['Actual Rows'] * n['Actual Loops'] + (n['Rows Removed by Filter'] ?? 0) + (n['Rows Removed by Index Recheck'] ?? 0);
      for (const c of n.Plans ?? []) walk(c);
    };
    walk((row['QUERY PLAN'] as { Plan: Record<string, any> }[])[0].Plan);
    return read;
  }
  const plan = (await db.all<{ detail: string }>(`EXPLAIN QUERY PLAN ${stmt.sql}`, stmt.params)).map((r) => r.detail);
  const deliveries = plan.filter((d) => /\bwebhook_deliveries\b|\bd\b/.test(d) && !/webhook_events|\be\b USING/.test(d));
  assert.ok(deliveries.every((d) => /USING (COVERING )?INDEX webhook_deliveries_due \(status=\?( AND next_at_ms<\?)?\)/.test(d)), `plan: ${plan.join(' | ')}`);
  const r = await db.get<{ n: number }>("SELECT COUNT(*) AS n FROM webhook_deliveries WHERE status = 'pending' AND next_at_ms <= ?", [nowMs]);
  return Number(r!.n);
}

for (const kind of KINDS) {
  test(`${kind}: a pass reads none of a paused destination's held deliveries, and sends only what is due elsewhere`, async (t) => {
    const db = await openDb(t, kind);
    const recv = await startWebhookReceiver();
    t.after(() => recv.close());
    const settings = settingsOf([recv.url, PAUSED]);
    const clock = { ms: Date.UTC(2026, 5, 1) };
    const dispatcher = dispatcherOf(db, settings, clock);
    const events = await WebhookEvents.open(db, { now: () => clock.ms, settings: () => settings });
    const HELD = 600;
    // Deliveries to PAUSED that came due, then the destination paused; and more events while it is.
    await db.tx(async (tx) => {
      for (let i = 0; i < HELD / 2; i++) await insertEvent(tx, { id: `msg_old${i}`, type: 'key.created', orgId: 'org_1', payload: '{}', atMs: clock.ms - 1000 }, [PAUSED]);
      await pauseDestination(tx, PAUSED, clock.ms, 'test');
    });
    await db.tx(async (tx) => {
      for (let i = 0; i < HELD / 2; i++) await insertEvent(tx, { id: `msg_new${i}`, type: 'key.created', orgId: 'org_1', payload: '{}', atMs: clock.ms - 500 }, [PAUSED]);
    });
    const live = await db.tx((tx) => events.enqueue(tx, 'key.revoked', 'org_1', { key_id: 'key_1' }));
    // That event went to both; the paused destination's copy is held too.
    clock.ms += 1000;
    const due = await sqlOf(db.dialect, (q) => dueDeliveries(q, clock.ms, 32));
    assert.ok((await deliveryRowsRead(db, due, clock.ms)) <= 2, 'the due scan reads the live delivery only');
    const next = await sqlOf(db.dialect, (q) => nextDueAtMs(q));
    assert.ok((await deliveryRowsRead(db, next, clock.ms)) <= 2, 'the next-due lookup reads the live delivery only');
    assert.equal(await dispatcher.runDue(), 1);
    assert.deepEqual(recv.received.map((r) => r.id), [live]);
    assert.equal(await nextDueAtMs(db), null);
    const [counts] = await db.all<{ held: number }>("SELECT COUNT(*) AS held FROM webhook_deliveries WHERE url = ? AND status = 'held'", [redactedUrl(PAUSED)]);
    assert.equal(Number(counts.held), HELD + 1);
  });

  test(`${kind}: held deliveries are pruned by age, then by count (the newest kept); other destinations' are not touched`, async (t) => {
    const db = await openDb(t, kind);
    const LIVE = 'http://127.0.0.1:2/live';
    const settings = settingsOf([LIVE, PAUSED]);
    const HOUR = 3_600_000;
    const clock = { ms: Date.UTC(2026, 5, 1) };
    await db.tx(async (tx) => {
      await pauseDestination(tx, PAUSED, clock.ms - 100 * HOUR, 'test');
      for (let i = 0; i < 50; i++) await insertEvent(tx, { id: `msg_${String(i).padStart(2, '0')}`, type: 'key.created', orgId: 'org_1', payload: '{}', atMs: clock.ms - i * HOUR }, [PAUSED, LIVE]);
    });
    const lines: string[] = [];
    const byAge = dispatcherOf(db, settings, clock, lines, { ageMs: 40 * HOUR + 1, count: 1000 });
    assert.equal(await byAge.prune(), 9, 'created 41 to 49 hours ago');
    const held = async () => (await db.all<{ event_id: string }>("SELECT event_id FROM webhook_deliveries WHERE status = 'held' ORDER BY event_id")).map((r) => r.event_id);
    assert.equal((await held()).length, 41);
    const byCount = dispatcherOf(db, settings, clock, lines, { ageMs: 1000 * HOUR, count: 10 });
    assert.equal(await byCount.prune(), 31);
    assert.deepEqual(await held(), Array.from({ length: 10 }, (_, i) => `msg_${String(i).padStart(2, '0')}`), 'the 10 newest stay');
    assert.equal(await byCount.prune(), 0, 'within bounds: nothing more');
    const [liveRows] = await db.all<{ n: number }>("SELECT COUNT(*) AS n FROM webhook_deliveries WHERE url = ? AND status = 'pending'", [LIVE]);
    assert.equal(Number(liveRows.n), 50, "a live destination's deliveries are never pruned here");
    assert.equal(lines.length, 2);
    assert.match(lines[0], /webhooks: 9 held deliveries to paused http:\/\/127\.0\.0\.1:1\/paused dropped/);
  });

  test(`${kind}: a destination URL's query reaches the destination only: not the outbox, the log lines or the console's answers`, async (t) => {
    const db = await openDb(t, kind);
    const recv = await startWebhookReceiver();
    t.after(() => recv.close());
    const TOKEN = 'tok3nSecretValue99';
    const full = `${recv.url}?token=${TOKEN}`;
    const settings = parseWebhooksConfig([{ url: full, secret_env: 'HOOK_SECRET', events: ['*'], retry_initial_ms: 1000 }], undefined, { HOOK_SECRET: recv.secret });
    const clock = { ms: Date.UTC(2026, 5, 1) };
    const lines: string[] = [];
    const dispatcher = dispatcherOf(db, settings, clock, lines);
    const events = await WebhookEvents.open(db, { now: () => clock.ms, settings: () => settings });
    const admin = new WebhookAdmin(db, dispatcher, { now: () => clock.ms, settings: () => settings });

    recv.fallback = 500;
    await db.tx((tx) => events.enqueue(tx, 'key.created', 'org_1', { key_id: 'key_1' }));
    assert.equal(await dispatcher.runDue(), 1);
    assert.equal(recv.received[0].path, `/hooks?token=${TOKEN}`, 'the destination gets its query');
    // Past the retry window: the next failure fails the delivery for good and pauses the destination (logged).
    clock.ms += RETRY_WINDOW_MS + 1;
    assert.equal(await dispatcher.runDue(), 1);
    assert.ok(lines.some((l) => l.includes(`to ${recv.url} failed`)), lines.join('\n'));

    const stored = JSON.stringify([await db.all('SELECT * FROM webhook_deliveries'), await db.all('SELECT * FROM webhook_destinations')]);
    assert.ok(stored.includes(recv.url), 'the outbox names the destination');
    const listed = await admin.list();
    assert.equal(listed.destinations[0].url, recv.url);
    assert.equal(listed.destinations[0].paused, true, 'its state is found under the redacted URL');
    const deliveries = await admin.deliveries(false, 10);
    assert.equal(deliveries.deliveries[0].url, recv.url);
    recv.fallback = 200;
    // Named as `webhooks list` shows it: found, sent to the full URL, resumed.
    const tested = await admin.test(recv.url);
    assert.equal(tested.ok, true);
    assert.equal(tested.resumed, true);
    assert.equal(tested.url, recv.url);
    assert.equal(recv.received.at(-1)!.path, `/hooks?token=${TOKEN}`);
    for (const [what, text] of [['outbox', stored], ['log', lines.join('\n')], ['list', JSON.stringify(listed)], ['deliveries', JSON.stringify(deliveries)], ['test', JSON.stringify(tested)]]) {
      assert.ok(!text.includes(TOKEN), `${what} holds no query`);
    }
    await assert.rejects(admin.test(`http://127.0.0.1:1/other?token=${TOKEN}`), (e: Error) => !e.message.includes(TOKEN) && /no webhook destination/.test(e.message));
  });

  test(`${kind}: an outbox written before with full URLs is redacted once at start`, async (t) => {
    const db = await openDb(t, kind);
    const full = 'https://hooks.example/in?token=abc#frag';
    await db.tx(async (tx) => {
      await tx.run('INSERT INTO webhook_events (id, type, org_id, payload, created_at_ms) VALUES (?, ?, ?, ?, ?)', ['msg_a', 'key.created', '', '{}', 1]);
      await tx.run('INSERT INTO webhook_deliveries (event_id, url, window_start_ms, next_at_ms) VALUES (?, ?, 1, 1)', ['msg_a', full]);
      await tx.run('INSERT INTO webhook_destinations (url, paused_at_ms) VALUES (?, 5)', [full]);
    });
    assert.equal(await redactStoredUrls(db, redactedUrl), 1);
    assert.equal(await redactStoredUrls(db, redactedUrl), 0);
    assert.deepEqual((await db.all<{ url: string }>('SELECT url FROM webhook_deliveries')).map((r) => r.url), ['https://hooks.example/in']);
    assert.deepEqual((await db.all<{ url: string; paused_at_ms: number }>('SELECT url, paused_at_ms FROM webhook_destinations')).map((r) => [r.url, Number(r.paused_at_ms)]), [['https://hooks.example/in', 5]]);
  });
}

test('config: two destinations that differ only in their query are refused, and no message echoes a query', () => {
  const dest = (url: string) => ({ url, secret_env: 'HOOK_SECRET', events: ['*'] });
  assert.throws(
    () => parseWebhooksConfig([dest('https://h.example/in?token=one1'), dest('https://h.example/in?token=two2')], undefined, { HOOK_SECRET: SECRET }),
    (e: Error) => /listed twice/.test(e.message) && !/one1|two2/.test(e.message),
  );
  assert.throws(() => parseWebhooksConfig([dest('ftp://h.example/in?token=three3')], undefined, { HOOK_SECRET: SECRET }), (e: Error) => /http/.test(e.message) && !e.message.includes('three3'));
  assert.throws(() => parseWebhooksConfig([dest('not a url?token=four4')], undefined, { HOOK_SECRET: SECRET }), (e: Error) => /not a URL/.test(e.message) && !e.message.includes('four4'));
});
