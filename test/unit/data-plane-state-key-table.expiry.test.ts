import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseDurationSec } from '../../cli/duration-arg.js';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { hashKey } from '../../proto/lib/keys.js';

const pepper = Buffer.from('p'.repeat(32));

test('a node refuses a key from its expires_at_ms on, by its own clock; a key without expiry never expires', () => {
  const st = new GatewayState();
  const entry = (keyId: string, value: string, expiresAtMs?: number) => ({
    keyId,
    keyHash: hashKey(pepper, value),
    projectId: 'proj_1',
    orgId: 'org_1',
    allowedModels: [],
    rpmLimit: 10,
    tpmLimit: 100,
    maxParallelRequests: 1,
    ...(expiresAtMs === undefined ? {} : { expiresAtMs }),
  });
  st.upsertKey(entry('key_exp', 'sk-a', 1_000_000));
  st.upsertKey(entry('key_never', 'sk-b'));
  st.upsertKey(entry('key_zero', 'sk-c', 0));
  const rows: [string, number | undefined, string | undefined][] = [
    ['sk-a', 999_999, 'key_exp'],
    ['sk-a', 1_000_000, undefined],
    ['sk-a', 5_000_000, undefined],
    ['sk-b', 5_000_000, 'key_never'],
    ['sk-c', Number.MAX_SAFE_INTEGER, 'key_zero'],
    ['sk-z', 0, undefined],
  ];
  for (const [value, now, want] of rows) assert.equal(st.lookup(pepper, value, now)?.keyId, want, `${value} at ${now}`);
  // An expired key's refusal is logged against it, like a revoked key's.
  assert.equal(st.tombstone(pepper, 'sk-a')?.keyId, 'key_exp');
  assert.equal(st.tombstone(pepper, 'sk-z'), undefined);
});

test('durations of the expiry flags', () => {
  const rows: [string, number | null][] = [
    ['45s', 45],
    ['90m', 5400],
    ['12h', 43_200],
    ['30d', 2_592_000],
    [' 7d ', 604_800],
    ['0s', null],
    ['1w', null],
    ['-5m', null],
    ['1.5h', null],
    ['', null],
  ];
  for (const [text, want] of rows) assert.equal(parseDurationSec(text), want, text);
});
