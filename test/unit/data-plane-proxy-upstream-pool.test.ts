import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DeploymentState, UpstreamPool, type MinuteLeases, type PoolMember } from '../../data-plane/proxy/upstream-pool.js';
import type { MinuteAllowance } from '../../data-plane/limits/key-budgets.js';

const T0 = Date.UTC(2025, 0, 1, 0, 0, 0);

function member(id: string, weight = 1, limits: Partial<Pick<PoolMember, 'rpm' | 'tpm' | 'maxParallel'>> = {}): PoolMember {
  return { state: new DeploymentState(id), weight, rpm: 0, tpm: 0, maxParallel: 0, ...limits };
}

function pool(members: PoolMember[], opts: { random?: () => number; failures?: number; cooldownMs?: number } = {}) {
  const clock = { ms: T0 };
  const p = new UpstreamPool(members, { circuitFailures: opts.failures ?? 3, circuitCooldownMs: opts.cooldownMs ?? 10_000 }, () => clock.ms, opts.random ?? (() => 0));
  return { p, clock };
}

test('weighted choice: the injected random picks by weight among idle deployments', () => {
  // Weights 1, 3: random in [0, 0.25) → a, [0.25, 1) → b.
  const cases: [number, string][] = [
    [0, 'a'],
    [0.24, 'a'],
    [0.25, 'b'],
    [0.99, 'b'],
  ];
  for (const [r, want] of cases) {
    const { p } = pool([member('a', 1), member('b', 3)], { random: () => r });
    assert.equal(p.members[p.choose([], 0)].state.id, want, `random ${r}`);
  }
});

test('weighted choice over many draws follows the weights', () => {
  let seed = 1;
  const random = () => ((seed = (seed * 48271) % 2147483647) / 2147483647);
  const { p } = pool([member('a', 1), member('b', 3)], { random });
  const counts = { a: 0, b: 0 } as Record<string, number>;
  for (let i = 0; i < 4000; i++) counts[p.members[p.choose([], 0)].state.id]++;
  assert.ok(counts.b > 2.6 * counts.a && counts.b < 3.4 * counts.a, JSON.stringify(counts));
});

test('the least loaded deployment (in flight per weight) is preferred over the weighted draw', () => {
  const { p } = pool([member('a', 1), member('b', 1)], { random: () => 0 });
  const first = p.choose([], 0);
  p.begin(first, 0);
  // a is busy: b is chosen whatever the random says.
  assert.equal(p.members[p.choose([], 0)].state.id, 'b');
  p.end(first);
  assert.equal(p.members[p.choose([], 0)].state.id, 'a');
});

test('tried deployments are skipped; none left gives -1', () => {
  const { p } = pool([member('a'), member('b')]);
  assert.equal(p.members[p.choose([0], 0)].state.id, 'b');
  assert.equal(p.choose([0, 1], 0), -1);
});

test('a deployment without room in its own limits is passed over: parallel, rpm, tpm; the next minute has room again', () => {
  const { p, clock } = pool([member('a', 100, { maxParallel: 1, rpm: 2, tpm: 1000 }), member('b', 1)], { random: () => 0 });
  assert.equal(p.choose([], 0), 0);
  p.begin(0, 10);
  assert.equal(p.choose([], 0), 1, 'a has one in flight of max 1');
  p.end(0);
  p.begin(0, 10);
  p.end(0);
  assert.equal(p.choose([], 0), 1, 'a sent 2 of rpm 2 this minute');
  clock.ms += 60_000;
  assert.equal(p.choose([], 0), 0, 'a new minute');
  assert.equal(p.choose([], 2000), 1, '2000 tokens do not fit tpm 1000');
  const none = p.whyNone([1], 2000);
  assert.deepEqual(none, { capacity: true, retryAfterMs: 60_000, leaseShort: [] });
});

