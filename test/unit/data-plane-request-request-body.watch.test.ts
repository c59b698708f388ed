// BodyWatch: a body read whole must keep a minimum average rate after its grace (408 below it).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BodyWatch, type PacedBody } from '../../data-plane/request/request-body.js';

function body(startedAt: number, received: number): PacedBody & { slow: boolean } {
  return {
    startedAt,
    received,
    slot: -1,
    slow: false,
    tooSlow() {
      this.slow = true;
    },
  };
}

test('a body is refused once it has less than rate × (elapsed − grace) bytes, and only then', () => {
  let now = 0;
  const w = new BodyWatch({ minBytesPerSec: 1000, graceMs: 2000 }, () => now, 60_000);
  // [started at, bytes received, swept at, refused]
  const rows: Array<[number, number, number, boolean]> = [
    [0, 0, 1999, false],
    [0, 0, 2500, true],
    [0, 500, 2500, false],
    [0, 500, 2600, true],
    [1000, 5000, 7000, false],
    [1000, 3999, 7000, true],
  ];
  for (const [startedAt, received, at, refused] of rows) {
    const b = body(startedAt, received);
    w.add(b);
    now = at;
    assert.equal(w.sweep(), refused ? 1 : 0, JSON.stringify([startedAt, received, at]));
    assert.equal(b.slow, refused);
    w.remove(b);
  }
  assert.equal(w.watching, 0);
});

test('no minimum rate (0): nothing is watched', () => {
  const w = new BodyWatch({ minBytesPerSec: 0, graceMs: 1000 }, () => 10_000);
  w.add(body(0, 0));
  assert.equal(w.watching, 0);
});
