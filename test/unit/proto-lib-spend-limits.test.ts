// Money pools below the organisation (docs/money-limits.md): periods and pool ids, the control
// plane's pools (what a key or project may still spend, leased through MoneyLeaseLedger by pool id),
// and the node's side (which pools a request touches, a period that ends, the refusal's words).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { keyLimitMessage, keyLimitShort, keyPoolId, periodEndMs, periodStartMs, poolOf, projectCapMessage, projectCapShort, projectPoolId } from '../../proto/lib/spend-limits.js';
import { MoneyLeaseLedger } from '../../control-plane/leases/money-lease-ledger.js';
import { MoneyPools, partitionPools } from '../../control-plane/leases/money-pools.js';
import { SnapshotStore } from '../../control-plane/state/snapshot-store.js';
import type { Queryable } from '../../control-plane/store/db.js';
import { GatewayConfig, type KeyEntry } from '../../proto/gen/tollgate/v1/sync.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { extraPools, moneyVerdict, reserveMoney } from '../../data-plane/leases/request-money.js';

const WED = Date.UTC(2026, 10, 25, 13, 30); // Wednesday 2026-11-25 13:30 UTC
const DAY = 86_400_000;

test('periods: UTC day, week from Monday, calendar month, never', () => {
  assert.equal(periodStartMs('daily', WED), Date.UTC(2026, 10, 25));
  assert.equal(periodEndMs('daily', WED), Date.UTC(2026, 10, 26));
  assert.equal(periodStartMs('weekly', WED), Date.UTC(2026, 10, 23), 'Monday');
  assert.equal(periodEndMs('weekly', WED), Date.UTC(2026, 10, 30));
  assert.equal(periodStartMs('weekly', Date.UTC(2026, 10, 29, 23, 59)), Date.UTC(2026, 10, 23), 'Sunday is the same week');
  assert.equal(periodStartMs('monthly', WED), Date.UTC(2026, 10, 1));
  assert.equal(periodEndMs('monthly', Date.UTC(2026, 11, 31, 23)), Date.UTC(2027, 0, 1), 'December ends at the new year');
  assert.equal(periodStartMs('never', WED), 0);
  assert.equal(periodEndMs('never', WED), Infinity);
});

test('pool ids: an organisation is its id; a project and a key carry their period', () => {
  assert.deepEqual(poolOf('org_abc'), { kind: 'org', id: 'org_abc', periodStart: 0 });
  assert.deepEqual(poolOf(projectPoolId('proj_1', Date.UTC(2026, 10, 1))), { kind: 'project', id: 'proj_1', periodStart: Date.UTC(2026, 10, 1) });
  assert.deepEqual(poolOf(keyPoolId('key_1', 0)), { kind: 'key', id: 'key_1', periodStart: 0 });
  assert.deepEqual(partitionPools(['org_a', keyPoolId('key_1', 0), projectPoolId('p', 5)]), { orgIds: ['org_a'], poolIds: ['key:key_1@0', 'project:p@5'] });
});

test('refusal messages name the limit and when it lifts, and fit a WebSocket close reason', () => {
  assert.equal(keyLimitMessage(5_000_000, 'daily', WED), "This API key's spend limit of $5.00 per day was reached; requests are refused until it resets at 2026-11-26T00:00:00Z.");
  assert.equal(keyLimitMessage(1_500_000, 'never', WED), "This API key's spend limit of $1.50 was reached; it never resets: use another key.");
  assert.equal(projectCapMessage(20_000_000, WED), "The project's monthly spend cap of $20.00 was reached; requests are refused until 2026-12-01T00:00:00Z (the next UTC month) or until the cap is raised.");
  for (const short of [keyLimitShort(123_456_789_012, 'weekly', WED), projectCapShort(999_999_999_999_999, WED)]) {
    assert.ok(Buffer.byteLength(`insufficient_quota: ${short}`) <= 123, short);
  }
});

function key(id: string, projectId: string, limitMicros = 0, limitReset = ''): KeyEntry {
  return { keyId: id, keyHash: `hash-${id}`, projectId, orgId: 'org', allowedModels: [], rpmLimit: 0, tpmLimit: 0, maxParallelRequests: 0, limitMicros, limitReset };
}

