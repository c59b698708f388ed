// The node-wide body budget: what fits, the per-organisation share, and giving back.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BodyBudget } from '../../data-plane/limits/body-budget.js';

test('bytes fit the node budget and the owner\'s quarter of it; giving back frees both', () => {
  const b = new BodyBudget(100);
  assert.equal(b.maxOwnerBytes, 25);
  const rows: Array<[string, number, 'node' | 'owner' | null]> = [
    ['a', 20, null],
    ['a', 6, 'owner'],
    ['a', 5, null],
    ['b', 25, null],
    ['c', 25, null],
    ['e', 20, null],
    ['d', 10, 'node'],
    ['d', 0, null],
  ];
  for (const [owner, bytes, want] of rows) assert.equal(b.tryTake(bytes, owner), want, `${owner} ${bytes}`);
  assert.equal(b.held(), 95);
  assert.equal(b.held('a'), 25);
  b.give(25, 'a');
  assert.equal(b.held('a'), 0);
  assert.equal(b.tryTake(10, 'd'), null);
  assert.equal(b.held(), 80);
});

test("one account's organisations share one cap: a quarter of the budget together", () => {
  // Issue 21: before, each organisation had its own quarter, so an account with four organisations
  // could hold the whole budget.
  const b = new BodyBudget(100);
  assert.equal(b.maxAccountBytes, 25);
  const rows: Array<[string, string, number, 'node' | 'owner' | 'account' | null]> = [
    ['o1', 'acct', 20, null],
    ['o2', 'acct', 6, 'account'],
    ['o2', 'acct', 5, null],
    ['o3', '', 25, null],
    ['o4', 'other', 25, null],
  ];
  for (const [owner, account, bytes, want] of rows) assert.equal(b.tryTake(bytes, owner, account), want, `${owner} ${account} ${bytes}`);
  assert.equal(b.heldByAccount('acct'), 25);
  assert.deepEqual(b.refusals, { node: 0, owner: 0, account: 1 });
  b.give(20, 'o1', 'acct');
  assert.equal(b.heldByAccount('acct'), 5);
  assert.equal(b.tryTake(20, 'o2', 'acct'), null);
});
