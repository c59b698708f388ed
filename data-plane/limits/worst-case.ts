// A request's worst case in money (docs/money-limits.md#the-last-request): its input estimate plus the
// most output it allows, at the model's dearest input and output prices. Near a money limit a request
// is admitted only if its worst case fits (leases/request-money.ts reserveWorstCase). Pure.
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { usageCostMicros } from '../../proto/lib/money.js';
import { requestedPrices } from '../../proto/lib/reported-prices.js';

/**
 * Output tokens a request that names no max is taken to ask for when its model has no configured
 * ceiling (`max_output_tokens` in the gateway config): what decides whether it is near a limit. At the
 * limit such a request reserves all that is left instead (see `priced`).
 */
export const UNPRICED_OUTPUT_TOKENS = 4096;

/** Which API's fields name the most output: chat (`max_completion_tokens`, `max_tokens`, `n`) or the Responses API and realtime (`max_output_tokens`). */
export type OutputApi = 'chat' | 'responses';

export interface WorstCase {
  /** Input plus the most output, at the dearest prices, rounded up to a whole micro-dollar. */
  micros: number;
  /**
   * Whether the most output is known (named by the request or the model's ceiling). Unpriced, `micros`
   * counts UNPRICED_OUTPUT_TOKENS, and at the limit the request takes all that is left rather than
   * being refused: at most one such request runs at the margin on each node.
   */
  priced: boolean;
  inputTokens: number;
  /** The most output tokens it allows (every choice of a chat request with `n`). */
  outputTokens: number;
  /** The field a client lowers to fit: the one it named, else the API's own. */
  field: string;
  inputMicrosPerMtok: number;
  outputMicrosPerMtok: number;
  /** The built-in tool calls it names, at their prices (in `micros`). */
  toolMicros?: number;
}

/**
 * The worst case of a request of `model` whose input is estimated at `inputTokens` (the estimate
 * the tpm reservation uses), reading the most output from `body` as `api` names it, else the model's
 * ceiling. An embeddings model produces no output: its worst case is its input.
 */
export function requestWorstCase(model: ModelConfig, api: OutputApi, body: unknown, inputTokens: number): WorstCase {
  const obj = body !== null && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
  const input = count(inputTokens) ?? 0;
  // The tier the request names, a long input and the built-in tools it names (reported-prices.ts).
  const { prices, toolMicros } = requestedPrices(model, obj, input);
  const inputPrice = Math.max(prices.inputMicrosPerMtok, prices.inputAudioMicrosPerMtok ?? 0, prices.cacheWriteMicrosPerMtok ?? 0);
  const outputPrice = Math.max(prices.outputMicrosPerMtok, prices.outputAudioMicrosPerMtok ?? 0);
  let field = api === 'chat' ? 'max_completion_tokens' : 'max_output_tokens';
  let named = count(obj[field]);
  if (named === null && api === 'chat') {
    named = count(obj.max_tokens);
    if (named !== null) field = 'max_tokens';
  }
  const perChoice = model.kind === 'embeddings' ? 0 : (named ?? (model.maxOutputTokens !== undefined && model.maxOutputTokens > 0 ? model.maxOutputTokens : null));
  const choices = api === 'chat' ? (count(obj.n) ?? 1) : 1;
  const priced = perChoice !== null;
  const outputTokens = (perChoice ?? UNPRICED_OUTPUT_TOKENS) * choices;
  // Two parts at two prices (no cached or audio parts): summed directly, exact while it is a safe integer.
  const sum = input * inputPrice + outputTokens * outputPrice;
  const micros = toolMicros + (Number.isSafeInteger(sum) ? Math.ceil(sum / 1_000_000) : usageCostMicros({ promptTokens: input, completionTokens: outputTokens }, { inputMicrosPerMtok: inputPrice, outputMicrosPerMtok: outputPrice }));
  return { micros, priced, inputTokens: input, outputTokens, field, inputMicrosPerMtok: inputPrice, outputMicrosPerMtok: outputPrice, toolMicros };
}

/** How many output tokens `availableMicros` pays for after the request's input (0 when not even the input). */
export function affordableOutputTokens(w: WorstCase, availableMicros: number): number {
  const left = BigInt(Math.max(0, Math.floor(availableMicros) - (w.toolMicros ?? 0))) * 1_000_000n - BigInt(w.inputTokens) * BigInt(w.inputMicrosPerMtok);
  if (left <= 0n) return 0;
  if (w.outputMicrosPerMtok <= 0) return w.outputTokens;
  const n = left / BigInt(w.outputMicrosPerMtok);
  return n > BigInt(w.outputTokens) ? w.outputTokens : Number(n);
}

/** A positive whole count, or null. */
function count(v: unknown): number | null {
  return typeof v === 'number' && Number.isSafeInteger(v) && v > 0 ? v : null;
}
