// Admission (data-plane/request/admission.ts) while a request waits, with the fakes of
// test/helpers/admission-fakes.ts: the bounded wait for the organisation's money slice, for this
// node's lease (granted, spent, late, reclaiming; docs/leases.md "When the control plane answers
// late") and for parallel slots, tokens reserved after admission, and a client that went away while
// waiting. The synchronous cases and the refusals are in data-plane-request-admission.test.ts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LEASE_WAIT_MS, LEASE_WAIT_RECLAIMING_MS } from '../../data-plane/limits/lease-wait.js';
import type { Reply } from '../../data-plane/request/reply.js';
import { RequestContext } from '../../data-plane/request/request-context.js';
import { secondsToNextMinute } from '../../data-plane/limits/clock.js';
import type { MinuteAllowance } from '../../data-plane/limits/key-budgets.js';
import { advance, clock, FakeLeases, FakeReply, header, keyOf, node, usage, useManualTime, wakesRun } from '../helpers/admission-fakes.js';

useManualTime();

// ── the organisation's money slice on its way ────────────────────────────────

test("the organisation's money slice on its way: waits, then admitted (slice came), refused (nothing left) or admitted at the bound (late)", async () => {
  const rows: Array<{ name: string; answer: (l: FakeLeases) => void; at: number; status: number | null }> = [
    { name: 'slice came', answer: (l) => l.orgAnswer('yes'), at: 40, status: null },
    { name: 'nothing left', answer: (l) => l.orgAnswer('no'), at: 40, status: 401 },
    // Out of time with the slice still on its way: admitted, as it costs at most one request in flight.
    { name: 'late', answer: () => {}, at: LEASE_WAIT_MS, status: null },
  ];
  for (const row of rows) {
      const leases = new FakeLeases();
      leases.spend = 'wait';
      const n = node(leases);
      const { reply, out } = n.admit(keyOf());
      assert.equal(out.calls, 0, `${row.name}: waits`);
      assert.equal(leases.orgWaiters.length, 1);
      advance(row.at === LEASE_WAIT_MS ? LEASE_WAIT_MS - 10 : row.at);
      assert.equal(out.calls, 0, `${row.name}: still waiting`);
      if (row.at === LEASE_WAIT_MS) advance(10);
      row.answer(leases);
      await wakesRun();
      assert.equal(out.calls, 1, row.name);
      if (row.status === null) {
        assert.ok(out.ctx instanceof RequestContext, row.name);
        assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 });
        assert.equal(leases.reserved, 1);
      } else {
        assert.equal(out.ctx, null);
        assert.equal(reply.answers[0].status, row.status);
        assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
        assert.equal(leases.reserved, 0);
      }
      assert.equal(leases.orgWaiters.length, 0, `${row.name}: no waiter left behind`);
      const s = n.admission.waits.snapshot();
      assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, row.status === null ? 1 : 0, 0, row.at], row.name);
      assert.equal(leases.reservedInAdvance, row.name === 'late' ? 1 : 0, `${row.name}: taken in advance of the answer only when late`);
  }
});

test("the money slice on its way, and this node took all the control plane said it may in advance: waits past the bound for the answer, at most 5 s", async () => {
  // Before, every request out of time was taken in advance: a burst while the control plane was slow
  // passed a $0.01 key limit 3-5 times over (docs/leases.md, "When the control plane answers late").
  for (const answered of [true, false]) {
    const leases = new FakeLeases();
    leases.spend = 'wait';
    leases.advanceAllowed = false;
    const n = node(leases);
    const { out } = n.admit(keyOf());
    advance(LEASE_WAIT_MS);
    assert.equal(out.calls, 0, 'out of time, past the allowance: waits on');
    assert.equal(leases.orgWaiters.length, 1, 'for the answer');
    if (answered) {
      advance(1000);
      leases.orgAnswer('yes');
      await wakesRun();
    } else {
      advance(LEASE_WAIT_RECLAIMING_MS - LEASE_WAIT_MS - 10);
      assert.equal(out.calls, 0, 'still waiting');
      // Silent as long as a reclaim may take: unreachable, for this request; admitted as when the connection is down.
      advance(10);
    }
    assert.equal(out.calls, 1, `answered ${answered}`);
    assert.ok(out.ctx instanceof RequestContext);
    assert.equal(leases.reserved, 1);
    assert.equal(leases.reservedInAdvance, answered ? 0 : 1);
    assert.equal(leases.orgWaiters.length, 0, 'no waiter left behind');
  }
});

// ── short of this node's lease ───────────────────────────────────────────────