/** A store with a limited key (`key_l`, 1000 micros a day), a plain key, and a project capped at 5000. */
function control(now: { ms: number }, spentBefore = 0) {
  const store = new SnapshotStore({
    version: 0,
    config: GatewayConfig.fromPartial({ serviceName: 'tollgate' }),
    keys: [key('key_l', 'proj_a', 1000, 'daily'), key('key_plain', 'proj_b')],
    orgs: [],
    projects: [{ projectId: 'proj_a', capMicros: 5000 }],
  });
  const pools = new MoneyPools(store, () => now.ms);
  const ledger = new MoneyLeaseLedger();
  const statements: string[] = [];
  const q = {
    get: async (sql: string) => (statements.push(sql), { s: spentBefore }),
    all: async (sql: string) => (statements.push(sql), [{ project_id: 'proj_a', s: spentBefore }]),
  } as unknown as Queryable;
  return { store, pools, ledger, q, statements };
}

test('control plane: only keys with a limit and projects with a cap have pools', () => {
  const { pools } = control({ ms: WED });
  assert.deepEqual(pools.limitsOfKey('key_plain', 'proj_b'), []);
  assert.deepEqual(pools.limitsOfKey('key_l', 'proj_a').map((l) => l.base), ['project:proj_a', 'key:key_l']);
  assert.equal(pools.limitOf(keyPoolId('key_plain', 0)), null);
});

test('control plane: a key pool is leased exactly across two connections, reclaiming before a refusal', async () => {
  const now = { ms: WED };
  const { pools, ledger, q, statements } = control(now, 100);
  const pool = keyPoolId('key_l', periodStartMs('daily', WED));
  assert.equal(pools.spendableFromMemory([pool]), null, 'not loaded yet');
  await pools.load(q, [pool]);
  assert.equal(statements.length, 1, 'one statement, once');
  await pools.load(q, [pool]);
  assert.equal(statements.length, 1);
  const spendable = () => pools.spendableFromMemory([pool])!.get(pool)!;
  assert.equal(spendable(), 900, '1000 a day, 100 spent today');
  // Node a takes all of it (asked for 900); node b is short: the ledger names a, a gives back, b is served.
  assert.deepEqual(ledger.grant('a', pool, spendable(), 2, { micros: 900 }), { kind: 'grant', micros: 900, exhausted: false });
  assert.deepEqual(ledger.grant('b', pool, spendable(), 2, { micros: 50 }), { kind: 'reclaim', from: ['a'] });
  ledger.giveBack('a', pool, 600);
  assert.deepEqual(ledger.grant('b', pool, spendable(), 2, { micros: 50 }, true), { kind: 'grant', micros: 600, exhausted: false }, 'a small remainder is leased whole');
  // a's report: 300 spent under its epoch: the day's spend and a's slice both move.
  pools.charge(ledger, 'a', 7, [{ keyId: 'key_l', projectId: 'proj_a', orgId: 'org', minute: Math.floor(WED / 60_000), costMicros: 300, leaseEpoch: 7 }]);
  assert.equal(spendable(), 600);
  assert.equal(ledger.balanceOf('a', pool), 0);
  // Nothing leasable is left (b holds 600, 300 were spent, 100 before): a final refusal.
  assert.deepEqual(ledger.grant('a', pool, spendable(), 2, { micros: 10 }, true), { kind: 'grant', micros: 0, exhausted: true });
});

test('control plane: the next day is a new pool: what is leased or owed in the last day does not count against it', async () => {
  // Before pools were per period: a node that spent its whole slice in the last second of a day was
  // counted as holding it until its report came, and the next day's first requests were refused.
  const now = { ms: WED };
  const { pools, ledger, q } = control(now);
  const today = keyPoolId('key_l', periodStartMs('daily', WED));
  await pools.load(q, [today]);
  ledger.grant('a', today, pools.spendableFromMemory([today])!.get(today)!, 1, { micros: 1000 });
  assert.equal(ledger.outstandingFor(today), 1000, 'spent on node a, not reported yet');
  now.ms = WED + DAY;
  const tomorrow = keyPoolId('key_l', periodStartMs('daily', now.ms));
  assert.equal(pools.spendableFromMemory([tomorrow])!.get(tomorrow), 1000);
  assert.deepEqual(ledger.grant('b', tomorrow, 1000, 2, { micros: 10 }), { kind: 'grant', micros: 1000, exhausted: false });
  // The last day's late report counts in that day, not in this one.
  pools.charge(ledger, 'a', 1, [{ keyId: 'key_l', projectId: 'proj_a', orgId: 'org', minute: Math.floor(WED / 60_000), costMicros: 1000, leaseEpoch: 1 }]);
  assert.equal(ledger.balanceOf('a', today), 0);
  pools.charge(ledger, 'b', 2, [{ keyId: 'key_l', projectId: 'proj_a', orgId: 'org', minute: Math.floor(now.ms / 60_000), costMicros: 40, leaseEpoch: 2 }]);
  assert.equal(pools.spendableFromMemory([tomorrow])!.get(tomorrow), 960);
  // Ended days are forgotten by the ledger a while later (the sweep runs at most once a minute).
  now.ms += DAY;
  pools.sweep(ledger);
  assert.equal(ledger.outstandingFor(today), 0);
});

