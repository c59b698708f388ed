// Ingesting a node's report costs a fixed number of SQLite statements, however many keys and
// organisations it carries (issue 19: each report's transaction used to issue statements per key and
// per organisation, so the control plane's CPU per request grew with the customers). The statements
// are counted, not timed. Spend alone publishes nothing to nodes; an organisation crossing its cap
// publishes one change. Money leases are decided from committed money kept in memory.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import fc from 'fast-check';
import { readGatewayConfig } from '../../control-plane/config.js';
import { ControlState } from '../../control-plane/state/control-state.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { addCredit, setOrgOwnCap, setOrgTier } from '../../control-plane/store/orgs-repo.js';
import { ReportIngest } from '../../control-plane/sync/report-ingest.js';
import type { Report, UsageTotal } from '../../proto/gen/tollgate/v1/sync.js';
import { ROOT } from '../helpers/processes.js';

const NOW = Date.UTC(2026, 10, 26, 12, 0, 0);
const MINUTE = Math.floor(NOW / 60_000);
const orgId = (j: number) => `org_s${String(j).padStart(6, '0')}`;
const projectId = (j: number) => `proj_s${String(j).padStart(6, '0')}`;
const keyId = (i: number) => `key_s${String(i).padStart(7, '0')}`;

async function setUp(t: { after(fn: () => unknown): void }, keys: number, orgs: number, clock = { ms: NOW }) {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-ingest-statements-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  // Organisations on the free tier (grant 5.00 USD, cap 5.00 USD a month); key i belongs to org i mod orgs.
  await db.tx(async (tx) => {
    const at = new Date(NOW).toISOString();
    for (let j = 0; j < orgs; j++) {
      await tx.run('INSERT INTO orgs (id, name, tier, created_at) VALUES (?, ?, ?, ?)', [orgId(j), `org ${j}`, 'free', at]);
      await tx.run('INSERT INTO projects (id, org_id, name, created_at) VALUES (?, ?, ?, ?)', [projectId(j), orgId(j), 'p', at]);
    }
    for (let i = 0; i < keys; i++) {
      await tx.run(
        `INSERT INTO api_keys (id, project_id, org_id, name, key_prefix, allowed_models, status, rpm_limit, tpm_limit, max_parallel_requests, created_at)
         VALUES (?, ?, ?, 'k', 'sk-tollgate-...xxxx', '[]', 'active', 20, 60000, 100, ?)`,
        [keyId(i), projectId(i % orgs), orgId(i % orgs), at],
      );
      await tx.run('INSERT INTO credentials (key_hash, key_id) VALUES (?, ?)', [`hash${i}`, keyId(i)]);
    }
  });
  const configPath = join(ROOT, 'control-plane', 'demo-config.yaml');
  const state = await ControlState.open(db, readGatewayConfig(configPath), { configPath, now: () => clock.ms, log: () => {} });
  return { db, state, ingest: new ReportIngest(state) };
}

/** A report with one usage total and one last-used time per key: `requests` calls of `costMicros` each. */
function report(seq: number, keys: number, orgs: number, requests = 1, costMicros = 10): Report {
  const usageTotals: UsageTotal[] = [];
  const lastUsed = [];
  for (let i = 0; i < keys; i++) {
    usageTotals.push({ keyId: keyId(i), orgId: orgId(i % orgs), projectId: projectId(i % orgs), model: 'demo-chat', minute: MINUTE, leaseEpoch: 0, requests, promptTokens: 7, completionTokens: 9, costMicros: costMicros * requests });
    lastUsed.push({ keyId: keyId(i), atMs: NOW + seq });
  }
  return { seq, usage: [], lastUsed, logs: undefined, instanceId: 'inst-1', usageTotals, logBlocks: [] } as unknown as Report;
}

