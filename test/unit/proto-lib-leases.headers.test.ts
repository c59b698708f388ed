// What a key grant tells a node for its rate headers (issue 32, finding 7; docs/leases.md, "Rate
// headers"): what the pool's other holders said they used, never what they merely hold.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KeyLeaseLedger } from '../../control-plane/leases/key-lease-ledger.js';
import { granted, want } from '../helpers/leases.js';

const limits = { rpm: 20, tpm: 60_000 };
const used = (g: { othersUsedRequests: number; othersUsedTokens: number }) => [g.othersUsedRequests, g.othersUsedTokens];
const usedOf = (o: { requests: number; tokens: number }) => [o.requests, o.tokens];

test('key grant: the others\' use is what they said they used; an untouched standing share counts nothing', () => {
  // Before: the node took the pool's free count as what was left, so another node's standing share,
  // held but unused, counted as spent in its headers.
  const l = new KeyLeaseLedger(() => limits);
  for (const c of ['a#1', 'b#1', 'c#1']) assert.deepEqual(l.grantBulk(c, 5, 3), []);
  // Node b used 1 of its share before anyone needed more than a share: the pool does not exist yet.
  l.recordUsed('b#1', { keyId: 'k', minute: 5, requests: 1, tokens: 30 });
  const first = granted(l.grant('a#1', want({ requests: 3, tokens: 5000, heldRequests: 1, heldTokens: 5000 }), limits));
  assert.deepEqual(used(first), [1, 30], 'b\'s word before the pool was made counts; c\'s untouched share does not');
  assert.equal(first.freeRequests, 20 - 3 * 1 - 3, 'the pool counts every share as held');
  // Node a says what it used: b's next grant counts it, not b's own.
  l.recordUsed('a#1', { keyId: 'k', minute: 5, requests: 4, tokens: 400 });
  assert.deepEqual(used(granted(l.grant('b#1', want({ requests: 3 }), limits))), [4, 400]);
  assert.deepEqual(usedOf(l.othersUsedOf('k', 5, 'c#1')), [5, 430]);
  // Node b dies: what it said it used stays counted (a ghost), for a and for c.
  l.release('b#1');
  assert.deepEqual(used(granted(l.grant('a#1', want({ requests: 1 }), limits))), [1, 30]);
  assert.deepEqual(usedOf(l.othersUsedOf('k', 5, 'c#1')), [5, 430]);
  // Node a on a new connection (the old one not yet closed) is not "another node" to itself.
  assert.deepEqual(used(granted(l.grant('a#2', want({ heldRequests: 8 }), limits))), [1, 30]);
});
