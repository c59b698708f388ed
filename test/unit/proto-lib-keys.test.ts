import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkPepper, generateKey, hashKey, keyPattern, maskKey, secretsEqual, hashToken, pepperCheck } from '../../proto/lib/keys.js';
import { formatUsd, parseUsd } from '../../proto/lib/money.js';

const pepper = Buffer.from('a'.repeat(64));
const otherPepper = Buffer.from('b'.repeat(64));

test('a key is sk-tollgate- followed by 43 base62 characters', () => {
  for (let i = 0; i < 200; i++) {
    const key = generateKey('tollgate');
    assert.match(key, /^sk-tollgate-[0-9A-Za-z]{43}$/);
    assert.match(key, keyPattern('tollgate'));
  }
  assert.match(generateKey('acme'), /^sk-acme-[0-9A-Za-z]{43}$/);
});

test('keys are unique and use the whole alphabet', () => {
  const keys = new Set(Array.from({ length: 5000 }, () => generateKey('tollgate')));
  assert.equal(keys.size, 5000);
  const chars = new Set([...keys].join('').slice(0));
  for (const c of '0aZz9A') assert.ok(chars.has(c), `character ${c} never drawn`);
});

test('maskKey shows the first 12 characters and the last four only', () => {
  const key = 'sk-tollgate-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG';
  assert.equal(maskKey(key), 'sk-tollgate-...DEFG');
  const real = generateKey('tollgate');
  const masked = maskKey(real);
  assert.equal(masked.length, 12 + 3 + 4);
  assert.ok(masked.startsWith('sk-tollgate-'));
  assert.ok(masked.endsWith(real.slice(-4)));
  assert.ok(!masked.includes(real.slice(12, -4)));
});

test('hashKey is HMAC-SHA256 hex; the wrong pepper gives a different hash', () => {
  const key = generateKey('tollgate');
  const h = hashKey(pepper, key);
  assert.match(h, /^[0-9a-f]{64}$/);
  assert.equal(hashKey(pepper, key), h);
  assert.notEqual(hashKey(otherPepper, key), h);
  assert.notEqual(hashKey(pepper, generateKey('tollgate')), h);
  assert.ok(!h.includes(key));
});

test('pepperCheck proves the same pepper without revealing it', () => {
  assert.equal(pepperCheck(pepper), pepperCheck(Buffer.from(pepper)));
  assert.notEqual(pepperCheck(pepper), pepperCheck(otherPepper));
  assert.ok(!pepperCheck(pepper).includes('aaaa'));
});

test('secretsEqual compares exactly', () => {
  const cases: [string, string, boolean][] = [
    ['abc', 'abc', true],
    ['abc', 'abd', false],
    ['abc', 'abcd', false],
    ['', '', true],
    ['', 'x', false],
    [hashToken('t1'), hashToken('t1'), true],
    [hashToken('t1'), hashToken('t2'), false],
  ];
  for (const [a, b, want] of cases) assert.equal(secretsEqual(a, b), want, `${a} vs ${b}`);
});

test('checkPepper refuses an absent or short pepper', () => {
  assert.match(checkPepper(undefined) ?? '', /no key pepper/);
  assert.match(checkPepper(Buffer.alloc(0)) ?? '', /no key pepper/);
  assert.match(checkPepper(Buffer.from('x'.repeat(31))) ?? '', /too short: 31 bytes/);
  assert.equal(checkPepper(Buffer.from('x'.repeat(32))), null);
});

test('parseUsd and formatUsd are exact in micro-dollars', () => {
  const parse: [string, number | null][] = [
    ['5', 5_000_000],
    ['5.00', 5_000_000],
    ['0.000001', 1],
    ['1.5', 1_500_000],
    [' 2.25 ', 2_250_000],
    ['-3.1', -3_100_000],
    ['0.0000001', null],
    ['1e3', null],
    ['abc', null],
    ['', null],
    ['1.', null],
    ['.5', null],
  ];
  for (const [text, want] of parse) assert.equal(parseUsd(text), want, JSON.stringify(text));
  const format: [number, string][] = [
    [5_000_000, '5.00'],
    [1_234_567, '1.234567'],
    [1, '0.000001'],
    [0, '0.00'],
    [1_500_000, '1.50'],
    [-2_500_000, '-2.50'],
  ];
  for (const [micros, want] of format) assert.equal(formatUsd(micros), want, String(micros));
});
