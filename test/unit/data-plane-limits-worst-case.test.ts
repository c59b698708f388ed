// A request's worst case in money and the node's slices raised to it (issue 32 finding 5;
// docs/money-limits.md#the-last-request). Before, a request reserved the costliest request seen on
// its node (0 at first), so a first burst passed a $0.01 limit 226 times over.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { affordableOutputTokens, requestWorstCase, UNPRICED_OUTPUT_TOKENS } from '../../data-plane/limits/worst-case.js';
import { worstCaseMessage, worstCaseShort } from '../../proto/lib/spend-limits.js';
import { LeaseClient } from '../../data-plane/leases/lease-client.js';
import { type LeaseRequestOut } from '../../data-plane/leases/lease-link.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { client } from '../helpers/leases.js';

function model(m: Partial<ModelConfig> = {}): ModelConfig {
  return { id: 'm', provider: 'demo', upstreamModel: 'm', baseUrl: '', upstreamApiKey: '', kind: 'chat', inputMicrosPerMtok: 2_000_000, outputMicrosPerMtok: 8_000_000, audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments: [], maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0, ...m };
}

test('worst case: input estimate plus the most output named, else the model ceiling, at the dearest prices', () => {
  const cases: Array<[string, ModelConfig, 'chat' | 'responses', unknown, number, { micros: number; priced: boolean; outputTokens: number; field: string }]> = [
    // 1,000 in at 2 $/Mtok (2,000 µ$) + 500 out at 8 $/Mtok (4,000 µ$).
    ['chat max_completion_tokens', model(), 'chat', { max_completion_tokens: 500, max_tokens: 9 }, 1000, { micros: 6000, priced: true, outputTokens: 500, field: 'max_completion_tokens' }],
    ['chat max_tokens', model(), 'chat', { max_tokens: 500 }, 1000, { micros: 6000, priced: true, outputTokens: 500, field: 'max_tokens' }],
    ['chat n choices each up to the max', model(), 'chat', { max_tokens: 500, n: 3 }, 1000, { micros: 14_000, priced: true, outputTokens: 1500, field: 'max_tokens' }],
    ['responses max_output_tokens', model(), 'responses', { max_output_tokens: 500, max_tokens: 1 }, 1000, { micros: 6000, priced: true, outputTokens: 500, field: 'max_output_tokens' }],
    ['responses ignores chat fields', model({ maxOutputTokens: 250 }), 'responses', { max_tokens: 500 }, 1000, { micros: 4000, priced: true, outputTokens: 250, field: 'max_output_tokens' }],
    ['no max: the ceiling', model({ maxOutputTokens: 250 }), 'chat', {}, 1000, { micros: 4000, priced: true, outputTokens: 250, field: 'max_completion_tokens' }],
    ['a bad max is no max', model({ maxOutputTokens: 250 }), 'chat', { max_tokens: -5 }, 1000, { micros: 4000, priced: true, outputTokens: 250, field: 'max_completion_tokens' }],
    ['no max, no ceiling: unpriced', model(), 'chat', {}, 1000, { micros: 2000 + Math.ceil(UNPRICED_OUTPUT_TOKENS * 8), priced: false, outputTokens: UNPRICED_OUTPUT_TOKENS, field: 'max_completion_tokens' }],
    ['audio output priced as audio', model({ outputAudioMicrosPerMtok: 80_000_000 }), 'chat', { max_tokens: 100 }, 0, { micros: 8000, priced: true, outputTokens: 100, field: 'max_tokens' }],
    ['cache writes dearer than input', model({ cacheWriteMicrosPerMtok: 3_000_000 }), 'chat', { max_tokens: 1 }, 1000, { micros: 3008, priced: true, outputTokens: 1, field: 'max_tokens' }],
    ['embeddings: input only', model({ kind: 'embeddings' }), 'chat', {}, 1000, { micros: 2000, priced: true, outputTokens: 0, field: 'max_completion_tokens' }],
    ['rounded up', model({ inputMicrosPerMtok: 1, outputMicrosPerMtok: 0 }), 'chat', { max_tokens: 1 }, 1, { micros: 1, priced: true, outputTokens: 1, field: 'max_tokens' }],
  ];
  for (const [name, m, api, body, input, want] of cases) {
    const w = requestWorstCase(m, api, body, input);
    assert.deepEqual({ micros: w.micros, priced: w.priced, outputTokens: w.outputTokens, field: w.field }, want, name);
  }
});

