// Admission (data-plane/request/admission.ts) against real key budgets, an injected clock, a scripted
// lease client and a reply that records what was answered (test/helpers/admission-fakes.ts): the
// synchronous common case, refusals for the key's own limits and for an organisation without money, a
// client already gone, a handler that throws, and the wait statistics. The waits for the organisation's
// money, this node's lease and parallel slots are in data-plane-request-admission.waits.test.ts.
import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import { WaitStats } from '../../data-plane/request/admission.js';
import { LEASE_WAIT_MS } from '../../data-plane/limits/lease-wait.js';
import type { ErrorShape } from '../../data-plane/error-shapes.js';
import type { Reply } from '../../data-plane/request/reply.js';
import { RequestContext } from '../../data-plane/request/request-context.js';
import { log } from '../../data-plane/log.js';
import { minuteOf } from '../../data-plane/limits/clock.js';
import type { KeyLimits } from '../../data-plane/limits/key-budgets.js';
import { advance, FakeLeases, FakeReply, header, keyOf, node, T0, usage, useManualTime, wakesRun } from '../helpers/admission-fakes.js';

const ORG_BLOCKED_TEXT = "The organisation's balance is exhausted or its monthly spend cap was reached.";

useManualTime();

// ── the synchronous common case ──────────────────────────────────────────────

test('within the key limits and with money: admitted before admitOrWait returns, nothing recorded as a wait', () => {
  for (const withLeases of [false, true]) {
    const leases = withLeases ? new FakeLeases() : null;
    if (leases) leases.held = { requests: 5, tokens: 500 };
    const n = node(leases);
    const { reply, out } = n.admit(keyOf(), { tokens: 40 });
    assert.equal(out.calls, 1, `leases: ${withLeases}`);
    assert.ok(out.ctx instanceof RequestContext);
    assert.equal(out.ctx.requestId, 'req-1', "the context carries the reply's request id");
    assert.equal(out.ctx.minute, minuteOf(T0));
    assert.deepEqual(usage(n.keyBudgets), { requests: 1, tokens: 40, inFlight: 1 });
    assert.deepEqual(reply.answers, []);
    assert.equal(reply.rateHeaders?.limitRequests, 20);
    // What is left across the cluster as far as the node knows, not what this node holds (issue 32, finding 7).
    assert.equal(reply.rateHeaders?.remainingRequests, 19);
    if (leases) {
      assert.equal(leases.reserved, 1, 'the money reservation is taken once');
      assert.deepEqual(out.ctx.spend, { epoch: 1, micros: 0 });
    }
    assert.deepEqual(n.admission.waits.snapshot().waited, 0);
    // The context is tied to the response: its end gives everything back (never started upstream).
    reply.abort();
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
  }
});

// ── refusals for the key's own limits ────────────────────────────────────────

test("a key over its rpm, tpm or parallel limit: 429 in Shape A with the message and retry-after, nothing consumed", () => {
  const rows: Array<{
    name: string;
    limits: Partial<KeyLimits>;
    /** Requests admitted (and left in flight) before the one refused. */
    before: number;
    tokens: number;
    type: string;
    message: string;
  }> = [
    {
      name: 'rpm',
      limits: { rpmLimit: 2 },
      before: 2,
      tokens: 10,
      type: 'requests',
      message: 'Rate limit reached for requests per minute (rpm): 2/2 used; tokens per minute (tpm): 20/1000; max parallel requests: 2/3. Retry after 43 s.',
    },
    {
      name: 'tpm',
      limits: { tpmLimit: 100 },
      before: 1,
      tokens: 60,
      type: 'tokens',
      message: 'Rate limit reached for tokens per minute (tpm): 60/100 used, this request needs about 60; requests per minute (rpm): 1/20; max parallel requests: 1/3. Retry after 43 s.',
    },
    {
      name: 'parallel',
      limits: { maxParallel: 1 },
      before: 1,
      tokens: 10,
      type: 'max_parallel_requests',
      message: 'Rate limit reached for max parallel requests: 1/1 in flight; requests per minute (rpm): 1/20; tokens per minute (tpm): 10/1000. Retry after 43 s.',
    },
  ];
  for (const row of rows) {
    // The 429 body is Shape A whatever the family's shape (spec, "429 bodies").
    for (const shape of ['openai', 'gateway', 'passthrough'] as const) {
      for (const withLeases of [false, true]) {
        const leases = withLeases ? new FakeLeases() : null;
        const n = node(leases);
        const key = keyOf(row.limits);
        for (let i = 0; i < row.before; i++) assert.equal(n.admit(key, { tokens: row.tokens }).out.ctx instanceof RequestContext, true);
        const before = usage(n.keyBudgets);
        const reserved = leases?.reserved;
        const contexts = n.contexts.length;
        const what = `${row.name}, ${shape}, leases: ${withLeases}`;

        const { reply, out } = n.admit(key, { tokens: row.tokens, shape, close: true });
        assert.deepEqual(out, { calls: 1, ctx: null }, what);
        assert.equal(reply.answers.length, 1, what);
        const a = reply.answers[0];
        assert.equal(a.status, 429, what);
        assert.deepEqual(a.body, { error: { message: row.message, type: row.type, param: null, code: '429' } }, what);
        assert.equal(header(a, 'retry-after'), '43', what);
        assert.equal(a.closeConnection, true, `${what}: closeIfRefused is asked`);
        assert.equal(reply.rateHeaders?.resetSec, 43, `${what}: the rate headers go with the refusal`);
        assert.deepEqual(usage(n.keyBudgets), before, `${what}: nothing consumed`);
        assert.equal(leases?.reserved, reserved, `${what}: no money reserved`);
        assert.equal(n.contexts.length, contexts, `${what}: no context`);
        assert.equal(n.admission.waits.snapshot().waited, 0, `${what}: not a wait`);
      }
    }
  }
});

