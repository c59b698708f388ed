// The registry of what keys have open on a node: closing by key, by organisation and by predicate
// ends exactly the matching entries, each once, and unregistering is idempotent.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { OpenStreams, type StreamEndReason } from '../../data-plane/auth/open-streams.js';

test('closeKey ends every open stream of that key once, and no other', () => {
  const s = new OpenStreams();
  const ended: string[] = [];
  const reg = (key: string, org: string, name: string) => s.register(key, org, (why: StreamEndReason) => ended.push(`${name}:${why}`));
  reg('k1', 'o1', 'a');
  reg('k1', 'o1', 'b');
  reg('k2', 'o1', 'c');
  const unD = reg('k3', 'o2', 'd');
  assert.equal(s.count(), 4);
  assert.equal(s.closeKey('k1'), 2);
  assert.deepEqual(ended, ['a:key_revoked', 'b:key_revoked']);
  assert.equal(s.closeKey('k1'), 0, 'already closed');
  assert.equal(s.closeOrg('o1'), 1);
  assert.deepEqual(ended.slice(2), ['c:org_blocked']);
  unD();
  unD();
  assert.equal(s.count(), 0);
  assert.equal(s.closeOrg('o2'), 0, 'an unregistered stream is not closed');
});

test('closeWhere ends what the predicate names, with its reason; a throwing closer does not stop the others', () => {
  const s = new OpenStreams();
  const ended: string[] = [];
  s.register('k1', 'o1', () => {
    throw new Error('boom');
  });
  s.register('k1', 'o1', (why) => ended.push(`k1:${why}`));
  s.register('k2', 'o2', (why) => ended.push(`k2:${why}`));
  s.register('k3', 'o3', (why) => ended.push(`k3:${why}`));
  const n = s.closeWhere((key, org) => (key === 'k1' ? 'key_revoked' : org === 'o2' ? 'org_blocked' : null));
  assert.equal(n, 3);
  assert.deepEqual(ended, ['k1:key_revoked', 'k2:org_blocked']);
  assert.equal(s.count(), 1);
  assert.equal(s.count('k3'), 1);
});
