// What a node says it used of its key minutes, and how often (issue 19, docs/leases.md "Standing
// shares"): every 100 ms only for key minutes it asked the control plane for; a key minute used within
// its standing share waits for the whole-second tick. Each of them ten times a second was one message
// in and one acknowledgement out per node every 100 ms, most of the control plane's CPU per request.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock, minuteOf } from '../../data-plane/limits/clock.js';
import type { KeyLimits } from '../../data-plane/limits/key-budgets.js';

const limitsOf = (keyId: string): KeyLimits => ({ keyId, rpmLimit: 1200, tpmLimit: 1_000_000, maxParallel: 100 });

function node(): { lc: LeaseClient; out: LeaseRequestOut[]; minute: number } {
  const clock = new ManualClock(60_000 * 100 + 1_000);
  const out: LeaseRequestOut[] = [];
  const lc = new LeaseClient(clock, (r) => (out.push(r), true), (fn) => fn(), true);
  lc.setConnected(true, 3);
  const minute = minuteOf(clock.now());
  lc.applyBulk({ minute, granted: true, nodes: 3, exceptions: [] });
  out.length = 0;
  return { lc, out, minute };
}

const usedIn = (out: LeaseRequestOut[]) => out.flatMap((r) => r.used.map((u) => `${u.keyId}:${u.requests}`));

test('used cadence: a key minute used within its standing share is said on the whole-second tick, not on the 100 ms ones', () => {
  const { lc, out, minute } = node();
  assert.equal(lc.allowanceFor('quiet', minute, limitsOf('quiet')).requests, 100, 'the standing share: 1200 / (4 × 3)');
  lc.noteUsage('quiet', minute, 3, 90);
  lc.sendUsed(false);
  assert.deepEqual(usedIn(out), [], 'within its share: not said on a 100 ms tick');
  assert.equal(lc.usedState().pending, 1, 'still to be said');
  lc.sendUsed(true);
  assert.deepEqual(usedIn(out), ['quiet:3'], 'said on the whole-second tick');
  assert.equal(lc.usedState().pending, 0);
});

test('used cadence: a key minute the node asked the control plane for is said on every 100 ms tick', () => {
  const { lc, out, minute } = node();
  lc.allowanceFor('busy', minute, limitsOf('busy'));
  lc.allowanceFor('quiet', minute, limitsOf('quiet'));
  // Its share is not enough for a request: the node asks for more (a want).
  assert.equal(lc.waitForKey('busy', minute, limitsOf('busy'), 101, 0, () => undefined), true);
  assert.equal(out.flatMap((r) => r.keys).length, 1, 'a want was sent');
  out.length = 0;
  lc.noteUsage('busy', minute, 100, 3000);
  lc.noteUsage('quiet', minute, 1, 30);
  lc.sendUsed(false);
  assert.deepEqual(usedIn(out), ['busy:100'], 'the key minute it asked for, alone');
  lc.sendUsed(true);
  assert.deepEqual(usedIn(out), ['busy:100', 'quiet:1'], 'then the rest on the whole-second tick');
});
