// Path sanity as tables: what is refused with 400 `bad_path` before anything else looks at a path, and
// what legitimate tool paths look like.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isBadPath, MAX_DECODE_ROUNDS } from '../../data-plane/routing/path-sanity.js';
import { BAD_PATHS, GOOD_PATHS } from '../helpers/paths.js';

test('path tricks are bad paths', () => {
  // Before: `..;`, double encoding, overlong UTF-8, invalid UTF-8 and control characters passed.
  for (const [p, why] of BAD_PATHS) assert.equal(isBadPath(p), true, `${why}: ${JSON.stringify(p.slice(0, 60))}`);
});

test('legitimate paths pass: dots inside names, encoded spaces and unicode, sub-delimiters', () => {
  for (const p of GOOD_PATHS) assert.equal(isBadPath(p), false, JSON.stringify(p.slice(0, 60)));
});

test('decoding stops after a bounded number of rounds', () => {
  assert.equal(MAX_DECODE_ROUNDS, 3);
  // Three rounds reach a dot segment; a fourth level of encoding is refused because it is still changing.
  assert.equal(isBadPath('/v1/files/%25252e'), true);
  assert.equal(isBadPath('/v1/files/%252541'), false, 'three rounds: %252541 → %2541 → %41 → A');
  assert.equal(isBadPath('/v1/files/%25252541'), true, 'after three rounds still %41');
});