test("short of this node's lease: waits, then admitted when the grant comes, or refused when the minute is spent", async () => {
  for (const spent of [false, true]) {
    const leases = new FakeLeases();
    leases.held = { requests: 0, tokens: Infinity };
    const n = node(leases);
    const { reply, out } = n.admit(keyOf(), { close: true });
    assert.equal(out.calls, 0, 'waits for the answer');
    assert.equal(leases.keyWaiters.length, 1);
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
    advance(100);
    assert.equal(out.calls, 0);
    if (spent) leases.keySpent();
    else leases.grantKey(5);
    await wakesRun();
    assert.equal(out.calls, 1);
    if (spent) {
      // Final: the control plane reclaimed first; the key's 20 rpm are spent across the cluster.
      const retryAfter = secondsToNextMinute(clock.now());
      assert.equal(out.ctx, null);
      assert.equal(reply.answers[0].status, 429);
      assert.deepEqual(reply.answers[0].body, {
        error: {
          message: `Rate limit reached for requests per minute (rpm): 20/20 used; tokens per minute (tpm): 0/1000; max parallel requests: 0/3. Retry after ${retryAfter} s.`,
          type: 'requests',
          param: null,
          code: '429',
        },
      });
      assert.equal(header(reply.answers[0], 'retry-after'), String(retryAfter));
      assert.equal(reply.answers[0].closeConnection, true);
      assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
      assert.equal(leases.reserved, 0);
      assert.equal(leases.advancedTaken, 0, 'nothing taken in advance of a final answer');
    } else {
      assert.ok(out.ctx instanceof RequestContext);
      assert.deepEqual(reply.answers, []);
      assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 });
      assert.equal(leases.reserved, 1);
    }
    // The bound's timer was cleared: moving past it changes nothing.
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(out.calls, 1);
    assert.equal(reply.answers.length, spent ? 1 : 0);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, spent ? 0 : 1, 0, 100]);
  }
});

test('no answer within LEASE_WAIT_MS: admitted in advance, and the next request of the key does not wait', () => {
  const leases = new FakeLeases();
  leases.held = { requests: 0, tokens: Infinity };
  const n = node(leases);
  const { reply, out } = n.admit(keyOf());
  advance(LEASE_WAIT_MS - 10);
  assert.equal(out.calls, 0, 'still waiting just before the bound');
  advance(10);
  assert.equal(out.calls, 1, 'answered at the bound');
  assert.ok(out.ctx instanceof RequestContext, 'a late answer is not a refusal');
  assert.deepEqual(reply.answers, []);
  assert.equal(leases.advancedTaken, 1);
  assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 });
  assert.equal(leases.keyWaiters.length, 0, 'the waiter was dropped');
  const s = n.admission.waits.snapshot();
  assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, 1, 1, LEASE_WAIT_MS]);

  // Until the answer comes, the key's requests that this node cannot cover take in advance at once.
  const second = n.admit(keyOf());
  assert.equal(second.out.calls, 1);
  assert.ok(second.out.ctx instanceof RequestContext);
  assert.equal(leases.advancedTaken, 2);
  assert.equal(n.admission.waits.snapshot().waited, 1, 'the second did not wait');
});

test('taking in advance stays within the key limits counted here', () => {
  // The key's own rpm (2) binds before any lease: the third request is refused, not taken in advance.
  const leases = new FakeLeases();
  leases.held = { requests: 0, tokens: Infinity };
  leases.advancing = true;
  const n = node(leases);
  const key = keyOf({ rpmLimit: 2 });
  assert.ok(n.admit(key).out.ctx instanceof RequestContext);
  assert.ok(n.admit(key).out.ctx instanceof RequestContext);
  const third = n.admit(key);
  assert.equal(third.out.ctx, null);
  assert.equal(third.reply.answers[0].status, 429);
  assert.equal(leases.advancedTaken, 2);
  assert.deepEqual(usage(n.keyBudgets), { requests: 2, tokens: 20, inFlight: 2 });
});

test('the answer waits for reclaims: the request keeps waiting up to LEASE_WAIT_RECLAIMING_MS, then is admitted in advance', async () => {
  // No answer at all: admitted in advance at the longer bound, not at LEASE_WAIT_MS.
  {
    const leases = new FakeLeases();
    leases.held = { requests: 0, tokens: Infinity };
    leases.reclaiming = true;
    const n = node(leases);
    const { out } = n.admit(keyOf());
    advance(LEASE_WAIT_RECLAIMING_MS - 10);
    assert.equal(out.calls, 0, 'still waiting while the control plane reclaims');
    assert.equal(leases.advancedTaken, 0);
    advance(10);
    assert.equal(out.calls, 1);
    assert.ok(out.ctx instanceof RequestContext);
    assert.equal(leases.advancedTaken, 1);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, 1, 1, LEASE_WAIT_RECLAIMING_MS]);
  }
  // The answer comes during the longer wait: admitted by the grant, nothing taken in advance; or
  // the answer is "spent": refused.
  for (const spent of [false, true]) {
    const leases = new FakeLeases();
    leases.held = { requests: 0, tokens: Infinity };
    leases.reclaiming = true;
    const n = node(leases);
    const { reply, out } = n.admit(keyOf());
    advance(1000);
    assert.equal(out.calls, 0);
    if (spent) leases.keySpent();
    else leases.grantKey(3);
    await wakesRun();
    assert.equal(out.calls, 1);
    assert.equal(out.ctx instanceof RequestContext, !spent);
    assert.equal(reply.answers.length, spent ? 1 : 0);
    assert.equal(leases.advancedTaken, 0);
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(out.calls, 1, 'then is called once');
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, spent ? 0 : 1, 0, 1000]);
  }
});

