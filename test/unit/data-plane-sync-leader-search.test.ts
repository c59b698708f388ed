// Where a node's sync stream goes after one ended, and when (data-plane/sync/leader-search.ts),
// driven through simulated failovers on an injected clock: each attempt's outcome is what the
// simulated control plane at that address answers at that moment.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { standbyDetails } from '../../proto/lib/leader-hint.js';
import { LeaderSearch, STANDBY_MAX_BACKOFF_MS, type StreamEnd } from '../../data-plane/sync/leader-search.js';

const MIN = 100;
const MAX = 5_000;
/** A stream to an address where nothing listens (what grpc-js reports). */
const REFUSED: StreamEnd = { code: GrpcStatus.UNAVAILABLE, details: 'No connection established. Last error: connect ECONNREFUSED 127.0.0.1:1' };
/** The leader's stream ended under the node (the leader died). */
const DROPPED: StreamEnd = { code: GrpcStatus.UNAVAILABLE, details: 'Connection dropped' };
const standby = (leader: string): StreamEnd => ({ code: GrpcStatus.UNAVAILABLE, details: standbyDetails(leader) });

type Outcome = StreamEnd | 'accepted';
interface Attempt {
  at: number;
  address: string;
  outcome: Outcome;
}

/**
 * The node's attempts from `t0`, when its stream ended with `first`, until one is accepted or `untilMs`:
 * `world(address, t)` is what the control plane at `address` answers at `t` (each answer takes 2 ms).
 */
function simulate(addresses: string[], random: number, first: StreamEnd, world: (address: string, t: number) => Outcome, untilMs: number, t0 = 0): Attempt[] {
  let now = t0;
  const search = new LeaderSearch(addresses, { minBackoffMs: MIN, maxBackoffMs: MAX, now: () => now, random: () => random });
  const attempts: Attempt[] = [];
  let next = search.ended(first);
  for (;;) {
    assert.ok(next.delayMs >= 0, 'no negative delay');
    now += next.delayMs;
    if (now > untilMs) return attempts;
    const outcome = world(next.address, now);
    attempts.push({ at: now, address: next.address, outcome });
    now += 2;
    if (outcome === 'accepted') return attempts;
    next = search.ended(outcome);
  }
}

const RANDOMS = [0, 0.5, 0.999];

test('after the leader dies, the node reaches the standby within 500 ms (and one attempt elsewhere) of its taking the lead, however long the failover took', () => {
  // Before the fix one back-off grew with every attempt while the node alternated between the dead
  // leader and the standby (which named the dead leader until it led itself): the node rejoined up
  // to the whole grown back-off (5 s) after the new leader led (0.3-2.1 s in the failover e2e).
  for (const leadAt of [300, 900, 1_700, 3_100, 6_000, 9_500, 20_000]) {
    for (const r of RANDOMS) {
      const attempts = simulate(['a:1', 'b:1'], r, DROPPED, (address, t) => (address === 'a:1' ? REFUSED : t >= leadAt ? 'accepted' : standby('a:1')), 60_000);
      const last = attempts.at(-1)!;
      assert.equal(last.outcome, 'accepted', `leader at ${leadAt} ms, random ${r}: never connected`);
      assert.ok(last.at - leadAt <= 510, `leader at ${leadAt} ms, random ${r}: connected ${last.at - leadAt} ms after it led (${attempts.map((a) => `${a.address}@${a.at}`).join(' ')})`);
    }
  }
});

test('a standby that names as leader an address not known to be down sends the next attempt there at once', () => {
  for (const r of RANDOMS) {
    const attempts = simulate(['a:1', 'b:1', 'c:1'], r, DROPPED, (address) => (address === 'a:1' ? REFUSED : address === 'b:1' ? standby('c:1') : 'accepted'), 60_000);
    // a dropped: b (never tried) at once; b names c: c at once.
    assert.deepEqual(attempts.map((a) => [a.address, a.at]), [['b:1', 0], ['c:1', 2]], `random ${r}`);
  }
  // A leader that is not among the addresses given is followed too.
  const attempts = simulate(['a:1', 'b:1'], 0.5, DROPPED, (address) => (address === 'b:1' ? standby('elsewhere:1') : address === 'elsewhere:1' ? 'accepted' : REFUSED), 60_000);
  assert.deepEqual(attempts.map((a) => [a.address, a.at]), [['b:1', 0], ['elsewhere:1', 2]]);
});

