// keyHmac (data-plane/state/key-hmac.ts) is HMAC-SHA256 from precomputed pad states: it must give
// createHmac's digest for every key and pepper, or a valid key would stop authenticating.
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { test } from 'node:test';
import fc from 'fast-check';
import { keyHmac } from '../../data-plane/state/key-hmac.js';

const reference = (pepper: Buffer, key: string): Buffer => createHmac('sha256', pepper).update(key).digest();

test('keyHmac equals createHmac at every key length around the block boundaries', () => {
  const pepper = randomBytes(32);
  // Lengths 0–200 cross the one-, two- and three-block paddings (55/56, 119/120 bytes).
  for (let n = 0; n <= 200; n++) {
    const key = 'tg_' + 'k'.repeat(n);
    assert.deepEqual(keyHmac(pepper, key), reference(pepper, key), `length ${key.length}`);
  }
  for (const key of ['', 'é', 'sk-ünïcødé', '😀', '\ud800', 'a\udc00b', '\u0000', 'x'.repeat(5000) + '€']) {
    assert.deepEqual(keyHmac(pepper, key), reference(pepper, key), JSON.stringify(key.slice(0, 20)));
  }
});

test('keyHmac equals createHmac for peppers shorter than, equal to and longer than a block', () => {
  for (const len of [0, 1, 16, 32, 63, 64, 65, 100, 200]) {
    const pepper = randomBytes(len);
    for (const key of ['tg_abc', 'sk-' + 'z'.repeat(60)]) assert.deepEqual(keyHmac(pepper, key), reference(pepper, key), `pepper ${len} bytes`);
  }
});

test('keyHmac equals createHmac for arbitrary keys and peppers, alternating peppers', () => {
  const key = fc.oneof(fc.string({ maxLength: 140 }), fc.fullUnicodeString({ maxLength: 80 }), fc.stringOf(fc.constantFrom('a', 'é', '\ud83d', '\ude00', '€', '_'), { maxLength: 70 }));
  const pepper = fc.uint8Array({ minLength: 0, maxLength: 130 }).map((a) => Buffer.from(a));
  fc.assert(
    fc.property(pepper, pepper, fc.array(key, { minLength: 1, maxLength: 5 }), (p1, p2, keys) => {
      for (const k of keys) {
        assert.deepEqual(keyHmac(p1, k), reference(p1, k));
        assert.deepEqual(keyHmac(p2, k), reference(p2, k));
      }
    }),
    { numRuns: 2000 },
  );
});

test('keyHmac: many keys under one pepper, as the node looks them up', () => {
  const pepper = randomBytes(32);
  for (let i = 0; i < 5000; i++) {
    const key = `tg_${randomBytes(1 + (i % 48)).toString('base64url')}`;
    assert.deepEqual(keyHmac(pepper, key), reference(pepper, key), key.length.toString());
  }
});
