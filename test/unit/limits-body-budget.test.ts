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