// ── an organisation without money ────────────────────────────────────────────

test('an organisation with no money: 401 insufficient_quota in the family shape, nothing consumed', () => {
  const bodies: Record<ErrorShape, unknown> = {
    openai: { error: { message: ORG_BLOCKED_TEXT, type: 'insufficient_quota', param: null, code: '401' } },
    gateway: { error: { code: 'invalid_api_key', message: ORG_BLOCKED_TEXT } },
    passthrough: { detail: ORG_BLOCKED_TEXT },
  };
  for (const shape of ['openai', 'gateway', 'passthrough'] as const) {
    for (const close of [false, true]) {
      const leases = new FakeLeases();
      leases.spend = 'no';
      const n = node(leases);
      const { reply, out } = n.admit(keyOf(), { shape, close });
      assert.deepEqual(out, { calls: 1, ctx: null }, shape);
      assert.equal(reply.answers.length, 1);
      assert.equal(reply.answers[0].status, 401);
      assert.deepEqual(reply.answers[0].body, bodies[shape], shape);
      assert.equal(header(reply.answers[0], 'retry-after'), undefined);
      assert.equal(reply.answers[0].closeConnection, close);
      assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
      assert.equal(leases.reserved, 0);
      assert.equal(n.contexts.length, 0);
    }
  }
});

test('no money and over the key rpm: the money answer comes first (docs/design.md#order-of-checks, step 4 before 6)', () => {
  const leases = new FakeLeases();
  const n = node(leases);
  const key = keyOf({ rpmLimit: 2 });
  assert.ok(n.admit(key).out.ctx);
  assert.ok(n.admit(key).out.ctx);
  leases.spend = 'no';
  const { reply, out } = n.admit(key);
  assert.equal(out.ctx, null);
  assert.equal(reply.answers[0].status, 401);
  assert.equal((reply.answers[0].body as { error: { type: string } }).error.type, 'insufficient_quota');
  assert.deepEqual(usage(n.keyBudgets), { requests: 2, tokens: 20, inFlight: 2 });
});

// ── a client already gone ────────────────────────────────────────────────────

test('a client already gone when admission starts: then(null) at once, nothing consumed or answered', () => {
  for (const withLeases of [false, true]) {
    const leases = withLeases ? new FakeLeases() : null;
    const n = node(leases);
    const reply = new FakeReply();
    reply.abort();
    const { out } = n.admit(keyOf(), { reply });
    assert.deepEqual(out, { calls: 1, ctx: null });
    assert.deepEqual(reply.answers, []);
    assert.deepEqual(reply.touchedAfterDone, []);
    assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 });
    assert.equal(leases?.reserved ?? 0, 0);
    assert.equal(n.admission.waits.snapshot().waited, 0);
  }
});

// ── a handler that throws ────────────────────────────────────────────────────

