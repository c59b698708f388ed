// RequestContext: every way a request ends returns or settles its money reservation and its key
// ticket exactly once.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ModelConfig, UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyRecord } from '../../data-plane/state/key-table.js';
import { RequestContext } from '../../data-plane/request/request-context.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets } from '../../data-plane/limits/key-budgets.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';

const KEY = {
  keyId: 'key-1',
  orgId: 'org-1',
  projectId: 'proj-1',
  limits: { keyId: 'key-1', rpmLimit: 300, tpmLimit: 1_000_000, maxParallel: 100 },
} as unknown as KeyRecord;
const CHAT = { id: 'm', kind: 'chat', inputMicrosPerMtok: 5_000_000, outputMicrosPerMtok: 15_000_000, audioMicrosPerUnit: 0 } as unknown as ModelConfig;

/** A response that ends when the test says so. */
class FakeReply {
  private fns: Array<(aborted: boolean) => void> = [];
  onFinish(fn: (aborted: boolean) => void) {
    this.fns.push(fn);
  }
  end(aborted: boolean) {
    for (const fn of this.fns.splice(0)) fn(aborted);
  }
}

function setup() {
  const clock = new ManualClock();
  const leases = new LeaseClient(clock, () => true, (fn) => fn());
  leases.setConnected(true, 1);
  leases.canSpend(KEY.orgId);
  leases.applyOrgGrant(KEY.orgId, 1_000_000, false);
  const budgets = new KeyBudgets(clock);
  const records: UsageRecord[] = [];
  const deps = { clock, leases, reporter: { record: (u: UsageRecord) => records.push(u) } };
  let n = 0;
  const start = (providerStarted: boolean, model: ModelConfig | null = null) => {
    const a = budgets.admit(KEY.limits, 10);
    assert.ok(a.ok);
    const ctx = new RequestContext(deps, `r${++n}`, KEY, '/v1/x', a.ticket, 0);
    ctx.spend = leases.reserveSpend(KEY.orgId);
    ctx.providerStarted = providerStarted;
    ctx.model = model;
    ctx.estimatedPromptTokens = 100;
    const reply = new FakeReply();
    ctx.attach(reply);
    return { ctx, reply };
  };
  return { leases, budgets, records, start };
}

test('50 aborted tool requests leave the organisation slice where it was', () => {
  // Before the fix, a request without a model never settled its reservation: each aborted tool call
  // kept the estimated cost of the organisation's costliest request reserved for good.
  const { leases, budgets, records, start } = setup();
  // One costly model call sets the per-request reservation.
  const first = start(true, CHAT);
  first.ctx.complete({ status: 200, promptTokens: 8000, completionTokens: 10 });
  first.reply.end(false);
  const slice = leases.sliceOf(KEY.orgId)!;
  assert.ok(slice < 1_000_000);
  for (let i = 0; i < 50; i++) {
    const { ctx, reply } = start(true);
    ctx.abortFns.push(() => ctx.complete({ status: 499, promptTokens: 0, completionTokens: 0 }));
    reply.end(true);
  }
  assert.equal(leases.sliceOf(KEY.orgId), slice);
  assert.equal(budgets.usage(KEY.keyId).inFlight, 0, 'every slot released');
  assert.equal(records.length, 1, 'tool calls record no usage rows');
});

test('every way a request ends settles the reservation exactly once', () => {
  const ends: Array<[string, (c: ReturnType<ReturnType<typeof setup>['start']>) => void, number]> = [
    ['refused by a later check', ({ ctx, reply }) => (ctx.refuse(), reply.end(false)), 0],
    ['aborted before any upstream call', ({ reply }) => reply.end(true), 0],
    ['aborted while the provider runs, provider never reports', ({ ctx, reply }) => ((ctx.providerStarted = true), (ctx.model = CHAT), reply.end(true)), 500],
    ['completed, then the response ends', ({ ctx, reply }) => ((ctx.providerStarted = true), (ctx.model = CHAT), ctx.complete({ status: 200, promptTokens: 100, completionTokens: 0 }), reply.end(false)), 500],
    ['completed twice', ({ ctx, reply }) => ((ctx.providerStarted = true), (ctx.model = CHAT), ctx.complete({ status: 200, promptTokens: 100, completionTokens: 0 }), ctx.complete({ status: 200, promptTokens: 9999, completionTokens: 0 }), reply.end(false)), 500],
    ['a throwing abort function does not skip the settlement', ({ ctx, reply }) => (ctx.abortFns.push(() => { throw new Error('boom'); }), reply.end(true)), 0],
  ];
  for (const [what, end, cost] of ends) {
    const { leases, budgets, start } = setup();
    const before = leases.sliceOf(KEY.orgId)!;
    const c = start(false);
    end(c);
    assert.equal(leases.sliceOf(KEY.orgId), before - cost, what);
    assert.equal(budgets.usage(KEY.keyId).inFlight, 0, `${what}: slot released`);
    assert.equal(c.ctx.completed, true, what);
  }
});
