// Key budgets (rpm, tpm, max parallel per API key, per clock minute) and the token estimate.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock, minuteOf, secondsToNextMinute } from '../../data-plane/limits/clock.js';
import { KeyBudgets, type Admission, type AllowanceSource, type KeyLimits, type MinuteAllowance, type Ticket } from '../../data-plane/limits/key-budgets.js';
import { estimateTokens } from '../../data-plane/proxy/tokens.js';
import { rateHeaderPairs, writeRateHeaders, type RateHeaders } from '../../data-plane/limits/rate-headers.js';

const T0 = Date.UTC(2025, 0, 1, 12, 0, 0); // top of a minute

/** The counting part of the rate headers (the reset countdown is asserted on its own). */
function counts(h: RateHeaders): Omit<RateHeaders, 'resetSec'> {
  const { resetSec: _reset, ...rest } = h;
  return rest;
}
const FREE: KeyLimits = { keyId: 'key_free', rpmLimit: 20, tpmLimit: 60_000, maxParallel: 100 };

function admitted(a: Admission): Ticket {
  assert.equal(a.ok, true, a.ok ? '' : a.message);
  return (a as Extract<Admission, { ok: true }>).ticket;
}

function refused(a: Admission): Extract<Admission, { ok: false }> {
  assert.equal(a.ok, false);
  return a as Extract<Admission, { ok: false }>;
}

test('minuteOf and secondsToNextMinute', () => {
  const rows: Array<[number, number]> = [
    [T0, 60],
    [T0 + 1, 60],
    [T0 + 999, 60],
    [T0 + 1_000, 59],
    [T0 + 43_000, 17],
    [T0 + 42_001, 18],
    [T0 + 59_001, 1],
    [T0 + 59_999, 1],
  ];
  for (const [ms, want] of rows) assert.equal(secondsToNextMinute(ms), want, String(ms - T0));
  assert.equal(minuteOf(T0 + 59_999), minuteOf(T0));
  assert.equal(minuteOf(T0 + 60_000), minuteOf(T0) + 1);
});

test('the 21st request in a minute is refused with dimension requests and the exact message', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  for (let i = 1; i <= 20; i++) {
    const a = kb.admit(FREE, 50);
    const ticket = admitted(a);
    assert.deepEqual(counts(a.headers), { limitRequests: 20, remainingRequests: 20 - i, limitTokens: 60_000, remainingTokens: 60_000 - 50 * i });
    ticket.settle(50);
    clock.advance(1_000);
  }
  // 20 s into the minute now; +23 s → 43 s in → 17 s to the top of the next minute.
  clock.advance(23_000);
  const r = refused(kb.admit(FREE, 50));
  assert.equal(r.dimension, 'requests');
  assert.equal(r.retryAfterSec, 17);
  assert.equal(
    r.message,
    'Rate limit reached for requests per minute (rpm): 20/20 used; tokens per minute (tpm): 1000/60000; max parallel requests: 0/100. Retry after 17 s.',
  );
  assert.deepEqual(counts(r.headers), { limitRequests: 20, remainingRequests: 0, limitTokens: 60_000, remainingTokens: 59_000 });
  // Refused requests consume nothing.
  refused(kb.admit(FREE, 50));
  assert.deepEqual(kb.usage(FREE.keyId), { minute: minuteOf(clock.now()), requests: 20, tokens: 1000, inFlight: 0 });
});

test('retry-after counts down to the top of the minute, and the next minute resets', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  for (let i = 0; i < 20; i++) admitted(kb.admit(FREE, 10)).settle(10);
  const rows: Array<[number, number]> = [
    [0, 60],
    [500, 60],
    [1_000, 59],
    [30_000, 30],
    [59_000, 1],
    [59_999, 1],
  ];
  for (const [at, want] of rows) {
    clock.set(T0 + at);
    assert.equal(refused(kb.admit(FREE, 10)).retryAfterSec, want, `at ${at}`);
  }
  clock.set(T0 + 60_000);
  assert.deepEqual(counts(kb.headers(FREE)), { limitRequests: 20, remainingRequests: 20, limitTokens: 60_000, remainingTokens: 60_000 });
  const a = kb.admit(FREE, 10);
  admitted(a);
  assert.equal(a.headers.remainingRequests, 19);
});