test("short of this node's parallel slots: waits, then admitted on a slot, refused when every slot is in use, or takes one at the bound", async () => {
  const rows: Array<{ name: string; answer: (l: FakeLeases) => void; at: number; admitted: boolean; taken: number }> = [
    { name: 'slot granted', answer: (l) => l.slotAnswer(1), at: 30, admitted: true, taken: 0 },
    { name: 'every slot in use', answer: (l) => l.slotAnswer(0, true), at: 30, admitted: false, taken: 0 },
    { name: 'no answer', answer: () => {}, at: LEASE_WAIT_MS, admitted: true, taken: 1 },
  ];
  for (const row of rows) {
    const leases = new FakeLeases();
    leases.slots = { slots: 1, final: false };
    const n = node(leases);
    // The key's limit is 3 in flight; this node holds 1 slot, in use.
    assert.ok(n.admit(keyOf()).out.ctx instanceof RequestContext);
    const { reply, out } = n.admit(keyOf(), { close: true });
    assert.equal(out.calls, 0, `${row.name}: waits`);
    assert.equal(leases.slotWaiters.length, 1);
    advance(row.at);
    row.answer(leases);
    await wakesRun();
    assert.equal(out.calls, 1, row.name);
    assert.equal(out.ctx instanceof RequestContext, row.admitted, row.name);
    assert.equal(leases.slotsTaken, row.taken, row.name);
    assert.equal(leases.slotWaiters.length, 0, `${row.name}: no waiter left behind`);
    if (row.admitted) {
      assert.deepEqual(usage(n.keyBudgets), { requests: 2, tokens: 20, inFlight: 2 }, row.name);
    } else {
      assert.equal(reply.answers[0].status, 429);
      assert.deepEqual(reply.answers[0].body, {
        error: {
          message: 'Rate limit reached for max parallel requests: 3/3 in flight; requests per minute (rpm): 1/20; tokens per minute (tpm): 10/1000. Retry after 43 s.',
          type: 'max_parallel_requests',
          param: null,
          code: '429',
        },
      });
      assert.equal(reply.answers[0].closeConnection, true);
      assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 10, inFlight: 1 }, `${row.name}: nothing consumed`);
    }
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced, s.max_ms], [1, row.admitted ? 1 : 0, row.taken, row.at], row.name);
  }
});

// ── tokens reserved after admission (a body read after it) ───────────────────