test('consecutive failures open the circuit for the cooling time; a half-open probe that succeeds closes it', () => {
  const { p, clock } = pool([member('a', 100), member('b', 1)], { failures: 3, cooldownMs: 10_000, random: () => 0 });
  for (let i = 0; i < 2; i++) {
    p.begin(0, 0);
    p.failed(0);
    p.end(0);
  }
  assert.equal(p.choose([], 0), 0, 'two failures of three: still closed');
  assert.equal(p.circuit(0), 'closed');
  p.begin(0, 0);
  p.failed(0);
  p.end(0);
  assert.equal(p.circuit(0), 'open');
  assert.equal(p.choose([], 0), 1, 'open: passed over');
  assert.deepEqual(p.whyNone([1], 0), { capacity: false, retryAfterMs: 10_000, leaseShort: [] });
  clock.ms += 10_000;
  assert.equal(p.circuit(0), 'half-open');
  assert.equal(p.choose([], 0), 0, 'half-open: one real request probes it');
  p.begin(0, 0);
  assert.equal(p.choose([], 0), 1, 'only one probe at a time');
  p.succeeded(0);
  p.end(0);
  assert.equal(p.circuit(0), 'closed');
  assert.equal(p.choose([], 0), 0);
});

test('a half-open probe that fails opens the circuit again for another cooling time', () => {
  const { p, clock } = pool([member('a'), member('b')], { failures: 1, cooldownMs: 5_000 });
  p.begin(0, 0);
  p.failed(0);
  p.end(0);
  clock.ms += 5_000;
  p.begin(0, 0);
  p.failed(0);
  p.end(0);
  assert.equal(p.circuit(0), 'open');
  clock.ms += 4_999;
  assert.equal(p.circuit(0), 'open');
  clock.ms += 1;
  assert.equal(p.circuit(0), 'half-open');
});

test('a success resets the count of consecutive failures', () => {
  const { p } = pool([member('a'), member('b')], { failures: 2 });
  p.failed(0);
  p.succeeded(0);
  p.failed(0);
  assert.equal(p.circuit(0), 'closed');
});

test("an upstream 429's retry-after cools that deployment for that long (injected clock)", () => {
  const { p, clock } = pool([member('a', 100), member('b', 1)], { random: () => 0 });
  p.cool(0, 7_000);
  assert.equal(p.choose([], 0), 1);
  assert.deepEqual(p.whyNone([1], 0), { capacity: true, retryAfterMs: 7_000, leaseShort: [] });
  clock.ms += 6_999;
  assert.equal(p.choose([], 0), 1);
  clock.ms += 1;
  assert.equal(p.choose([], 0), 0);
  // Cooling is not a failure: the circuit stays closed.
  assert.equal(p.circuit(0), 'closed');
});

/** Leases as a test sets them: what this node holds of each pool's minute, and what it was told. */
function fakeLeases(): MinuteLeases & { allowance: Map<string, MinuteAllowance>; used: string[]; waits: string[]; advanced: string[] } {
  const allowance = new Map<string, MinuteAllowance>();
  const used: string[] = [];
  const waits: string[] = [];
  const advanced: string[] = [];
  return {
    allowance,
    used,
    waits,
    advanced,
    allowanceFor: (id) => allowance.get(id) ?? { requests: Infinity, tokens: Infinity },
    noteUsage: (id, _m, requests, tokens) => void used.push(`${id} ${requests} ${tokens}`),
    waitForKey: (id, _m, _l, needRequests) => (waits.push(`${id} ${needRequests}`), true),
    cancelKeyWait: () => {},
    advanceKey: (id, _m, _l, needRequests, _t, timedOut) => {
      if (!timedOut) return false;
      advanced.push(`${id} ${needRequests}`);
      const a = allowance.get(id)!;
      allowance.set(id, { ...a, requests: a.requests + needRequests });
      return true;
    },
    answerDeferred: () => false,
  };
}

