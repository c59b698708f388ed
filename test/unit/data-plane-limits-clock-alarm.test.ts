// The alarm that ends what a key has open at its expiry (limits/clock.ts `Alarm`): it rings once the
// clock reaches its deadline, never inside `set` or inside the clock's move (the caller, a request
// handler or the admin listener's clock handler, is not re-entered), and on a manual clock it follows
// the clock's moves rather than the wall, so tests drive it deterministically.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setImmediate as tick } from 'node:timers/promises';
import { Alarm, ManualClock, type Clock } from '../../data-plane/limits/clock.js';

/** Until the timers due now have run (a setTimeout of 0 runs before the next check phase but one). */
const timersRun = async () => {
  await new Promise((resolve) => setTimeout(resolve, 0));
  await tick();
};

test('on a manual clock it rings when a move reaches the deadline, once, and not before', async () => {
  const clock = new ManualClock(1_000_000);
  let rung = 0;
  const alarm = new Alarm(clock, () => rung++);
  alarm.set(1_005_000);
  await timersRun();
  assert.equal(rung, 0);
  clock.advance(4_999);
  await timersRun();
  assert.equal(rung, 0, 'a millisecond before');
  clock.advance(1);
  assert.equal(rung, 0, 'not inside the move');
  await timersRun();
  assert.equal(rung, 1);
  assert.equal(alarm.deadline, Infinity);
  clock.advance(60_000);
  await timersRun();
  assert.equal(rung, 1, 'once');
});

test('set to a moment already past it rings from a timer, not inside set; set to Infinity it is off', async () => {
  const clock = new ManualClock(1_000_000);
  let rung = 0;
  const alarm = new Alarm(clock, () => rung++);
  alarm.set(999_000);
  assert.equal(rung, 0);
  await timersRun();
  assert.equal(rung, 1);
  alarm.set(1_001_000);
  alarm.set(Infinity);
  clock.advance(10_000);
  await timersRun();
  assert.equal(rung, 1);
});

test('on a clock that timers follow it rings by a timer; a timer that comes early waits again', async () => {
  let now = 0;
  const clock: Clock = { now: () => now };
  let rung = 0;
  const alarm = new Alarm(clock, () => rung++);
  alarm.set(5);
  // The timer (5 ms) fires while this clock still says 0: it re-arms instead of ringing.
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(rung, 0);
  now = 5;
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(rung, 1);
  assert.equal(alarm.deadline, Infinity);
});