test('addresses that refuse or do not answer are retried with the grown back-off: the node never spins', () => {
  for (const r of RANDOMS) {
    const attempts = simulate(['a:1', 'b:1'], r, DROPPED, () => REFUSED, 60_000);
    for (const address of ['a:1', 'b:1']) {
      const at = attempts.filter((a) => a.address === address).map((a) => a.at);
      const gaps = at.slice(1).map((t, i) => t - at[i]);
      assert.ok(gaps.every((g) => g >= MIN / 2), `${address}: gaps ${gaps.join(',')}`);
      // Grown to the cap: after the first 10 s, at least half the cap apart.
      assert.ok(gaps.filter((_, i) => at[i] >= 10_000).every((g) => g >= MAX / 2), `${address}: gaps ${gaps.join(',')}`);
    }
    assert.ok(attempts.length <= 60, `random ${r}: ${attempts.length} attempts in 60 s`);
  }
});

test('standbys are asked again at most every 500 ms and at least 50 ms apart, and two naming each other do not spin', () => {
  for (const r of RANDOMS) {
    // No leader for a minute: a standby names the dead one (each gap: the back-off, the answer, and at
    // most one attempt at the dead address in between, 2 ms each).
    const attempts = simulate(['a:1', 'b:1'], r, DROPPED, (address) => (address === 'a:1' ? REFUSED : standby('a:1')), 60_000);
    const atB = attempts.filter((a) => a.address === 'b:1').map((a) => a.at);
    const gaps = atB.slice(1).map((t, i) => t - atB[i]);
    assert.ok(gaps.every((g) => g >= MIN / 2 && g <= STANDBY_MAX_BACKOFF_MS + 4), `random ${r}: gaps ${gaps.join(',')}`);
    assert.ok(atB.length <= 60_000 / 250 + 5, `random ${r}: ${atB.length} attempts at the standby in 60 s`);
    // Two standbys each naming the other (a leader advertising the wrong address): at most one attempt at once in a row.
    const loop = simulate(['b:1', 'c:1'], r, DROPPED, (address) => standby(address === 'b:1' ? 'c:1' : 'b:1'), 10_000);
    assert.ok(loop.length <= 2 * (10_000 / 250) + 5, `random ${r}: ${loop.length} attempts in 10 s`);
    for (let i = 2; i < loop.length; i++) assert.ok(loop[i].at - loop[i - 2].at >= MIN / 2, `random ${r}: three attempts within ${loop[i].at - loop[i - 2].at} ms`);
  }
});

test('a node whose node id is still held retries the same address with the grown back-off', () => {
  const held: StreamEnd = { code: GrpcStatus.ALREADY_EXISTS, details: 'node id in use' };
  const attempts = simulate(['a:1', 'b:1'], 0.5, held, () => held, 20_000);
  assert.ok(attempts.every((a) => a.address === 'a:1'));
  const gaps = attempts.slice(1).map((a, i) => a.at - attempts[i].at);
  assert.ok(gaps.at(-1)! >= MAX / 2 && attempts.length <= 20, `gaps ${gaps.join(',')}`);
});

test('once a stream is accepted the back-off starts again from the bottom', () => {
  let now = 0;
  const search = new LeaderSearch(['a:1', 'b:1'], { minBackoffMs: MIN, maxBackoffMs: MAX, now: () => now, random: () => 0.999 });
  for (let i = 0; i < 12; i++) {
    const n = search.ended(REFUSED);
    now += n.delayMs + 2;
  }
  search.connected();
  const n = search.ended(DROPPED);
  assert.ok(n.delayMs <= MIN, `${n.delayMs} ms`);
});
