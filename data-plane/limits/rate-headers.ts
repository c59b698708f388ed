// The key's rate-limit state as the client sees it: the `x-ratelimit-*` response headers (key-budgets.ts
// counts, this renders). Pure.

/** What the rate headers say, as key-budgets.ts counted it. */
export interface RateHeaders {
  limitRequests: number;
  remainingRequests: number;
  limitTokens: number;
  remainingTokens: number;
  /** Seconds until both minute budgets start afresh (the top of the next clock minute). */
  resetSec: number;
}

/**
 * The `x-ratelimit-*` headers to send, lower-case names: only for the dimensions the key has a limit on
 * (spec: "once the key has an rpm limit" / "a tpm limit"). `x-ratelimit-reset-*` follow the OpenAI
 * API's convention (a duration such as `47s`); both budgets reset at the top of the clock minute.
 */
export function rateHeaderPairs(h: RateHeaders): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  const reset = resetText(h);
  if (h.limitRequests > 0) {
    out.push(['x-ratelimit-limit-requests', String(h.limitRequests)], ['x-ratelimit-remaining-requests', String(h.remainingRequests)], ['x-ratelimit-reset-requests', reset]);
  }
  if (h.limitTokens > 0) {
    out.push(['x-ratelimit-limit-tokens', String(h.limitTokens)], ['x-ratelimit-remaining-tokens', String(h.remainingTokens)], ['x-ratelimit-reset-tokens', reset]);
  }
  return out;
}

/** `${n}s` for every reset a minute can have, built once. */
const RESET_TEXT = Array.from({ length: 61 }, (_, i) => `${i}s`);

function resetText(h: RateHeaders): string {
  return RESET_TEXT[h.resetSec] ?? `${h.resetSec}s`;
}

/**
 * Writes the headers of `rateHeaderPairs` straight to a response in one `writeHeader` call: uWS
 * writes `name: value\r\n`, so a value holding the following lines yields the same bytes as one call
 * per header, for one crossing into native code instead of six. Every value is a number or a
 * duration built here, so nothing else can reach the head.
 */
export function writeRateHeaders(h: RateHeaders, res: { writeHeader(name: string, value: string): unknown }): void {
  const reset = resetText(h);
  const tokens =
    h.limitTokens > 0 ? `${h.limitTokens}\r\nx-ratelimit-remaining-tokens: ${h.remainingTokens}\r\nx-ratelimit-reset-tokens: ${reset}` : '';
  if (h.limitRequests > 0) {
    const requests = `${h.limitRequests}\r\nx-ratelimit-remaining-requests: ${h.remainingRequests}\r\nx-ratelimit-reset-requests: ${reset}`;
    res.writeHeader('x-ratelimit-limit-requests', tokens ? `${requests}\r\nx-ratelimit-limit-tokens: ${tokens}` : requests);
  } else if (tokens) {
    res.writeHeader('x-ratelimit-limit-tokens', tokens);
  }
}
