// usageCostMicros (proto/lib/money.ts) bills every request; it was rewritten without the eight arrays
// it built per call (issue 37): the cost must be the one the earlier form gave, copied below, for any
// counts and prices, in the safe-integer and the BigInt range alike.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { usageCostMicros, type TokenCounts, type TokenPrices } from '../../proto/lib/money.js';

function whole(n: number | undefined): number {
  return typeof n === 'number' && Number.isFinite(n) && n > 0 ? Math.floor(n) : 0;
}

/** The form before the rewrite. */
function reference(c: TokenCounts, p: TokenPrices): number {
  const prompt = whole(c.promptTokens);
  const completion = whole(c.completionTokens);
  const cached = Math.min(whole(c.cachedPromptTokens), prompt);
  const audio = Math.min(whole(c.audioPromptTokens), prompt);
  const cachedAudio = Math.min(whole(c.cachedAudioPromptTokens), cached, audio);
  const write = Math.min(whole(c.cacheWriteTokens), prompt - cached);
  const freshAudio = Math.min(audio - cachedAudio, prompt - cached - write);
  const text = prompt - cached - write - freshAudio;
  const audioOut = Math.min(whole(c.audioCompletionTokens), completion);
  const inAudio = p.inputAudioMicrosPerMtok ?? p.inputMicrosPerMtok;
  const parts: Array<[number, number]> = [
    [text, p.inputMicrosPerMtok],
    [cached - cachedAudio, p.cachedInputMicrosPerMtok ?? p.inputMicrosPerMtok],
    [cachedAudio, p.cachedInputMicrosPerMtok ?? inAudio],
    [freshAudio, inAudio],
    [write, p.cacheWriteMicrosPerMtok ?? p.inputMicrosPerMtok],
    [completion - audioOut, p.outputMicrosPerMtok],
    [audioOut, p.outputAudioMicrosPerMtok ?? p.outputMicrosPerMtok],
  ];
  let sum = 0;
  for (const [n, price] of parts) sum += n * price;
  if (Number.isSafeInteger(sum)) return Math.ceil(sum / 1_000_000);
  let big = 0n;
  for (const [n, price] of parts) big += BigInt(n) * BigInt(price);
  return Number((big + 999_999n) / 1_000_000n);
}

test('usageCostMicros: the cases that matter', () => {
  const p: TokenPrices = { inputMicrosPerMtok: 2_500_000, outputMicrosPerMtok: 10_000_000, cachedInputMicrosPerMtok: 1_250_000 };
  const rows: Array<[TokenCounts, number]> = [
    [{ promptTokens: 0, completionTokens: 0 }, 0],
    [{ promptTokens: 1, completionTokens: 0 }, 3],
    [{ promptTokens: 1000, completionTokens: 500 }, 7500],
    [{ promptTokens: 1000, completionTokens: 500, cachedPromptTokens: 400 }, 7000],
    [{ promptTokens: 2 ** 52, completionTokens: 2 ** 52 }, reference({ promptTokens: 2 ** 52, completionTokens: 2 ** 52 }, p)],
  ];
  for (const [c, want] of rows) assert.equal(usageCostMicros(c, p), want, JSON.stringify(c));
});

test('usageCostMicros equals its earlier form for any counts and prices', () => {
  const count = fc.oneof(fc.nat(100_000), fc.nat(), fc.constantFrom(0, -1, 0.5, 2 ** 53, Number.MAX_SAFE_INTEGER, Infinity, NaN), fc.double());
  const opt = fc.option(count, { nil: undefined });
  const price = fc.oneof(fc.nat(100_000_000), fc.constantFrom(0, 1, 999_999, 2 ** 40));
  const optPrice = fc.option(price, { nil: undefined });
  const counts = fc.record({ promptTokens: count, completionTokens: count, cachedPromptTokens: opt, cacheWriteTokens: opt, audioPromptTokens: opt, cachedAudioPromptTokens: opt, audioCompletionTokens: opt });
  const prices = fc.record({ inputMicrosPerMtok: price, outputMicrosPerMtok: price, cachedInputMicrosPerMtok: optPrice, cacheWriteMicrosPerMtok: optPrice, inputAudioMicrosPerMtok: optPrice, outputAudioMicrosPerMtok: optPrice });
  fc.assert(
    fc.property(counts, prices, (c, p) => {
      assert.equal(usageCostMicros(c, p), reference(c, p));
    }),
    { numRuns: 5000 },
  );
});
