// Helpers for the unit tests of the lease protocol (proto/lib/leases.ts): a key want and a granted key
// lease for the control plane's ledgers, and a lease client (the node's side) on a ManualClock that
// records what it sends.
import assert from 'node:assert/strict';
import type { KeyGrantResult } from '../../control-plane/leases/key-lease-ledger.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import type { KeyLease, KeyLeaseWant } from '../../proto/gen/tollgate/v1/sync.js';

/** A want of key `k` for minute 5: `w` over zeros. */
export function want(w: Partial<KeyLeaseWant>): KeyLeaseWant {
  return { keyId: 'k', minute: 5, heldRequests: 0, heldTokens: 0, requests: 0, tokens: 0, needRequests: 0, needTokens: 0, ...w };
}

/** The grant in a key ledger's answer; fails the test when the answer is a reclaim. */
export function granted(r: KeyGrantResult) {
  assert.equal(r.kind, 'grant', JSON.stringify(r));
  return (r as Extract<KeyGrantResult, { kind: 'grant' }>).grant;
}

/** A lease client connected in a cluster of `nodes`, at minute 100; `sent` is what it sent. */
export function client(nodes: number) {
  const clock = new ManualClock(60_000 * 100);
  const sent: LeaseRequestOut[] = [];
  const lc = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  lc.setConnected(true, nodes);
  return { lc, sent, clock };
}

/** Key `k`'s limits as a node knows them. */
export const limits = { keyId: 'k', rpmLimit: 20, tpmLimit: 60_000, maxParallel: 100 };

/** A lease of key `k` for minute 100: `g` over zeros. */
export function lease(g: Partial<KeyLease>): KeyLease {
  return { keyId: 'k', minute: 100, requests: 0, tokens: 0, finalRequests: false, finalTokens: false, freeRequests: 0, freeTokens: 0, ...g };
}
