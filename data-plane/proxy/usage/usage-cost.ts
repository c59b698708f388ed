// Writing the charge into the usage an answer passes on (`usage.cost`, USD with six decimals), for
// every usage reader (usage-readers.ts) and the demo provider.
import { usdNumberText } from '../../../proto/lib/money.js';

/**
 * A usage object with the charge written in: the upstream's own `cost` and `cost_details` (what the
 * operator pays, e.g. OpenRouter's) are dropped, `cost` is the USD charged, as a number with six
 * decimals. Key order is kept.
 */
export function usageWithCost(usage: Record<string, unknown>, micros: number): string {
  const { cost: _cost, cost_details: _details, ...rest } = usage;
  const text = JSON.stringify(rest);
  return `${text.slice(0, -1)}${text.length > 2 ? ',' : ''}"cost":${usdNumberText(micros)}}`;
}

/** An answer's (or a chunk's) JSON with `usage.cost` written in (key order kept). */
export function withUsageCost(obj: Record<string, unknown>, micros: number): string {
  return withMemberText(obj, 'usage', usageWithCost(obj.usage as Record<string, unknown>, micros));
}

/** `obj` as JSON with member `key`'s value replaced by the JSON `text` (key order kept). */
export function withMemberText(obj: Record<string, unknown>, key: string, text: string): string {
  const mark = `\u0000${key}`;
  // A function: a replacement string would read `$&` and the like in `text` as patterns.
  return JSON.stringify({ ...obj, [key]: mark }).replace(JSON.stringify(mark), () => text);
}
