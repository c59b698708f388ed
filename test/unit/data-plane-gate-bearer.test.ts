// bearerToken reads an Authorization header exactly as the pattern /^Bearer +(\S+) *$/ did, for any
// string: a property over arbitrary text, biased toward header-like values.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { bearerToken } from '../../data-plane/gate/bearer.js';

const PATTERN = /^Bearer +(\S+) *$/;

test('bearerToken: the cases that matter', () => {
  const rows: Array<[string, string | null]> = [
    ['Bearer tg_abc', 'tg_abc'],
    ['Bearer   tg_abc  ', 'tg_abc'],
    ['Bearer tg_abc def', null],
    ['Bearer\ttg_abc', null],
    ['Bearer tg_\u00a0abc', null],
    ['Bearer tg_é', 'tg_é'],
    ['Bearer ', null],
    ['Bearer', null],
    ['bearer tg_abc', null],
    ['Basic dXNlcg==', null],
    ['', null],
  ];
  for (const [h, want] of rows) assert.equal(bearerToken(h), want, JSON.stringify(h));
});

test('bearerToken equals the pattern on arbitrary headers', () => {
  const piece = fc.oneof(fc.constantFrom('Bearer', ' ', '  ', '\t', '\u00a0', '\u2028', '\ufeff', 'tg_', 'x', 'é', '\n'), fc.string({ maxLength: 6 }), fc.fullUnicodeString({ maxLength: 4 }));
  const header = fc.oneof(fc.array(piece, { maxLength: 8 }).map((xs) => xs.join('')), fc.array(piece, { maxLength: 6 }).map((xs) => `Bearer ${xs.join('')}`));
  fc.assert(
    fc.property(header, (h) => {
      assert.equal(bearerToken(h), PATTERN.exec(h)?.[1] ?? null, JSON.stringify(h));
    }),
    { numRuns: 20_000, seed: 13 },
  );
});
