// What a standby says and what nodes and the CLI read from it (several control planes on one database).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isStandbyRefusal, leaderFromDetails, splitAddresses, standbyDetails } from '../../proto/lib/leader-hint.js';

test("a standby's refusal names the leader, and the leader is read back from it", () => {
  assert.equal(standbyDetails('cp-a:50051'), 'this control plane is a standby: the leader is at cp-a:50051');
  assert.equal(leaderFromDetails(standbyDetails('cp-a:50051')), 'cp-a:50051');
  assert.equal(leaderFromDetails(standbyDetails('[::1]:50051')), '[::1]:50051');
  assert.equal(isStandbyRefusal(standbyDetails('cp-a:50051')), true);
  // No leader known yet: a standby's refusal all the same, naming nobody.
  assert.equal(isStandbyRefusal(standbyDetails('')), true);
  assert.equal(leaderFromDetails(standbyDetails('')), null);
  // Anything else is not a standby's refusal.
  assert.equal(isStandbyRefusal('No connection established. Last error: connect ECONNREFUSED 127.0.0.1:1'), false);
  assert.equal(isStandbyRefusal(undefined), false);
  assert.equal(leaderFromDetails(undefined), null);
});

test('several addresses are split on commas, blanks dropped', () => {
  assert.deepEqual(splitAddresses('a:1,b:2'), ['a:1', 'b:2']);
  assert.deepEqual(splitAddresses(' a:1 , b:2 ,'), ['a:1', 'b:2']);
  assert.deepEqual(splitAddresses('a:1'), ['a:1']);
  assert.deepEqual(splitAddresses(','), []);
});