test('headers() reads without counting', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  assert.deepEqual(counts(kb.headers(FREE)), { limitRequests: 20, remainingRequests: 20, limitTokens: 60_000, remainingTokens: 60_000 });
  admitted(kb.admit(FREE, 1234));
  assert.deepEqual(counts(kb.headers(FREE)), { limitRequests: 20, remainingRequests: 19, limitTokens: 60_000, remainingTokens: 58_766 });
  assert.deepEqual(counts(kb.headers(FREE)), { limitRequests: 20, remainingRequests: 19, limitTokens: 60_000, remainingTokens: 58_766 });
  assert.equal(kb.trackedKeys(), 1);
  kb.headers({ ...FREE, keyId: 'other' });
  assert.equal(kb.trackedKeys(), 1);
});

test('tpm trips on a large estimate; a request fitting the rest still passes', () => {
  const clock = new ManualClock(T0 + 13_000);
  const kb = new KeyBudgets(clock);
  // A single request whose estimate alone exceeds tpm.
  const big = refused(kb.admit(FREE, 60_001));
  assert.equal(big.dimension, 'tokens');
  assert.equal(big.retryAfterSec, 47);
  assert.equal(
    big.message,
    'Rate limit reached for tokens per minute (tpm): 0/60000 used, this request needs about 60001; requests per minute (rpm): 0/20; max parallel requests: 0/100. Retry after 47 s.',
  );
  assert.deepEqual(kb.usage(FREE.keyId).requests, 0);
  // Exactly up to the limit is allowed.
  admitted(kb.admit(FREE, 59_000));
  const r = refused(kb.admit(FREE, 1_001));
  assert.equal(r.dimension, 'tokens');
  assert.equal(r.headers.remainingTokens, 1_000);
  admitted(kb.admit(FREE, 1_000));
  assert.equal(kb.headers(FREE).remainingTokens, 0);
});

test('the 101st parallel request is refused and settle releases the slot', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  const key: KeyLimits = { keyId: 'key_paid', rpmLimit: 300, tpmLimit: 1_000_000, maxParallel: 100 };
  const tickets: Ticket[] = [];
  for (let i = 0; i < 100; i++) tickets.push(admitted(kb.admit(key, 10)));
  clock.advance(5_000);
  const r = refused(kb.admit(key, 10));
  assert.equal(r.dimension, 'max_parallel_requests');
  // Every gateway 429 counts to the top of the next clock minute (spec, Response headers).
  assert.equal(r.retryAfterSec, 55);
  assert.equal(
    r.message,
    'Rate limit reached for max parallel requests: 100/100 in flight; requests per minute (rpm): 100/300; tokens per minute (tpm): 1000/1000000. Retry after 55 s.',
  );
  assert.equal(kb.usage(key.keyId).inFlight, 100);
  tickets[0].settle(10);
  assert.equal(kb.usage(key.keyId).inFlight, 99);
  admitted(kb.admit(key, 10));
  refused(kb.admit(key, 10));
  // Slots carry over a minute boundary: still 100 in flight in the next minute.
  clock.set(T0 + 60_000);
  assert.equal(refused(kb.admit(key, 10)).dimension, 'max_parallel_requests');
  tickets[1].settle(10);
  admitted(kb.admit(key, 10));
});

test('minute budgets are checked before parallel (their retry-after is the longer wait)', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  const key: KeyLimits = { keyId: 'k', rpmLimit: 2, tpmLimit: 1000, maxParallel: 2 };
  admitted(kb.admit(key, 1));
  admitted(kb.admit(key, 1));
  const r = refused(kb.admit(key, 1));
  assert.equal(r.dimension, 'requests');
  assert.equal(r.retryAfterSec, 60);
});

