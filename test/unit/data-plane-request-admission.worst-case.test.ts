// Admission.reserveWorstCaseOrWait (data-plane/request/admission.ts) with a real lease client: a request's
// money reservation raised to its worst case once its body is read (issue 32 finding 5;
// docs/money-limits.md#the-last-request), waiting (bounded) for the pool's answer as reserveOrWait does.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { KeyRecord } from '../../data-plane/state/key-table.js';
import { GatewayError } from '../../data-plane/errors.js';
import { Admission, type WorstCaseResult } from '../../data-plane/request/admission.js';
import { LEASE_WAIT_MS, LEASE_WAIT_RECLAIMING_MS } from '../../data-plane/limits/lease-wait.js';
import type { KeyBudgets } from '../../data-plane/limits/key-budgets.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import type { WorstCase } from '../../data-plane/limits/worst-case.js';
import { advance, clock, useManualTime, wakesRun } from '../helpers/admission-fakes.js';

useManualTime();

const key = { keyId: 'k', orgId: 'org' } as KeyRecord;
/** 5,000 µ$ at worst: no input, up to 500 output tokens at 10 µ$ each. */
const worst: WorstCase = { micros: 5000, priced: true, inputTokens: 0, outputTokens: 500, field: 'max_tokens', inputMicrosPerMtok: 0, outputMicrosPerMtok: 10_000_000 };

/** A node on two with 1,000 µ$ of the organisation's money, one request admitted (its estimate 0). */
function setup() {
  const sent: LeaseRequestOut[] = [];
  const leases = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  leases.setConnected(true, 2);
  leases.canSpend('org');
  leases.applyOrgGrant('org', 1000, false);
  const admission = new Admission({ clock, keyBudgets: {} as KeyBudgets, leases }, () => {
    throw new Error('not admitted here');
  });
  const spend = leases.reserveSpend('org')!;
  const results: WorstCaseResult[] = [];
  let gone = false;
  admission.reserveWorstCaseOrWait(key, spend, worst, () => gone, (r) => results.push(r));
  return { leases, sent, spend, results, admission, leave: () => (gone = true) };
}

test('covered by the slice: reserved at once', () => {
  const sent: LeaseRequestOut[] = [];
  const leases = new LeaseClient(clock, (r) => (sent.push(r), true), (fn) => fn());
  leases.setConnected(true, 2);
  leases.canSpend('org');
  leases.applyOrgGrant('org', 9000, false);
  const admission = new Admission({ clock, keyBudgets: {} as KeyBudgets, leases }, () => {
    throw new Error('unused');
  });
  const results: WorstCaseResult[] = [];
  admission.reserveWorstCaseOrWait(key, leases.reserveSpend('org'), worst, () => false, (r) => results.push(r));
  assert.deepEqual(results, [null]);
  assert.equal(leases.sliceOf('org'), 4000);
});

test('short: waits for the need it asked, then reserved (granted), refused naming what fits (nothing more), or reserved at the bound (no answer)', async () => {
  // Granted.
  let s = setup();
  assert.deepEqual(s.results, [], 'waits');
  assert.equal(s.sent.at(-1)!.orgs[0].needMicros, 4000, 'the shortfall of its worst case is the need');
  s.leases.applyOrgGrant('org', 20_000, false);
  await wakesRun();
  assert.deepEqual(s.results, [null]);
  assert.equal(s.spend.micros, 5000);
  // Nothing more (after the other nodes were asked): refused, the 1,000 µ$ left buy 100 output tokens.
  s = setup();
  s.leases.applyOrgGrant('org', 0, true);
  await wakesRun();
  assert.equal(s.results.length, 1);
  const refusal = s.results[0] as GatewayError;
  assert.ok(refusal instanceof GatewayError);
  assert.equal(refusal.code, 'ORG_BLOCKED');
  assert.match(refusal.message, /you requested up to 500 output tokens, but can only afford 100\.$/);
  assert.equal(s.spend.micros, 0, 'nothing taken');
  // No answer within the bound: reserved in advance of it (a debt the next want declares).
  s = setup();
  advance(LEASE_WAIT_MS);
  assert.deepEqual(s.results, [null]);
  assert.equal(s.leases.sliceOf('org'), -4000);
  assert.deepEqual(s.admission.waits.snapshot().waited, 1);
});

test('the client went away while it waited: nothing reserved, nothing answered', async () => {
  const s = setup();
  s.leave();
  advance(LEASE_WAIT_MS);
  assert.deepEqual(s.results, ['gone']);
  assert.equal(s.spend.micros, 0);
  assert.equal(s.leases.sliceOf('org'), 1000);
});

test('out of time past what the control plane said may be taken in advance: one request more, the others wait for the answer (at most 5 s)', async () => {
  const leases = new LeaseClient(clock, () => true, (fn) => fn());
  leases.setConnected(true, 2);
  leases.canSpend('org');
  // Near the limit: nothing may be taken in advance of a late answer.
  leases.applyOrgGrant('org', 1000, false, 0);
  const admission = new Admission({ clock, keyBudgets: {} as KeyBudgets, leases }, () => {
    throw new Error('not admitted here');
  });
  const results: WorstCaseResult[][] = [[], [], []];
  const spends = results.map(() => leases.reserveSpend('org')!);
  spends.forEach((spend, i) => admission.reserveWorstCaseOrWait(key, spend, worst, () => false, (r) => results[i].push(r)));
  advance(LEASE_WAIT_MS);
  assert.deepEqual(results, [[null], [], []], 'the one request more; the others wait on');
  assert.equal(leases.sliceOf('org'), -4000);
  // The answer: each waiting request decided by it (one request more past this answer's allowance).
  leases.applyOrgGrant('org', 6000, false, 0);
  await wakesRun();
  assert.deepEqual(results, [[null], [null], []]);
  assert.equal(leases.sliceOf('org'), -3000);
  // Silent as long as a reclaim may take: for that request, unreachable; reserved as when the connection is down.
  advance(LEASE_WAIT_RECLAIMING_MS - LEASE_WAIT_MS - 10);
  assert.deepEqual(results[2], []);
  advance(10);
  assert.deepEqual(results, [[null], [null], [null]]);
  assert.equal(leases.sliceOf('org'), -8000);
});
