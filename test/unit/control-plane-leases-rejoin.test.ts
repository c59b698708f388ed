// The nodes a control plane waits for after its start (control-plane/leases/rejoin.ts, docs/leases.md
// "A control plane that restarts"): done once every one is back, or when the grace passed, with the
// nodes that did not come back named once.
import assert from 'node:assert/strict';
import { test, mock } from 'node:test';
import { Rejoin } from '../../control-plane/leases/rejoin.js';

test('waits until every expected node is back; a node not expected changes nothing', async () => {
  const ends: string[][] = [];
  const r = new Rejoin(['node-a', 'node-b'], 60_000, (missing) => ends.push(missing));
  assert.equal(r.pending, true);
  assert.equal(r.missing, 2);
  r.arrived('node-x');
  r.arrived('node-a');
  r.arrived('node-a');
  assert.equal(r.missing, 1);
  assert.deepEqual(ends, []);
  r.arrived('node-b');
  assert.equal(r.pending, false);
  await r.done;
  assert.deepEqual(ends, [[]]);
  r.end();
  assert.deepEqual(ends, [[]], 'the end is told once');
});

test('after the grace it stops waiting and names the nodes that did not come back', async () => {
  mock.timers.enable({ apis: ['setTimeout'] });
  try {
    const ends: string[][] = [];
    const r = new Rejoin(['node-a', 'node-b', 'node-c'], 3000, (missing) => ends.push(missing));
    mock.timers.tick(10_000);
    assert.equal(r.pending, true, 'the grace starts when the server listens');
    r.startGrace();
    r.arrived('node-b');
    mock.timers.tick(2999);
    assert.equal(r.pending, true);
    mock.timers.tick(1);
    assert.equal(r.pending, false);
    assert.equal(r.missing, 0);
    await r.done;
    assert.deepEqual(ends, [['node-a', 'node-c']]);
    r.arrived('node-a');
    assert.deepEqual(ends, [['node-a', 'node-c']]);
  } finally {
    mock.timers.reset();
  }
});

test('nobody expected: done at once', async () => {
  const ends: string[][] = [];
  const r = new Rejoin([], 3000, (missing) => ends.push(missing));
  assert.equal(r.pending, false);
  await r.done;
  assert.deepEqual(ends, [[]]);
});