test('settle is idempotent', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  const key: KeyLimits = { keyId: 'k', rpmLimit: 100, tpmLimit: 10_000, maxParallel: 2 };
  const a = admitted(kb.admit(key, 100));
  const b = admitted(kb.admit(key, 100));
  a.settle(300);
  a.settle(300);
  a.settle(5);
  assert.deepEqual(kb.usage('k'), { minute: minuteOf(T0), requests: 2, tokens: 400, inFlight: 1 });
  b.settle(100);
  b.settle(0);
  assert.deepEqual(kb.usage('k'), { minute: minuteOf(T0), requests: 2, tokens: 400, inFlight: 0 });
});

test('settle reconciles the reservation with the actual tokens', () => {
  const rows: Array<{ name: string; estimate: number; actual: number; tokensAfter: number }> = [
    { name: 'more than estimated', estimate: 100, actual: 700, tokensAfter: 700 },
    { name: 'less than estimated', estimate: 1000, actual: 250, tokensAfter: 250 },
    { name: 'exactly estimated', estimate: 42, actual: 42, tokensAfter: 42 },
    { name: 'zero used (e.g. upstream error)', estimate: 42, actual: 0, tokensAfter: 0 },
    { name: 'unknown usage keeps the estimate', estimate: 42, actual: Number.NaN, tokensAfter: 42 },
    { name: 'negative keeps the estimate', estimate: 42, actual: -5, tokensAfter: 42 },
    { name: 'fractions round up', estimate: 10, actual: 10.2, tokensAfter: 11 },
  ];
  for (const row of rows) {
    const clock = new ManualClock(T0);
    const kb = new KeyBudgets(clock);
    const t = admitted(kb.admit(FREE, row.estimate));
    assert.equal(kb.usage(FREE.keyId).tokens, row.estimate, row.name);
    t.settle(row.actual);
    assert.equal(kb.usage(FREE.keyId).tokens, row.tokensAfter, row.name);
    assert.equal(kb.headers(FREE).remainingTokens, 60_000 - row.tokensAfter, row.name);
  }
});

test('a request settled in a later minute leaves the new minute untouched', () => {
  const clock = new ManualClock(T0 + 59_000);
  const kb = new KeyBudgets(clock);
  const t = admitted(kb.admit(FREE, 100));
  clock.advance(2_000);
  admitted(kb.admit(FREE, 10)).settle(10);
  t.settle(50_000);
  assert.deepEqual(kb.usage(FREE.keyId), { minute: minuteOf(clock.now()), requests: 1, tokens: 10, inFlight: 0 });
});

test('tokens over the limit after reconciliation: remaining never negative, next request refused', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  admitted(kb.admit(FREE, 100)).settle(70_000);
  assert.equal(kb.headers(FREE).remainingTokens, 0);
  assert.equal(refused(kb.admit(FREE, 1)).dimension, 'tokens');
});

test('a limit of 0 means no limit on that dimension', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  const key: KeyLimits = { keyId: 'k', rpmLimit: 0, tpmLimit: 0, maxParallel: 0 };
  for (let i = 0; i < 1000; i++) admitted(kb.admit(key, 1_000_000));
  const h = kb.headers(key);
  assert.deepEqual(h, { limitRequests: 0, remainingRequests: 0, limitTokens: 0, remainingTokens: 0, resetSec: 60 });
  assert.deepEqual(rateHeaderPairs(h), []);
  assert.deepEqual(rateHeaderPairs(kb.headers({ ...FREE, keyId: 'x' })), [
    ['x-ratelimit-limit-requests', '20'],
    ['x-ratelimit-remaining-requests', '20'],
    ['x-ratelimit-reset-requests', '60s'],
    ['x-ratelimit-limit-tokens', '60000'],
    ['x-ratelimit-remaining-tokens', '60000'],
    ['x-ratelimit-reset-tokens', '60s'],
  ]);
  // The reset counts down to the top of the next clock minute, like a gateway retry-after.
  clock.advance(12_500);
  assert.deepEqual(rateHeaderPairs(kb.headers({ ...FREE, keyId: 'x' })).filter(([k]) => k.includes('reset')), [
    ['x-ratelimit-reset-requests', '48s'],
    ['x-ratelimit-reset-tokens', '48s'],
  ]);
});