/** Statements issued by ingesting reports 1 and 2 (the second: the steady state). */
async function statementsPerReport(keys: number, orgs: number, t: { after(fn: () => unknown): void }): Promise<{ first: number; second: number; db: SqliteDb; state: ControlState; ingest: ReportIngest }> {
  const { db, state, ingest } = await setUp(t, keys, orgs);
  const counted = async (seq: number) => {
    const before = db.statementsIssued;
    const r = await ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [report(seq, keys, orgs)]);
    assert.equal(r.duplicate, false);
    assert.equal(r.inserted, keys);
    return db.statementsIssued - before;
  };
  return { first: await counted(1), second: await counted(2), db, state, ingest };
}

test('ingesting a report issues the same number of SQLite statements for 1 key in 1 organisation as for 2,000 keys in 500', async (t) => {
  const small = await statementsPerReport(1, 1, t);
  const medium = await statementsPerReport(100, 10, t);
  const large = await statementsPerReport(2000, 500, t);
  assert.ok(small.second > 0);
  assert.equal(medium.first, small.first, `100 keys / 10 orgs: ${medium.first} statements, 1 key: ${small.first}`);
  assert.equal(large.first, small.first, `2,000 keys / 500 orgs: ${large.first} statements, 1 key: ${small.first}`);
  assert.equal(large.second, small.second);
  // One insert into report_sink (its trigger does every write), alone: no BEGIN, no COMMIT.
  assert.equal(large.second, 1, `a report costs ${large.second} statements`);

  // What was written is all of it, once: two reports of one call of 10 µ$ per key (journaled, then
  // folded into one row per key and minute).
  assert.equal(await large.ingest.usageFold.foldNow(), 4000);
  const sums = await large.db.get<{ rows: number; requests: number; cost: number }>('SELECT COUNT(*) AS rows, SUM(requests) AS requests, SUM(cost_micros) AS cost FROM usage_minutes');
  assert.deepEqual(sums, { rows: 2000, requests: 4000, cost: 40_000 });
  const spend = await large.db.all<{ org_id: string; spend_micros: number; spend_total_micros: number }>(
    'SELECT s.org_id, s.spend_micros, o.spend_total_micros FROM org_spend s JOIN orgs o ON o.id = s.org_id ORDER BY s.org_id',
  );
  assert.equal(spend.length, 500);
  // 2,000 keys over 500 organisations: 4 keys each, 2 calls each, 10 µ$ a call.
  for (const s of spend) assert.deepEqual([s.spend_micros, s.spend_total_micros], [80, 80], s.org_id);
  // last_used_at is kept to the minute: written by the first report, not moved by the second (2 ms later).
  const touched = await large.db.get<{ n: number }>('SELECT COUNT(*) AS n FROM api_keys WHERE last_used_at = ?', [new Date(NOW + 1).toISOString()]);
  assert.equal(touched?.n, 2000);
});

test('spend alone publishes nothing to nodes; crossing the monthly cap publishes one change; money leases read committed money from memory', async (t) => {
  const { db, state, ingest } = await setUp(t, 300, 30);
  const source = { nodeId: 'node-a', instanceId: 'inst-1' };
  const version0 = state.snapshots.version;
  await ingest.ingestMany(source, [report(1, 300, 30)]);
  await ingest.ingestMany(source, [report(2, 300, 30)]);
  assert.equal(state.snapshots.version, version0, 'no org change is published for spend that changes nothing a node enforces');

  // Each organisation has spent 10 keys × 2 calls × 10 µ$ = 200 µ$ of its 5.00 USD (grant and cap).
  const ids = Array.from({ length: 30 }, (_, j) => orgId(j));
  const before = db.statementsIssued;
  const spendable = state.spendableFromMemory(ids);
  assert.equal(db.statementsIssued, before, 'no statement for a money lease');
  assert.ok(spendable);
  for (const id of ids) assert.equal(spendable.get(id), 5_000_000 - 200);
  assert.equal(state.spendableFromMemory(['org_unknown']), null);

  // Key 0 (organisation 0) spends past the 5.00 USD cap: exactly one org_upsert, blocked.
  const big: Report = { ...report(3, 1, 30, 1, 5_000_000) };
  await ingest.ingestMany(source, [big]);
  assert.equal(state.snapshots.version, version0 + 1);
  assert.equal(state.snapshots.org(orgId(0))?.blocked, true);
  assert.equal(state.spendableFromMemory([orgId(0)])?.get(orgId(0)), 0);
  await ingest.ingestMany(source, [report(4, 300, 30)]);
  assert.equal(state.snapshots.version, version0 + 1, 'a blocked organisation spending more publishes nothing new');
});