test('affordable output tokens: what is left after the input, at the output price, never more than asked', () => {
  const w = requestWorstCase(model(), 'chat', { max_tokens: 500 }, 1000);
  assert.equal(affordableOutputTokens(w, 6000), 500, 'everything fits');
  assert.equal(affordableOutputTokens(w, 2008), 1, '8 µ$ after the input: one token');
  assert.equal(affordableOutputTokens(w, 2007), 0);
  assert.equal(affordableOutputTokens(w, 1000), 0, 'not even the input');
  assert.equal(affordableOutputTokens(w, -50), 0);
  // Exact where the products leave the safe integers.
  const huge = requestWorstCase(model({ outputMicrosPerMtok: 3 }), 'chat', { max_tokens: Number.MAX_SAFE_INTEGER }, 0);
  assert.equal(affordableOutputTokens(huge, 3_000_000), 1_000_000_000_000);
});

test('the refusal names the pool and the output tokens that fit, as OpenRouter does', () => {
  assert.equal(
    worstCaseMessage({ keyLimitMicros: 10_000, reset: 'daily' }, 4096, 89, 'max_tokens'),
    "This request requires more than is left of this API key's spend limit of $0.01 per day, or fewer max_tokens: you requested up to 4096 output tokens, but can only afford 89.",
  );
  assert.match(worstCaseMessage('org', 10, 0, 'max_output_tokens'), /^This request requires more than is left of the organisation's balance and monthly spend cap, or fewer max_output_tokens: you requested up to 10 output tokens, but can only afford 0\.$/);
  assert.match(worstCaseMessage({ projectCapMicros: 50_000_000 }, 10, 3, 'max_tokens'), /the project's monthly spend cap of \$50\.00/);
  assert.ok(Buffer.byteLength(`insufficient_quota: ${worstCaseShort({ projectCapMicros: 1 }, 1_000_000, 999_999)}`) <= 123, 'fits a WebSocket close reason');
});

test('raising a reservation to the worst case: taken when the slice covers it, asked for as the need when short', () => {
  const { lc, sent } = client(2);
  lc.canSpend('org');
  lc.applyOrgGrant('org', 10_000, false);
  const r = lc.reserveSpend('org')!;
  assert.deepEqual(lc.raiseSpend('org', r, 1800, false, false), { verdict: 'yes' });
  assert.equal(r.micros, 1800);
  assert.equal(lc.sliceOf('org'), 8200);
  // Lowered (a request that reserved more at admission): the excess goes back to the slice.
  const low = lc.reserveSpend('org')!;
  lc.raiseSpend('org', low, 0, false, false);
  assert.equal(lc.sliceOf('org'), 8200);
  for (let i = 0; i < 4; i++) assert.equal(lc.raiseSpend('org', lc.reserveSpend('org')!, 1800, false, false).verdict, 'yes');
  assert.equal(lc.sliceOf('org'), 1000);
  // Short: the shortfall is asked for as the need (the control plane reclaims before it says "no more").
  const sixth = lc.reserveSpend('org')!;
  assert.deepEqual(lc.raiseSpend('org', sixth, 1800, false, false), { verdict: 'wait' });
  // Room for what is in flight (five worst cases reserved, 9,000), at least a few of its worst case and the need.
  assert.deepEqual(sent.at(-1)!.orgs, [{ orgId: 'org', micros: 5 * 1800, needMicros: 800, heldMicros: 1000 }], 'room for what is in flight, at least the need');
  assert.equal(lc.sliceOf('org'), 1000, 'nothing taken while it waits');
  // The control plane's final answer: nothing more. Refused, with what it could have had.
  lc.applyOrgGrant('org', 0, true);
  assert.deepEqual(lc.raiseSpend('org', sixth, 1800, false, false), { verdict: 'no', leftMicros: 1000 });
  // A smaller worst case still fits what is left.
  assert.deepEqual(lc.raiseSpend('org', sixth, 1000, false, false), { verdict: 'yes' });
  assert.equal(lc.sliceOf('org'), 0);
});

test('an unpriced request at the last of a pool takes all that is left; the next one is refused', () => {
  const { lc } = client(1);
  lc.canSpend('key:k@0');
  lc.applyOrgGrant('key:k@0', 10_000, false);
  const first = lc.reserveSpend('key:k@0')!;
  const second = lc.reserveSpend('key:k@0')!;
  assert.equal(lc.raiseSpend('key:k@0', first, 410_000, true, false).verdict, 'wait', 'its nominal worst case does not fit: asked for');
  assert.equal(lc.raiseSpend('key:k@0', second, 410_000, true, false).verdict, 'wait');
  lc.applyOrgGrant('key:k@0', 0, true);
  assert.deepEqual(lc.raiseSpend('key:k@0', first, 410_000, true, false), { verdict: 'yes' });
  assert.equal(first.micros, 10_000, 'all that is left');
  assert.deepEqual(lc.raiseSpend('key:k@0', second, 410_000, true, false), { verdict: 'no', leftMicros: 0 });
  // Settled at its real cost: the rest is back for the next.
  lc.settleSpend('key:k@0', first, 1700);
  assert.equal(lc.sliceOf('key:k@0'), 8300);
});

test('out of time with no answer, or the organisation\'s first request admitted before its first slice: taken in advance', () => {
  const { lc } = client(2);
  lc.canSpend('org');
  // The control plane said nothing more may be taken in advance (0: near the limit; docs/leases.md).
  lc.applyOrgGrant('org', 1000, false, 0);
  const late = lc.reserveSpend('org')!;
  assert.equal(lc.raiseSpend('org', late, 5000, false, false).verdict, 'wait');
  assert.deepEqual(lc.raiseSpend('org', late, 5000, false, true), { verdict: 'yes' }, 'final: no answer is not a refusal');
  assert.equal(lc.sliceOf('org'), -4000, 'a debt the next want says');
  // One request past what it may take (nothing here) per node while the answer is late: the next one
  // out of time waits on (before, every request of a burst was taken in advance: a $0.01 limit passed
  // by 22,300 µ$ under load).
  const later = lc.reserveSpend('org')!;
  assert.deepEqual(lc.raiseSpend('org', later, 5000, false, true), { verdict: 'wait' }, 'a second advance before an answer: waits');
  assert.equal(lc.sliceOf('org'), -4000);
  // The answer comes: decided by it, as any raise.
  lc.applyOrgGrant('org', 10_000, false, 0);
  assert.deepEqual(lc.raiseSpend('org', later, 5000, false, false), { verdict: 'yes' });
  // Standing shares: the organisation's first request is admitted before its first slice (one
  // request past what is left at most) and is not held back once its body is read either.
  const out: LeaseRequestOut[] = [];
  const standing = new LeaseClient(new ManualClock(60_000 * 100), (r) => (out.push(r), true), (fn) => fn(), true);
  standing.setConnected(true, 2);
  assert.equal(standing.spendFirst('org'), true);
  const first = standing.reserveSpend('org')!;
  assert.deepEqual(standing.raiseSpend('org', first, 5000, false, false), { verdict: 'yes' });
  assert.equal(standing.sliceOf('org'), -5000);
  // The next one waits for the slice as usual.
  const next = standing.reserveSpend('org')!;
  assert.equal(standing.raiseSpend('org', next, 5000, false, false).verdict, 'wait');
});

test('a node told "nothing left" whose money is then reclaimed for another node asks again instead of refusing', () => {
  // Before: with unpriced requests every want near a limit ends "exhausted"; the node kept refusing
  // for a second although the money it gave back to a reclaim showed some was left (money-limits
  // 90/10: refused with 9 of 12.50 USD spent).
  const { lc } = client(2);
  lc.canSpend('org');
  lc.applyOrgGrant('org', 3000, true);
  lc.settleSpend('org', lc.reserveSpend('org'), 1000);
  assert.equal(lc.canSpend('org'), 'yes', 'the last of the pool: spent while it lasts');
  lc.onReclaim({ id: 1, keys: [], allKeys: false, orgIds: ['org'], slotKeyIds: [] });
  assert.equal(lc.canSpend('org'), 'wait', 'asks again: money was left');
  // A reclaim that finds nothing changes nothing: the back-off holds.
  lc.applyOrgGrant('org', 0, true);
  lc.onReclaim({ id: 2, keys: [], allKeys: false, orgIds: ['org'], slotKeyIds: [] });
  assert.equal(lc.canSpend('org'), 'no');
});