test('writeRateHeaders puts on the wire exactly the lines of rateHeaderPairs', () => {
  const wire = (write: (res: { writeHeader(k: string, v: string): void }) => void) => {
    let out = '';
    write({ writeHeader: (k, v) => (out += `${k}: ${v}\r\n`) });
    return out;
  };
  const cases = [
    { limitRequests: 20, remainingRequests: 7, limitTokens: 60000, remainingTokens: 0, resetSec: 48 },
    { limitRequests: 20, remainingRequests: 0, limitTokens: 0, remainingTokens: 0, resetSec: 1 },
    { limitRequests: 0, remainingRequests: 0, limitTokens: 1_000_000, remainingTokens: 999_000, resetSec: 60 },
    { limitRequests: 0, remainingRequests: 0, limitTokens: 0, remainingTokens: 0, resetSec: 60 },
    { limitRequests: 5, remainingRequests: 5, limitTokens: 5, remainingTokens: 5, resetSec: 75 },
  ];
  for (const h of cases) {
    const expected = rateHeaderPairs(h)
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('');
    assert.equal(wire((res) => writeRateHeaders(h, res)), expected);
  }
});

test('keys are counted separately', () => {
  const kb = new KeyBudgets(new ManualClock(T0));
  for (let i = 0; i < 20; i++) admitted(kb.admit(FREE, 1));
  refused(kb.admit(FREE, 1));
  admitted(kb.admit({ ...FREE, keyId: 'key_other' }, 1));
});

test('idle keys are forgotten; keys with requests in flight are kept', () => {
  const clock = new ManualClock(T0);
  const kb = new KeyBudgets(clock);
  for (let i = 0; i < 1000; i++) admitted(kb.admit({ ...FREE, keyId: `k${i}` }, 1)).settle(1);
  const busy = admitted(kb.admit({ ...FREE, keyId: 'busy' }, 1));
  assert.equal(kb.trackedKeys(), 1001);
  clock.advance(3 * 60_000);
  const live: KeyLimits = { keyId: 'live', rpmLimit: 0, tpmLimit: 0, maxParallel: 0 };
  for (let i = 0; i < 200; i++) admitted(kb.admit(live, 1)).settle(1);
  assert.equal(kb.trackedKeys(), 2); // 'busy' (in flight) and 'live'
  assert.equal(kb.usage('busy').inFlight, 1);
  busy.settle(1);
  assert.equal(kb.usage('busy').inFlight, 0);
  clock.advance(3 * 60_000);
  for (let i = 0; i < 20; i++) admitted(kb.admit(live, 1)).settle(1);
  assert.equal(kb.trackedKeys(), 1);
});