test('the organisations a report charged are looked at from committed money in memory: what a read would find, whatever came before', async (t) => {
  const KEYS = 12;
  const ORGS = 4;
  const { db, state, ingest } = await setUp(t, KEYS, ORGS);
  const ids = Array.from({ length: ORGS }, (_, j) => orgId(j));
  // A minute of the month before: a late report moves all-time spend, not this month's.
  const LAST_MONTH = Math.floor(Date.UTC(2026, 9, 31, 23, 59) / 60_000);
  let seq = 0;
  const op = fc.oneof(
    fc.record({ kind: fc.constant('report' as const), keys: fc.uniqueArray(fc.nat(KEYS - 1), { minLength: 1, maxLength: KEYS }), cost: fc.nat(2_500_000), late: fc.boolean() }),
    fc.record({ kind: fc.constant('credit' as const), org: fc.nat(ORGS - 1), amount: fc.integer({ min: 1, max: 3_000_000 }) }),
    fc.record({ kind: fc.constant('cap' as const), org: fc.nat(ORGS - 1), cap: fc.option(fc.nat(8_000_000), { nil: null }) }),
    fc.record({ kind: fc.constant('tier' as const), org: fc.nat(ORGS - 1), tier: fc.constantFrom('free', 'paid') }),
  );
  await fc.assert(
    fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 12 }), async (ops) => {
      for (const o of ops) {
        if (o.kind === 'report') {
          const r = report(++seq, KEYS, ORGS, 1, o.cost);
          r.usageTotals = r.usageTotals.filter((_, i) => o.keys.includes(i)).map((u) => ({ ...u, minute: o.late ? LAST_MONTH : u.minute }));
          // An organisation charged that memory does not hold for this month yet is read (once).
          const charged = [...new Set(r.usageTotals.filter((u) => u.costMicros > 0).map((u) => u.orgId))];
          const orgRead = charged.length > 0 && state.spendableFromMemory(charged) === null ? 1 : 0;
          const before = db.statementsIssued;
          const published = state.snapshots.version;
          await ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [r]);
          // One insert into report_sink, alone; with BEGIN and COMMIT around it when the cursor is read
          // (the first report only) or an organisation is.
          const reads = orgRead + (seq === 1 ? 1 : 0);
          const expected = reads === 0 ? 1 : 3 + reads;
          if (state.snapshots.version === published) assert.ok(db.statementsIssued - before <= expected, `a report took ${db.statementsIssued - before} statements, not ${expected}`);
        } else {
          await db.tx(async (tx) => {
            const org = orgId(o.org);
            if (o.kind === 'credit') await addCredit(tx, org, o.amount, 'test', new Date(NOW).toISOString());
            else if (o.kind === 'cap') await setOrgOwnCap(tx, org, o.cap);
            else await setOrgTier(tx, org, o.tier);
            await state.refreshOrgs(tx, [org], { fundsChanged: true });
          });
        }
        // What memory says each may spend is what the database says (read without touching memory).
        assert.deepEqual(state.spendableFromMemory(ids), await state.spendableMany(db, ids), `after ${o.kind}`);
      }
      // After all of them (memory never re-read in between): reading every organisation back
      // publishes nothing the reports did not already publish, and memory was already what it read.
      const fromMemory = state.spendableFromMemory(ids);
      const version = state.snapshots.version;
      assert.equal(await db.tx((tx) => state.refreshOrgs(tx, ids)), 0, 'a read finds a change nodes were not told');
      assert.equal(state.snapshots.version, version);
      assert.deepEqual(state.spendableFromMemory(ids), fromMemory);
    }),
    { numRuns: 40 },
  );
});