test('control plane: a report moves the project and key spend and tells the threshold watcher, once per pool', async () => {
  const now = { ms: WED };
  const { pools, ledger, q } = control(now);
  const month = projectPoolId('proj_a', periodStartMs('monthly', WED));
  const day = keyPoolId('key_l', periodStartMs('daily', WED));
  await pools.load(q, [month, day]);
  const seen: Array<{ kind: string; spentMicros: number; limitMicros: number; orgId: string }> = [];
  pools.onSpent = (s) => seen.push({ kind: s.kind, spentMicros: s.spentMicros, limitMicros: s.limitMicros, orgId: s.orgId });
  const minute = Math.floor(WED / 60_000);
  pools.charge(ledger, 'a', 1, [
    { keyId: 'key_l', projectId: 'proj_a', orgId: 'org', minute, costMicros: 500, leaseEpoch: 1 },
    { keyId: 'key_l', projectId: 'proj_a', orgId: 'org', minute: minute + 1, costMicros: 300, leaseEpoch: 1 },
    { keyId: 'key_plain', projectId: 'proj_b', orgId: 'org', minute, costMicros: 999, leaseEpoch: 1 },
  ]);
  assert.deepEqual(seen, [
    { kind: 'project', spentMicros: 800, limitMicros: 5000, orgId: 'org' },
    { kind: 'key', spentMicros: 800, limitMicros: 1000, orgId: 'org' },
  ]);
  assert.equal(pools.spendableFromMemory([month])!.get(month), 4200);
});

test('control plane: a pool whose limit was removed is not said to be spent', () => {
  const { pools } = control({ ms: WED });
  const gone = keyPoolId('key_plain', 0);
  assert.ok(pools.spendableFromMemory([gone])!.get(gone)! > 1e12);
});

function node(nowMs: number) {
  const clock = new ManualClock(nowMs);
  const sent: LeaseRequestOut[] = [];
  const leases = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  leases.setConnected(true, 2);
  const state = new GatewayState();
  state.upsertOrg({ orgId: 'org', tier: 'paid', blocked: false, blockedReason: '', fundsVersion: 0, ownerAccountId: '' });
  state.upsertProject({ projectId: 'proj_a', capMicros: 0 });
  state.upsertKey(key('key_l', 'proj_a', 1000, 'daily'));
  state.upsertKey(key('key_plain', 'proj_b'));
  return { clock, sent, leases, state };
}

test('node: a key without a limit in a project without a cap touches only its organisation', () => {
  const { leases, state, clock } = node(WED);
  const plain = [...state.keysByHash.keys()].map((h) => state.keysByHash.get(h)!).find((k) => k.keyId === 'key_plain')!;
  assert.equal(extraPools(leases, plain, clock.now()), null);
});