test('an allowance source caps what this node admits per key and minute (lease seam)', () => {
  const clock = new ManualClock(T0);
  const notes: Array<[string, number, number, number]> = [];
  const slices = new Map<string, { requests: number; tokens: number }>([['key_free', { requests: 5, tokens: 500 }]]);
  const source: AllowanceSource = {
    allowanceFor: (keyId) => slices.get(keyId) ?? { requests: 0, tokens: 0 },
    noteUsage: (keyId, minute, requests, tokens) => notes.push([keyId, minute - minuteOf(T0), requests, tokens]),
  };
  const kb = new KeyBudgets(clock, { allowance: source });
  for (let i = 0; i < 5; i++) admitted(kb.admit(FREE, 10)).settle(20);
  const r = refused(kb.admit(FREE, 10));
  assert.equal(r.dimension, 'requests');
  assert.equal(r.retryAfterSec, 60);
  // Within the key's limits but out of this node's slice: what to lease before it fits.
  assert.deepEqual(r.leaseShort, { requests: 1, tokens: 0 });
  assert.deepEqual(notes.at(-1), ['key_free', 0, 5, 100]);
  slices.set('key_free', { requests: 10, tokens: 120 });
  const t = refused(kb.admit(FREE, 21));
  assert.equal(t.dimension, 'tokens');
  assert.deepEqual(t.leaseShort, { requests: 0, tokens: 1 });
  admitted(kb.admit(FREE, 20));
  // The pool said it is spent across the cluster: nothing to wait for.
  slices.set('key_free', { requests: 6, tokens: 1000, requestsFinal: true } as never);
  const spent = refused(kb.admit(FREE, 1));
  assert.equal(spent.leaseShort, undefined);
  assert.equal(spent.headers.remainingRequests, 0, 'the headers say the minute is spent');
  // Without a slice the node admits nothing for that key.
  refused(kb.admit({ ...FREE, keyId: 'unleased' }, 1));
});

test('rate headers with leases: the limit minus this node\'s count minus what the others were said to use, whatever the node holds', () => {
  // Before (issue 32, finding 7): remaining was what the node held unused plus what the pool had free
  // when last heard; holding a standing share of 2 and having heard nothing, a new key's first
  // requests on a node of two reported 1, 0, then 15 once a grant said what was free.
  const clock = new ManualClock(T0 + 2_000);
  let lease: MinuteAllowance = { requests: 2, tokens: 7_500 };
  const kb = new KeyBudgets(clock, { allowance: { allowanceFor: () => lease, peekAllowance: () => lease } });
  const seen: number[] = [];
  for (let i = 0; i < 20; i++) {
    // The node's lease grows as grants come (by chunks of 3); the headers do not follow it.
    if (i >= 2) lease = { requests: Math.min(20, 2 + 3 * Math.ceil((i - 1) / 3)), tokens: 60_000, othersUsedRequests: 0, othersUsedTokens: 0 };
    const a = kb.admit(FREE, 10);
    admitted(a).settle(10);
    seen.push(a.ok ? a.headers.remainingRequests : -1);
    assert.equal(a.ok && a.headers.remainingTokens, 60_000 - 10 * (i + 1));
  }
  assert.deepEqual(seen, Array.from({ length: 20 }, (_, i) => 19 - i));
  assert.equal(kb.headers(FREE).remainingRequests, 0);
  const over = refused(kb.admit(FREE, 10));
  assert.equal(over.dimension, 'requests');
  assert.equal(over.headers.remainingRequests, 0);
});