test('reserveOrWait: fits at once, refused over the key tpm, waits for the lease (granted, spent, late), client gone', async () => {
  const rows: Array<{
    name: string;
    held: MinuteAllowance;
    estimate: number;
    /** What happens while the request waits (undefined: it does not wait). */
    meanwhile?: (l: FakeLeases, reply: FakeReply) => Promise<void> | void;
    ok: boolean;
    answered: boolean;
    usage: { requests: number; tokens: number; inFlight: number };
    waited: number;
  }> = [
    { name: 'fits', held: { requests: Infinity, tokens: Infinity }, estimate: 100, ok: true, answered: false, usage: { requests: 1, tokens: 110, inFlight: 1 }, waited: 0 },
    { name: 'over tpm', held: { requests: Infinity, tokens: Infinity }, estimate: 2000, ok: false, answered: true, usage: { requests: 0, tokens: 0, inFlight: 0 }, waited: 0 },
    {
      name: 'granted',
      held: { requests: Infinity, tokens: 15 },
      estimate: 100,
      meanwhile: async (l) => {
        advance(60);
        l.grantKey(0, 200);
        await wakesRun();
      },
      ok: true,
      answered: false,
      usage: { requests: 1, tokens: 110, inFlight: 1 },
      waited: 1,
    },
    {
      name: 'spent',
      held: { requests: Infinity, tokens: 15 },
      estimate: 100,
      meanwhile: async (l) => {
        advance(60);
        l.keySpent();
        await wakesRun();
      },
      ok: false,
      answered: true,
      usage: { requests: 0, tokens: 0, inFlight: 0 },
      waited: 1,
    },
    { name: 'late', held: { requests: Infinity, tokens: 15 }, estimate: 100, meanwhile: () => advance(LEASE_WAIT_MS), ok: true, answered: false, usage: { requests: 1, tokens: 110, inFlight: 1 }, waited: 1 },
    {
      name: 'client gone',
      held: { requests: Infinity, tokens: 15 },
      estimate: 100,
      meanwhile: (_l, reply) => {
        advance(60);
        reply.abort();
        advance(LEASE_WAIT_MS);
      },
      ok: false,
      answered: false,
      usage: { requests: 0, tokens: 0, inFlight: 0 },
      waited: 1,
    },
  ];
  for (const row of rows) {
    const leases = new FakeLeases();
    leases.held = row.held;
    const n = node(leases);
    const key = keyOf();
    const { reply, out } = n.admit(key, { tokens: 10 });
    assert.ok(out.ctx instanceof RequestContext, row.name);
    const results: boolean[] = [];
    n.admission.reserveOrWait(out.ctx, reply as unknown as Reply, key, row.estimate, (ok) => results.push(ok));
    if (row.meanwhile) {
      assert.deepEqual(results, [], `${row.name}: waits`);
      await row.meanwhile(leases, reply);
    }
    assert.deepEqual(results, [row.ok], row.name);
    assert.deepEqual(usage(n.keyBudgets), row.usage, row.name);
    assert.equal(reply.answers.length, row.answered ? 1 : 0, row.name);
    assert.deepEqual(reply.touchedAfterDone, [], row.name);
    assert.equal(leases.keyWaiters.length, 0, `${row.name}: no waiter left behind`);
    if (row.answered) {
      const a = reply.answers[0];
      const retryAfter = secondsToNextMinute(clock.now());
      assert.equal(a.status, 429, row.name);
      assert.deepEqual(
        a.body,
        {
          error: {
            message: `Rate limit reached for tokens per minute (tpm): 10/1000 used, this request needs about ${row.estimate}; requests per minute (rpm): 0/20; max parallel requests: 0/3. Retry after ${retryAfter} s.`,
            type: 'tokens',
            param: null,
            code: '429',
          },
        },
        row.name,
      );
      assert.equal(header(a, 'retry-after'), String(retryAfter), row.name);
      // The rate headers are the key's once this request gave back what it held.
      assert.equal(reply.rateHeaders?.remainingRequests, 20, row.name);
    }
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(results.length, 1, `${row.name}: then is called once`);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted], [row.waited, row.waited && row.ok ? 1 : 0], row.name);
  }
});

// ── a client that went away ──────────────────────────────────────────────────

test('a client that went away while waiting: then(null), nothing consumed, the response never touched', async () => {
  const rows: Array<{ name: string; short: (l: FakeLeases) => void; after: (l: FakeLeases) => Promise<void> | void }> = [
    { name: 'key lease, bound runs out', short: (l) => (l.held = { requests: 0, tokens: Infinity }), after: () => advance(LEASE_WAIT_MS) },
    {
      name: 'key lease, grant comes',
      short: (l) => (l.held = { requests: 0, tokens: Infinity }),
      after: async (l) => {
        l.grantKey(5);
        await wakesRun();
      },
    },
    {
      name: 'key lease, reclaiming',
      short: (l) => {
        l.held = { requests: 0, tokens: Infinity };
        l.reclaiming = true;
      },
      after: () => advance(LEASE_WAIT_MS),
    },
    { name: 'money slice, bound runs out', short: (l) => (l.spend = 'wait'), after: () => advance(LEASE_WAIT_MS) },
    {
      name: 'money slice, nothing left',
      short: (l) => (l.spend = 'wait'),
      after: async (l) => {
        l.orgAnswer('no');
        await wakesRun();
      },
    },
  ];
  for (const row of rows) {
    const leases = new FakeLeases();
    row.short(leases);
    const n = node(leases);
    const { reply, out } = n.admit(keyOf());
    assert.equal(out.calls, 0, row.name);
    advance(50);
    reply.abort();
    await row.after(leases);
    assert.deepEqual(out, { calls: 1, ctx: null }, row.name);
    assert.deepEqual(reply.answers, [], row.name);
    assert.deepEqual(reply.touchedAfterDone, [], row.name);
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 }, row.name);
    assert.equal(leases.reserved, 0, row.name);
    assert.equal(leases.advancedTaken, 0, row.name);
    assert.equal(n.contexts.length, 0, row.name);
    assert.equal(leases.keyWaiters.length + leases.orgWaiters.length, 0, `${row.name}: no waiter left behind`);
    advance(LEASE_WAIT_RECLAIMING_MS);
    assert.equal(out.calls, 1, `${row.name}: then is called once`);
    const s = n.admission.waits.snapshot();
    assert.deepEqual([s.waited, s.admitted, s.advanced], [1, 0, 0], row.name);
  }
});