test("a deployment's minute across the cluster: chosen only within this node's lease; short of it, worth an ask; spent, to the next minute", () => {
  const leases = fakeLeases();
  const limits = { keyId: 'deployment:m/a', rpmLimit: 60, tpmLimit: 0, maxParallel: 0 };
  const a: PoolMember = { ...member('a', 100, { rpm: 60 }), lease: { poolId: 'deployment:m/a', limits } };
  const clock = { ms: T0 + 15_000 };
  const p = new UpstreamPool([a, member('b', 1)], { circuitFailures: 3, circuitCooldownMs: 10_000 }, () => clock.ms, () => 0, leases);
  leases.allowance.set('deployment:m/a', { requests: 1, tokens: Infinity });
  assert.equal(p.choose([], 0), 0);
  p.begin(0, 5);
  assert.deepEqual(leases.used, ['deployment:m/a 1 5'], 'what it sent is told to the leases');
  p.end(0);
  assert.equal(p.choose([], 0), 1, 'the lease of a is used up here: b');
  assert.deepEqual(p.whyNone([1], 0), { capacity: false, retryAfterMs: 0, leaseShort: [0] });
  assert.equal(p.waitLease(0, 0, () => {}), true);
  assert.deepEqual(leases.waits, ['deployment:m/a 1'], 'asks for the one request it needs');
  // No answer within the bound: taken in advance, within a's own rpm counted here.
  assert.equal(p.advanceLease(0, 0, true), true);
  assert.deepEqual(leases.advanced, ['deployment:m/a 1']);
  assert.equal(p.choose([1], 0), 0);
  // The cluster's minute of a is spent: capacity, until the top of the minute.
  leases.allowance.set('deployment:m/a', { requests: 1, tokens: Infinity, requestsFinal: true });
  assert.deepEqual(p.whyNone([1], 0), { capacity: true, retryAfterMs: 45_000, leaseShort: [] });
});

test('a drained or disabled deployment is never chosen, whatever its weight, and says nothing of when one has room', () => {
  const { p } = pool([{ ...member('a', 1_000_000), steered: 'drained' }, member('b', 1)]);
  for (let i = 0; i < 3; i++) assert.equal(p.members[p.choose([], 0)].state.id, 'b');
  assert.equal(p.choose([1], 0), -1);
  assert.deepEqual(p.whyNone([1], 0), { capacity: false, retryAfterMs: 0, leaseShort: [] });
});

test('a request pinned to a deployment (what it names lives there) may still go to it drained, never disabled', () => {
  const { p } = pool([{ ...member('a', 1), steered: 'drained' }, { ...member('b', 1), steered: 'disabled' }, member('c', 1)]);
  assert.equal(p.choose([1, 2], 0, true), 0, 'pinned to the drained one: it serves');
  assert.equal(p.choose([0, 2], 0, true), -1, 'pinned to the disabled one: none');
  assert.deepEqual(p.whyNone([0, 2], 0, true), { capacity: false, retryAfterMs: 0, leaseShort: [] });
  assert.equal(p.choose([1, 2], 0), -1, 'not pinned: the drained one is passed over');
});

test("a deployment's recent errors: this UTC minute's and the one before, by kind", () => {
  const s = new DeploymentState('a');
  s.noteError('5xx', 10);
  s.noteError('429', 11);
  s.noteError('5xx', 11);
  const cases: [number, Record<string, number>][] = [
    [11, { '5xx': 2, '429': 1 }],
    [12, { '5xx': 1, '429': 1 }],
    [13, {}],
  ];
  for (const [minute, want] of cases) assert.deepEqual(Object.fromEntries(s.recentErrors(minute)), want, `minute ${minute}`);
  // A gap of more than a minute forgets what came before it.
  s.noteError('timeout', 14);
  assert.deepEqual(Object.fromEntries(s.recentErrors(14)), { timeout: 1 });
  assert.deepEqual(Object.fromEntries(s.errors), { '5xx': 2, '429': 1, timeout: 1 });
});