test('rate headers count what the control plane said the other nodes used, never below 0', () => {
  const clock = new ManualClock(T0 + 2_000);
  let lease: MinuteAllowance = { requests: 10, tokens: 30_000, othersUsedRequests: 4, othersUsedTokens: 1_000 };
  const kb = new KeyBudgets(clock, { allowance: { allowanceFor: () => lease, peekAllowance: () => lease } });
  const first = kb.admit(FREE, 100);
  assert.deepEqual(counts(first.headers), { limitRequests: 20, remainingRequests: 15, limitTokens: 60_000, remainingTokens: 58_900 });
  // The reservation is replaced by the usage on settle: tokens left follow it.
  admitted(first).settle(40);
  assert.deepEqual(counts(kb.headers(FREE)), { limitRequests: 20, remainingRequests: 15, limitTokens: 60_000, remainingTokens: 58_960 });
  // The others used more (a later grant, or the pool's news): that much less is left.
  lease = { ...lease, othersUsedRequests: 9, othersUsedTokens: 2_000 };
  const second = kb.admit(FREE, 100);
  assert.equal(second.headers.remainingRequests, 9);
  assert.equal(second.headers.remainingTokens, 60_000 - 40 - 100 - 2_000);
  // Reported use past the limit (nodes admitted in advance of a late answer): 0, never negative.
  lease = { ...lease, othersUsedRequests: 25, othersUsedTokens: 70_000 };
  assert.deepEqual([kb.headers(FREE).remainingRequests, kb.headers(FREE).remainingTokens], [0, 0]);
  // Nothing heard (a lone node, or the control plane away): the key's limits minus this node's count.
  lease = { requests: Infinity, tokens: Infinity };
  assert.deepEqual([kb.headers(FREE).remainingRequests, kb.headers(FREE).remainingTokens], [18, 60_000 - 140]);
  // A refusal because the pool is spent across the cluster says 0, whatever was heard.
  lease = { requests: 2, tokens: 30_000, requestsFinal: true, othersUsedRequests: 10, othersUsedTokens: 0 };
  const spent = refused(kb.admit(FREE, 1));
  assert.equal(spent.leaseShort, undefined);
  assert.equal(spent.headers.remainingRequests, 0);
  assert.match(spent.message, /requests per minute \(rpm\): 20\/20 used/);
});

test('estimateTokens', () => {
  const rows: Array<[string, unknown, number]> = [
    ['undefined', undefined, 0],
    ['null', null, 0],
    ['string', 'hello', 0],
    ['array', [1, 2], 0],
    ['empty object', {}, 0],
    ['no messages', { messages: [] }, 3],
    ['one string message', { messages: [{ role: 'user', content: 'hello world!' }] }, 3 + 4 + 3],
    ['rounding up', { messages: [{ role: 'user', content: 'abcde' }] }, 3 + 4 + 2],
    [
      'two messages',
      { messages: [{ role: 'system', content: 'x'.repeat(400) }, { role: 'user', content: 'y'.repeat(41) }] },
      3 + (4 + 100) + (4 + 11),
    ],
    [
      'content parts',
      { messages: [{ role: 'user', content: [{ type: 'text', text: 'abcd' }, { type: 'image_url', image_url: { url: 'x' } }, 'efgh'] }] },
      // The image at auto detail: the most an image can cost (data-plane-proxy-tokens.test.ts).
      3 + 4 + 2 + 1445,
    ],
    ['null content', { messages: [{ role: 'assistant', content: null }] }, 3 + 4],
    ['odd message', { messages: [null, 5, 'str'] }, 3 + 12],
    [
      'tool call arguments',
      { messages: [{ role: 'assistant', content: null, tool_calls: [{ function: { name: 'f', arguments: '{"a":1}' } }] }] },
      3 + 4 + 1 + 2,
    ],
    ['max_tokens is not reserved', { messages: [{ role: 'user', content: 'abcd' }], max_tokens: 4096, max_completion_tokens: 100 }, 3 + 4 + 1],
    ['embeddings string', { input: 'x'.repeat(10) }, 3],
    ['embeddings strings', { input: ['abcd', 'abcde', ''] }, 1 + 2 + 0],
    ['embeddings token ids', { input: [1, 2, 3] }, 3],
    ['embeddings token id arrays', { input: [[1, 2], [3]] }, 3],
    ['embeddings odd input', { input: 42 }, 0],
    ['completions prompt', { prompt: 'abcdefgh' }, 2],
    ['responses input items', { instructions: 'abcd', input: [{ role: 'user', content: 'abcdefgh' }] }, 1 + 4 + 2],
    ['messages not an array', { messages: 'hi' }, 0],
  ];
  for (const [name, body, want] of rows) assert.equal(estimateTokens(body), want, name);
  const hostile = {
    get messages(): unknown {
      throw new Error('boom');
    },
  };
  assert.equal(estimateTokens(hostile), 0);
});