test('reports of several nodes that wait while a transaction runs are written in the next one together; one that cannot be written fails alone', async (t) => {
  const { db, state, ingest } = await setUp(t, 40, 4);
  let txs = 0;
  db.txObserver = () => void txs++;
  const spentBy = new Map<string, number>();
  const onSpend = (node: string) => (_org: string, cost: number) => spentBy.set(node, (spentBy.get(node) ?? 0) + cost);
  // node-a's report is being written; node-b, node-c and node-d send theirs meanwhile.
  const a = ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [report(1, 40, 4)], onSpend('node-a'));
  const others = ['node-b', 'node-c', 'node-d'].map((node) => ingest.ingestMany({ nodeId: node, instanceId: 'inst-1' }, [report(1, 40, 4, 2)], onSpend(node)));
  const results = await Promise.all([a, ...others]);
  assert.deepEqual(results.map((r) => [r.duplicate, r.inserted]), [[false, 40], [false, 80], [false, 80], [false, 80]]);
  assert.equal(txs, 2, "node-a's transaction, then one for the three that waited");
  // Each node's costs are told to its own connection's leases; together they are the organisations' spend.
  assert.deepEqual(Object.fromEntries(spentBy), { 'node-a': 400, 'node-b': 800, 'node-c': 800, 'node-d': 800 });
  const spend = await db.get<{ s: number }>('SELECT SUM(spend_micros) AS s FROM org_spend');
  assert.equal(spend?.s, 2800);
  assert.deepEqual(await db.get('SELECT SUM(requests) AS r, SUM(cost_micros) AS c FROM usage_minutes'), { r: 280, c: 2800 });
  // A replay in a shared transaction changes nothing; a new report beside it is written.
  const replayed = await Promise.all([
    ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [report(2, 40, 4)]),
    ingest.ingestMany({ nodeId: 'node-b', instanceId: 'inst-1' }, [report(1, 40, 4, 2)]),
    ingest.ingestMany({ nodeId: 'node-c', instanceId: 'inst-1' }, [report(2, 40, 4)]),
  ]);
  assert.deepEqual(replayed.map((r) => r.duplicate), [false, true, false]);
  assert.deepEqual(await db.get('SELECT SUM(requests) AS r FROM usage_minutes'), { r: 360 });

  // node-f's report cannot be written (a usage row without a project): node-e's and node-g's, written
  // in the same transaction, are written again alone; node-f's fails, and its cursor does not move.
  const poison = report(1, 40, 4);
  poison.usageTotals[3] = { ...poison.usageTotals[3], projectId: null as unknown as string };
  const blocker = ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [report(3, 40, 4)]);
  const mixed = await Promise.allSettled([
    ingest.ingestMany({ nodeId: 'node-e', instanceId: 'inst-1' }, [report(1, 40, 4)]),
    ingest.ingestMany({ nodeId: 'node-f', instanceId: 'inst-1' }, [poison]),
    ingest.ingestMany({ nodeId: 'node-g', instanceId: 'inst-1' }, [report(1, 40, 4)]),
  ]);
  await blocker;
  assert.deepEqual(mixed.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
  assert.match(String((mixed[1] as PromiseRejectedResult).reason), /NOT NULL/);
  assert.deepEqual(await db.get('SELECT SUM(requests) AS r FROM usage_minutes'), { r: 360 + 40 + 80 });
  assert.equal(await db.get("SELECT last_seq FROM report_cursors WHERE node_id = 'node-f'"), undefined);
  assert.deepEqual(await db.get('SELECT SUM(spend_micros) AS s FROM org_spend'), { s: 3600 + 400 + 800 });
  // Memory agrees with the database after all of it.
  const ids = Array.from({ length: 4 }, (_, j) => orgId(j));
  assert.deepEqual(state.spendableFromMemory(ids), await state.spendableMany(db, ids));
});

