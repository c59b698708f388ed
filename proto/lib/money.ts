// Money is integer micro-dollars everywhere: 1 USD = 1_000_000 micros. Never floating point.
export const MICROS_PER_USD = 1_000_000;

/** Parses a decimal USD amount ("5", "5.00", "0.000001") exactly. Returns null for anything else. */
export function parseUsd(text: string): number | null {
  const m = /^(-?)(\d{1,12})(?:\.(\d{1,6}))?$/.exec(text.trim());
  if (!m) return null;
  const micros = Number(m[2]) * MICROS_PER_USD + Number((m[3] ?? '').padEnd(6, '0'));
  return m[1] === '-' ? -micros : micros;
}

/** Formats micros as USD with at least two decimals: 5000000 → "5.00", 1234567 → "1.234567". */
export function formatUsd(micros: number): string {
  const sign = micros < 0 ? '-' : '';
  const abs = Math.abs(micros);
  const whole = Math.floor(abs / MICROS_PER_USD);
  let frac = String(abs % MICROS_PER_USD).padStart(6, '0').replace(/0+$/, '');
  if (frac.length < 2) frac = frac.padEnd(2, '0');
  return `${sign}${whole}.${frac}`;
}

/** "YYYY-MM" of a UTC timestamp. */
export function monthOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}

/** Cost of a request: tokens × price per million tokens, rounded up to a whole micro. */
export function tokenCostMicros(promptTokens: number, completionTokens: number, inMicrosPerMtok: number, outMicrosPerMtok: number): number {
  return Math.ceil((promptTokens * inMicrosPerMtok + completionTokens * outMicrosPerMtok) / 1_000_000);
}

/** A model's token prices in micro-dollars per million tokens; an unset part falls back as named. */
export interface TokenPrices {
  inputMicrosPerMtok: number;
  outputMicrosPerMtok: number;
  /** Cached input tokens; unset: the input price (the input audio price for cached audio). */
  cachedInputMicrosPerMtok?: number;
  /** Input tokens written to the cache; unset: the input price. */
  cacheWriteMicrosPerMtok?: number;
  /** Audio input tokens; unset: the input price. */
  inputAudioMicrosPerMtok?: number;
  /** Audio output tokens; unset: the output price. */
  outputAudioMicrosPerMtok?: number;
}

/**
 * What a request used, in tokens. The details are parts of their whole (as OpenAI reports them):
 * cached, cache-write and audio input tokens are parts of `promptTokens`, audio output tokens part of
 * `completionTokens`; a part larger than what is left of its whole is cut to it.
 */
export interface TokenCounts {
  promptTokens: number;
  completionTokens: number;
  cachedPromptTokens?: number;
  cacheWriteTokens?: number;
  audioPromptTokens?: number;
  /** Of the cached tokens, those that are audio. */
  cachedAudioPromptTokens?: number;
  audioCompletionTokens?: number;
}

/**
 * The cost of a request's tokens: each part at its price, rounded up to a whole micro-dollar once,
 * for the whole. Exact for any counts (BigInt when the sum leaves the safe integers).
 */
export function usageCostMicros(c: TokenCounts, p: TokenPrices): number {
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
  // Seven parts, each at its price; named rather than listed, as this runs for every request billed.
  const n1 = text, p1 = p.inputMicrosPerMtok;
  const n2 = cached - cachedAudio, p2 = p.cachedInputMicrosPerMtok ?? p.inputMicrosPerMtok;
  const n3 = cachedAudio, p3 = p.cachedInputMicrosPerMtok ?? inAudio;
  const n4 = freshAudio, p4 = inAudio;
  const n5 = write, p5 = p.cacheWriteMicrosPerMtok ?? p.inputMicrosPerMtok;
  const n6 = completion - audioOut, p6 = p.outputMicrosPerMtok;
  const n7 = audioOut, p7 = p.outputAudioMicrosPerMtok ?? p.outputMicrosPerMtok;
  const sum = n1 * p1 + n2 * p2 + n3 * p3 + n4 * p4 + n5 * p5 + n6 * p6 + n7 * p7;
  if (Number.isSafeInteger(sum)) return Math.ceil(sum / 1_000_000);
  const big = (n: number, price: number): bigint => BigInt(n) * BigInt(price);
  const total = big(n1, p1) + big(n2, p2) + big(n3, p3) + big(n4, p4) + big(n5, p5) + big(n6, p6) + big(n7, p7);
  return Number((total + 999_999n) / 1_000_000n);
}

function whole(n: number | undefined): number {
  return typeof n === 'number' && Number.isFinite(n) && n > 0 ? Math.floor(n) : 0;
}

/** Micro-dollars as a JSON number with exactly six decimals: 40012 → "0.040012". */
export function usdNumberText(micros: number): string {
  const sign = micros < 0 ? '-' : '';
  const abs = Math.abs(micros);
  return `${sign}${Math.floor(abs / MICROS_PER_USD)}.${String(abs % MICROS_PER_USD).padStart(6, '0')}`;
}
