// Node instances' cursors kept in memory once read (state ingest and log store share this): a read
// cursor is kept, a missing one is not (null: the instance has written nothing), and past the bound
// the one kept longest ago is dropped and read again when asked for.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KeptCursors } from '../../control-plane/store/kept-cursors.js';

test('a cursor is read once and kept; a missing one is read each time; past the bound the one kept longest ago is read again', async () => {
  const kept = new KeptCursors(2);
  const reads: string[] = [];
  const reader = (id: string, value: number | null) => async () => (reads.push(id), value);
  const a = KeptCursors.id('n1', 'i1');
  const b = KeptCursors.id('n1', 'i2');
  const c = KeptCursors.id('n2', 'i1');
  assert.equal(await kept.get(a, reader(a, 4)), 4);
  assert.equal(await kept.get(a, reader(a, 99)), 4, 'kept: not read again');
  assert.equal(await kept.get(b, reader(b, null)), null);
  assert.equal(await kept.get(b, reader(b, null)), null, 'nothing to keep: read again');
  kept.keep(b, 7);
  kept.keep(a, 5);
  kept.keep(c, 1);
  assert.equal(await kept.get(a, reader(a, 99)), 5, 'a was kept again after b: b is the one dropped');
  assert.equal(await kept.get(c, reader(c, 99)), 1);
  assert.equal(await kept.get(b, reader(b, 7)), 7, 'b was dropped and is read again');
  assert.deepEqual(reads, [a, b, b, b]);
  assert.notEqual(KeptCursors.id('n1', 'i1'), KeptCursors.id('n1i', '1'));
});