test("in a shared transaction, a node's hook that throws after COMMIT fails that node alone: the others' leases are still told and their reports are not taken for replays", async (t) => {
  const { db, ingest } = await setUp(t, 10, 2);
  const told = new Map<string, number>();
  const onSpend = (node: string) => (_org: string, cost: number) => {
    if (node === 'node-c') throw new Error('lease ledger broke');
    told.set(node, (told.get(node) ?? 0) + cost);
  };
  const blocker = ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [report(1, 10, 2)], onSpend('node-a'));
  const shared = await Promise.allSettled(['node-b', 'node-c', 'node-d'].map((node) => ingest.ingestMany({ nodeId: node, instanceId: 'inst-1' }, [report(1, 10, 2)], onSpend(node))));
  await blocker;
  assert.deepEqual(
    shared.map((r) => (r.status === 'fulfilled' ? [r.value.duplicate, r.value.inserted] : String(r.reason))),
    [[false, 10], 'Error: lease ledger broke', [false, 10]],
  );
  assert.deepEqual(Object.fromEntries(told), { 'node-a': 100, 'node-b': 100, 'node-d': 100 });
  // Written once: node-c's report is in the database (its resend will be a replay).
  assert.deepEqual(await db.get('SELECT SUM(requests) AS r FROM usage_minutes'), { r: 40 });
  assert.deepEqual(await db.get("SELECT last_seq FROM report_cursors WHERE node_id = 'node-c'"), { last_seq: 1 });
});

test("a unit's costs are told to its connection in the order its totals first name them", async (t) => {
  const { ingest } = await setUp(t, 3, 3);
  const r = report(1, 3, 3);
  // Totals of organisations 2 (epoch 0), 0 (epoch 0), then 2 again under epoch 1.
  r.usageTotals = [{ ...r.usageTotals[2] }, { ...r.usageTotals[0] }, { ...r.usageTotals[2], leaseEpoch: 1 }];
  const calls: string[] = [];
  await ingest.ingestMany({ nodeId: 'node-a', instanceId: 'inst-1' }, [r], (org, cost, epoch) => calls.push(`${org}/${epoch}/${cost}`));
  assert.deepEqual(calls, [`${orgId(2)}/0/10`, `${orgId(0)}/0/10`, `${orgId(2)}/1/10`]);
});

test("a node instance's report cursor is read once, then kept: after a restart a resend is a replay, a partial resend counts only its new reports, and two units of one instance in one transaction count once", async (t) => {
  const { db, state, ingest } = await setUp(t, 10, 2);
  const src = { nodeId: 'node-a', instanceId: 'inst-1' };
  const calls = async () => (await db.get<{ r: number }>('SELECT COALESCE(SUM(requests), 0) AS r FROM usage_minutes'))!.r;
  await ingest.ingestMany(src, [report(1, 10, 2), report(2, 10, 2)]);
  assert.equal(await calls(), 20);
  // A control plane that restarted knows no cursor: it reads it (once, even for a replay), then keeps it.
  const restarted = new ReportIngest(state);
  const counted = async (reports: Report[]) => {
    const before = db.statementsIssued;
    const r = await restarted.ingestMany(src, reports);
    return { duplicate: r.duplicate, inserted: r.inserted, statements: db.statementsIssued - before };
  };
  assert.deepEqual(await counted([report(1, 10, 2), report(2, 10, 2)]), { duplicate: true, inserted: 0, statements: 3 }, 'BEGIN, the cursor read, COMMIT');
  assert.deepEqual(await counted([report(2, 10, 2), report(3, 10, 2)]), { duplicate: false, inserted: 10, statements: 1 }, 'the cursor read by the replay is kept');
  assert.deepEqual(await counted([report(4, 10, 2)]), { duplicate: false, inserted: 10, statements: 1 }, 'the cursor is kept');
  assert.equal(await calls(), 40);
  // A node that reconnects may have its old stream's unit and its resend written in one transaction.
  const blocker = restarted.ingestMany({ nodeId: 'node-b', instanceId: 'inst-1' }, [report(1, 10, 2)]);
  const both = await Promise.all([restarted.ingestMany(src, [report(5, 10, 2)]), restarted.ingestMany(src, [report(5, 10, 2), report(6, 10, 2)])]);
  await blocker;
  assert.deepEqual(both.map((r) => [r.duplicate, r.inserted]), [[false, 10], [false, 10]]);
  assert.equal(await calls(), 70);
  assert.deepEqual(await db.get("SELECT last_seq FROM report_cursors WHERE node_id = 'node-a'"), { last_seq: 6 });
});

