// What the gateway counts of a Responses API request (`POST /v1/responses`) itself: the text of its
// `input` and its prompt tokens, for the demo provider and for an upstream that reports no usage.
// Reading the usage upstreams report is usage-readers.ts's (ResponsesJsonReader, ResponsesSseReader).
import { countTokens } from '../tokens.js';

function isObj(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** The text of a Responses `input` (a string, or items whose content is a string or parts with text). */
export function responsesInputText(input: unknown): string {
  if (typeof input === 'string') return input;
  if (!Array.isArray(input)) return '';
  let out = '';
  for (const item of input) {
    if (!isObj(item)) continue;
    const c = item.content;
    if (typeof c === 'string') out += (out ? '\n' : '') + c;
    else if (Array.isArray(c)) for (const p of c) if (isObj(p) && typeof p.text === 'string') out += (out ? '\n' : '') + p.text;
    if (typeof item.output === 'string') out += (out ? '\n' : '') + item.output;
  }
  return out;
}

/** Prompt tokens of a Responses request counted by the gateway: its input and instructions. */
export function countResponsesInputTokens(body: Record<string, unknown>): number {
  let n = countTokens(responsesInputText(body.input));
  if (typeof body.instructions === 'string') n += countTokens(body.instructions);
  return n;
}

/** The ids of the items in a list (a response's `output`, a page of a conversation's items). */
export function itemIdsOf(list: unknown): string[] {
  const ids: string[] = [];
  if (!Array.isArray(list)) return ids;
  for (const x of list) if (isObj(x) && typeof x.id === 'string' && x.id.length > 0 && x.id.length <= 128) ids.push(x.id);
  return ids;
}