test('node: a limited key leases its period\'s pool, refuses naming its limit, and a new day drops the old pool', () => {
  const { leases, state, clock, sent } = node(WED);
  const k = state.keysByHash.get('hash-key_l')!;
  const today = keyPoolId('key_l', periodStartMs('daily', WED));
  assert.deepEqual(extraPools(leases, k, clock.now()), [today]);
  leases.applyOrgSlices([{ orgId: 'org', micros: 10_000 }]);
  assert.deepEqual(moneyVerdict(leases, k, clock.now()), { verdict: 'wait', pool: today });
  leases.applyOrgGrant(today, 400, false);
  assert.deepEqual(moneyVerdict(leases, k, clock.now()), { verdict: 'yes' });
  const r = reserveMoney(leases, k, clock.now());
  leases.settleSpend('org', r, 400);
  assert.equal(leases.sliceOf(today), 0, 'the cost was charged to the key pool too');
  assert.equal(leases.sliceOf('org'), 9600);
  leases.applyOrgGrant(today, 0, true);
  const no = moneyVerdict(leases, k, clock.now());
  assert.equal(no.verdict, 'no');
  assert.match((no as { message: string }).message, /spend limit of \$0\.001 per day was reached; requests are refused until it resets at 2026-11-26T00:00:00Z/);
  // The project gets a cap: its month's pool is touched too.
  state.upsertProject({ projectId: 'proj_a', capMicros: 5000 });
  assert.deepEqual(extraPools(leases, k, clock.now()), [projectPoolId('proj_a', periodStartMs('monthly', WED)), today]);
  // The next day: a new pool; the old one is given back (what was left of it) and forgotten.
  leases.applyOrgGrant(today, 100, false);
  clock.set(WED + DAY);
  sent.length = 0;
  const tomorrow = keyPoolId('key_l', periodStartMs('daily', WED + DAY));
  assert.deepEqual(extraPools(leases, k, clock.now())!.at(-1), tomorrow);
  assert.equal(leases.sliceOf(today), undefined);
  assert.deepEqual(sent.flatMap((s) => s.orgReturns), [{ orgId: today, micros: 100 }]);
});

test('ledger: money a node spent past its slice and did not report yet is not leased again', () => {
  // Before the want carried the node's debt, a node whose last request cost more than its slice held
  // asked again before its report arrived; the control plane counted only what it had granted, leased
  // the overspend a second time, and a sequential stream passed a limit by two requests.
  const ledger = new MoneyLeaseLedger();
  const pool = keyPoolId('key_l', 0);
  assert.deepEqual(ledger.grant('a', pool, 1000, 1, { micros: 1000 }), { kind: 'grant', micros: 1000, exhausted: false });
  // The node spent 1400 of it (400 past its slice), none reported yet: nothing is left.
  assert.deepEqual(ledger.grant('a', pool, 1000, 1, { micros: 400, debtMicros: 400 }, true), { kind: 'grant', micros: 0, exhausted: true });
  // Reported: the debt is in the spend now (600 spendable after a new credit, say) and is not counted twice.
  ledger.consume('a', pool, 1400);
  assert.deepEqual(ledger.grant('a', pool, 600, 1, { micros: 400, debtMicros: 400 }, true), { kind: 'grant', micros: 600, exhausted: false });
});

test('node: the organisation\'s pool and a key\'s limit both refuse: the refusal names the key\'s limit', () => {
  // money-limits.test.ts under load: unpriced requests in flight (about $410 worst case each) held
  // all of a $10 key limit and of the $1,000 organisation's slice; a request admitted after their
  // raises was told "The organisation's balance is exhausted or its monthly spend cap was reached."
  const { leases, state, clock } = node(WED);
  const k = state.keysByHash.get('hash-key_l')!;
  const today = keyPoolId('key_l', periodStartMs('daily', WED));
  leases.applyOrgSlices([{ orgId: 'org', micros: 10_000 }]);
  moneyVerdict(leases, k, clock.now());
  leases.applyOrgGrant(today, 1000, false);
  // One request in flight holds all that is left of both.
  const r = reserveMoney(leases, k, clock.now())!;
  assert.deepEqual(leases.raiseSpend('org', r, 10_000, true, false), { verdict: 'yes' });
  assert.deepEqual(leases.raiseSpend(today, r.extra![0][1], 10_000, true, false), { verdict: 'wait' });
  leases.applyOrgGrant(today, 0, true);
  assert.deepEqual(leases.raiseSpend(today, r.extra![0][1], 10_000, true, false), { verdict: 'yes' }, 'unpriced at the last: takes all');
  leases.canSpend('org');
  leases.applyOrgGrant('org', 0, true);
  assert.equal(leases.canSpend('org'), 'no');
  const no = moneyVerdict(leases, k, clock.now());
  assert.equal(no.verdict, 'no');
  assert.equal((no as { pool: string }).pool, today);
  assert.match((no as { message: string }).message, /This API key's spend limit of \$0\.001 per day was reached/);
  // The organisation's pool alone refuses (the key's limit has money left): the organisation is named.
  leases.applyOrgGrant(today, 500, false);
  assert.equal(leases.canSpend(today), 'yes');
  const org = moneyVerdict(leases, k, clock.now(), 'no');
  assert.deepEqual(org, { verdict: 'no', pool: '', message: '', short: '' });
});
