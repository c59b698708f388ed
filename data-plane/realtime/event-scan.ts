// Reading realtime events without decoding them whole: the top-level `type` and string members of a
// JSON event found by one scan that skips every value (large audio deltas cost little), the bytes a
// base64 member decodes to, and a validated token count.
import { base64Bytes } from './response-estimate.js';

export type Obj = Record<string, any>;

/** Largest token count one `response.done` may report; anything else is malformed. */
const MAX_TOKENS_PER_RESPONSE = 100_000_000;

/** A validated token count: a whole number in [0, MAX_TOKENS_PER_RESPONSE], anything else 0. */
export function tokens(v: unknown): number {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.min(Math.floor(v), MAX_TOKENS_PER_RESPONSE) : 0;
}

export function parse(data: Buffer): Obj | null {
  return parseText(data.toString('utf8'));
}

export function parseText(text: string): Obj | null {
  try {
    const v = JSON.parse(text);
    return v && typeof v === 'object' ? v : null;
  } catch {
    return null;
  }
}

/**
 * The top-level `type` of a JSON event, as JSON.parse would read it (the last `type` member wins),
 * found by one scan that skips every value without decoding it: strings by the native indexOf of their
 * closing quote, so large audio deltas cost little. Undefined when the text is not a JSON object with a
 * string `type`.
 */
export function eventTypeOf(data: Buffer): string | undefined {
  const n = data.length;
  let i = skipSpace(data, 0);
  if (data[i] !== 123 /* { */) return undefined;
  i = skipSpace(data, i + 1);
  if (data[i] === 125 /* } */) return undefined;
  let type: string | undefined;
  while (i < n) {
    if (data[i] !== 34 /* " */) return undefined;
    const keyEnd = stringEnd(data, i);
    if (keyEnd < 0) return undefined;
    const isType = isTypeKey(data, i, keyEnd);
    i = skipSpace(data, keyEnd);
    if (data[i] !== 58 /* : */) return undefined;
    i = skipSpace(data, i + 1);
    const valueEnd = skipValue(data, i);
    if (valueEnd < 0) return undefined;
    if (isType) type = data[i] === 34 ? decodeString(data, i, valueEnd) : undefined;
    i = skipSpace(data, valueEnd);
    if (data[i] === 125) return skipSpace(data, i + 1) === n ? type : undefined;
    if (data[i] !== 44 /* , */) return undefined;
    i = skipSpace(data, i + 1);
  }
  return undefined;
}

/**
 * The spans ([start, end), quotes included) of top-level string members of a JSON object event, one
 * per name (the last occurrence, as JSON.parse reads it), found by the same scan as eventTypeOf
 * without decoding any value. Undefined for a name absent, not a string, or a text that is no object.
 */
export function stringMemberSpans(data: Buffer, names: readonly string[]): Array<[number, number] | undefined> {
  const found: Array<[number, number] | undefined> = names.map(() => undefined);
  const n = data.length;
  let i = skipSpace(data, 0);
  if (data[i] !== 123 /* { */) return found;
  i = skipSpace(data, i + 1);
  while (i < n && data[i] === 34) {
    const keyEnd = stringEnd(data, i);
    if (keyEnd < 0) break;
    const key = keyEnd - i <= 66 ? (data.subarray(i, keyEnd).includes(92) ? decodeString(data, i, keyEnd) : data.toString('latin1', i + 1, keyEnd - 1)) : undefined;
    i = skipSpace(data, keyEnd);
    if (data[i] !== 58 /* : */) break;
    i = skipSpace(data, i + 1);
    const valueEnd = skipValue(data, i);
    if (valueEnd < 0) break;
    const at = key === undefined ? -1 : names.indexOf(key);
    if (at >= 0) found[at] = data[i] === 34 ? [i, valueEnd] : undefined;
    i = skipSpace(data, valueEnd);
    if (data[i] !== 44 /* , */) break;
    i = skipSpace(data, i + 1);
  }
  return found;
}

/** The bytes the base64 JSON string at `span` (quotes included) decodes to, without decoding it. */
export function base64SpanBytes(data: Buffer, [start, end]: [number, number]): number {
  const close = end - 1;
  const padding = data[close - 1] === 61 /* = */ ? (data[close - 2] === 61 ? 2 : 1) : 0;
  return base64Bytes(close - start - 1, padding);
}

/** Whether the key string in [start, end) is `"type"`, spelled plainly or with escapes. */
function isTypeKey(data: Buffer, start: number, end: number): boolean {
  if (end - start === 6) return data[start + 1] === 116 && data[start + 2] === 121 && data[start + 3] === 112 && data[start + 4] === 101;
  if (end - start > 64) return false;
  return data.subarray(start, end).includes(92) && decodeString(data, start, end) === 'type';
}

function skipSpace(data: Buffer, from: number): number {
  let i = from;
  while (i < data.length && (data[i] === 32 || data[i] === 10 || data[i] === 13 || data[i] === 9)) i++;
  return i;
}

/** The index after the closing quote of the string opening at `at`, or -1. */
function stringEnd(data: Buffer, at: number): number {
  let i = at + 1;
  for (;;) {
    const q = data.indexOf(34, i);
    if (q < 0) return -1;
    // Escaped when an odd number of backslashes precede it.
    let b = q - 1;
    while (b > at && data[b] === 92) b--;
    if ((q - 1 - b) % 2 === 0) return q + 1;
    i = q + 1;
  }
}

export function decodeString(data: Buffer, start: number, end: number): string | undefined {
  try {
    const v = JSON.parse(data.toString('utf8', start, end)) as unknown;
    return typeof v === 'string' ? v : undefined;
  } catch {
    return undefined;
  }
}

/** The index after the JSON value starting at `at`, or -1 (nested values by their brackets). */
function skipValue(data: Buffer, at: number): number {
  const c = data[at];
  if (c === 34) return stringEnd(data, at);
  if (c === 123 || c === 91 /* [ */) {
    let depth = 0;
    for (let i = at; i < data.length; i++) {
      const d = data[i];
      if (d === 34) {
        i = stringEnd(data, i);
        if (i < 0) return -1;
        i--;
      } else if (d === 123 || d === 91) depth++;
      else if ((d === 125 || d === 93) && --depth === 0) return i + 1;
    }
    return -1;
  }
  // A number or a literal: up to the next delimiter.
  let i = at;
  while (i < data.length && data[i] !== 44 && data[i] !== 125 && data[i] !== 93 && data[i] !== 32 && data[i] !== 10 && data[i] !== 13 && data[i] !== 9) i++;
  return i > at ? i : -1;
}