test("a node instance's first report is new whatever its seq (0 included), and its resend is a replay", async (t) => {
  const { db, ingest } = await setUp(t, 1, 1);
  const src = { nodeId: 'node-a', instanceId: 'inst-1' };
  const first = await ingest.ingestMany(src, [report(0, 1, 1)]);
  const again = await ingest.ingestMany(src, [report(0, 1, 1), report(1, 1, 1)]);
  assert.deepEqual([first, again].map((r) => [r.duplicate, r.inserted]), [[false, 1], [false, 1]]);
  assert.deepEqual(await db.get('SELECT SUM(requests) AS r FROM usage_minutes'), { r: 2 });
});

test('a report whose node or instance id holds a character outside A-Z a-z 0-9 . _ : - is refused before anything is written', async (t) => {
  const { db, ingest } = await setUp(t, 1, 1);
  for (const src of [{ nodeId: 'node\u0000x', instanceId: 'inst-1' }, { nodeId: 'node-a', instanceId: 'inst\n1' }, { nodeId: '', instanceId: 'inst-1' }]) {
    const r = report(1, 1, 1);
    r.instanceId = src.instanceId;
    await assert.rejects(ingest.ingestMany(src, [r]), /node id|instance id/, JSON.stringify(src));
  }
  assert.deepEqual(await db.get('SELECT COUNT(*) AS n FROM report_cursors'), { n: 0 });
  assert.deepEqual(await db.get('SELECT COUNT(*) AS n FROM usage_minutes'), { n: 0 });
});

test('the month that turns while a report is written: the organisations are decided for the month memory was checked in, and memory never holds a month it did not read', async (t) => {
  const clock = { ms: Date.UTC(2026, 10, 30, 23, 59, 59, 999) };
  const { db, state, ingest } = await setUp(t, 1, 1, clock);
  const src = { nodeId: 'node-a', instanceId: 'inst-1' };
  // A November report keeps the organisation in memory for November.
  await ingest.ingestMany(src, [report(1, 1, 1, 1, 1000)]);
  // Midnight passes between the check of memory and refreshSpent; the report spends 6.00 USD of the
  // free tier's 5.00 (grant and cap).
  const refreshSpent = state.refreshSpent.bind(state);
  state.refreshSpent = (tx, spent, month) => {
    clock.ms = Date.UTC(2026, 11, 1);
    return refreshSpent(tx, spent, month);
  };
  const december = report(2, 1, 1, 1, 6_000_000);
  december.usageTotals = december.usageTotals.map((u) => ({ ...u, minute: Math.floor(Date.UTC(2026, 11, 1) / 60_000) }));
  await ingest.ingestMany(src, [december]);
  state.refreshSpent = refreshSpent;
  assert.equal(state.snapshots.org(orgId(0))?.blocked, true, 'blocked: its balance is spent');
  // Memory holds November's money only: for December it knows nothing (a caller reads), never a stale sum.
  assert.equal(state.spendableFromMemory([orgId(0)]), null);
  assert.deepEqual(await state.spendableMany(db, [orgId(0)]), new Map([[orgId(0), 0]]));
});