test("a handler that throws once admitted: 500 in the family's error shape, what it took given back", async () => {
  // Before the fix admission answered this 500 in Shape A ('openai') whatever the family, so a tool
  // path (Shape B) or a pass-through path (Shape C) got a body of the wrong shape.
  const bodies: Record<ErrorShape, unknown> = {
    openai: { error: { message: 'Internal error.', type: 'api_error', param: null, code: '500' } },
    gateway: { error: { code: 'internal_error', message: 'Internal error.' } },
    passthrough: { detail: 'Internal error.' },
  };
  const logged = mock.method(log, 'error', () => {});
  for (const shape of ['openai', 'gateway', 'passthrough'] as const) {
    // Synchronously admitted, and admitted after a wait for the lease.
    for (const waits of [false, true]) {
      const leases = new FakeLeases();
      if (waits) leases.held = { requests: 0, tokens: Infinity };
      const n = node(leases);
      const reply = new FakeReply();
      reply.shape = shape;
      let calls = 0;
      n.admission.admitOrWait(
        reply as unknown as Reply,
        keyOf(),
        '/v1/tools/pdf',
        10,
        () => {
          calls++;
          throw new Error('handler bug');
        },
        undefined,
      );
      if (waits) {
        leases.grantKey(1);
        await wakesRun();
      }
      const what = `${shape}, waited: ${waits}`;
      assert.equal(calls, 1, what);
      assert.equal(reply.answers.length, 1, what);
      assert.equal(reply.answers[0].status, 500, what);
      assert.deepEqual(reply.answers[0].body, bodies[shape], what);
      assert.deepEqual(usage(n.keyBudgets), { requests: 0, tokens: 0, inFlight: 0 }, `${what}: the context ended with the response`);
    }
  }
  assert.equal(logged.mock.callCount(), 6, 'each bug is logged');
});

// ── the wait statistics ──────────────────────────────────────────────────────

test('WaitStats: counts, admitted, advanced only when admitted, percentiles, reset', () => {
  const w = new WaitStats();
  assert.deepEqual(w.snapshot(), { waited: 0, admitted: 0, advanced: 0, mean_ms: 0, p50_ms: 0, p99_ms: 0, max_ms: 0 });
  const rows: Array<[number, boolean, boolean]> = [
    [10, true, false],
    [250, true, true],
    [30, false, false],
    // Advanced but then refused (another limit): not counted as advanced.
    [250, false, true],
  ];
  for (let i = 1; i <= 100; i++) rows.push([i / 3, true, false]);
  for (const [ms, admitted, advanced] of rows) w.note(ms, admitted, advanced);
  const s = w.snapshot(true);
  assert.equal(s.waited, 104);
  assert.equal(s.admitted, 102);
  assert.equal(s.advanced, 1);
  assert.equal(s.max_ms, 250);
  const total = rows.reduce((t, [ms]) => t + ms, 0);
  assert.equal(s.mean_ms, Math.round((total / 104) * 100) / 100);
  const sorted = rows.map(([ms]) => ms).sort((a, b) => a - b);
  assert.equal(s.p50_ms, Math.round(sorted[52] * 100) / 100);
  assert.equal(s.p99_ms, Math.round(sorted[102] * 100) / 100);
  assert.deepEqual(w.snapshot(), { waited: 0, admitted: 0, advanced: 0, mean_ms: 0, p50_ms: 0, p99_ms: 0, max_ms: 0 }, 'reset');
});

test('the wait statistics of admission: only requests that waited, each once, with how they ended', async () => {
  const leases = new FakeLeases();
  leases.held = { requests: 0, tokens: Infinity };
  const n = node(leases);
  // 1: waits 100 ms, granted.
  const a = n.admit(keyOf());
  advance(100);
  leases.grantKey(1);
  await wakesRun();
  assert.ok(a.out.ctx);
  // 2: synchronous (within the grant): not a wait.
  leases.grantKey(1);
  assert.ok(n.admit(keyOf()).out.ctx);
  // 3: waits 250 ms, admitted in advance.
  const c = n.admit(keyOf());
  advance(LEASE_WAIT_MS);
  assert.ok(c.out.ctx);
  // 4: refused at once for the key's own rpm: not a wait.
  assert.equal(n.admit(keyOf({ rpmLimit: 3 })).out.ctx, null);
  // 5: the client left while waiting.
  leases.grantKey(0);
  const e = n.admit(keyOf());
  assert.equal(e.out.calls, 0);
  advance(20);
  e.reply.abort();
  advance(LEASE_WAIT_MS);
  assert.equal(e.out.ctx, null);
  const s = n.admission.waits.snapshot();
  assert.deepEqual(s, { waited: 3, admitted: 2, advanced: 1, mean_ms: (100 + 250 + 250) / 3, p50_ms: 250, p99_ms: 250, max_ms: 250 });
});
