// Rewrites of a JSON request body done on its text, not by JSON.parse + JSON.stringify: everything the
// client sent stays byte for byte (number formats, key order, big integers), so the body forwarded is
// the body that was validated and billed, and no re-serialisation runs per request. Pure.

/**
 * The span [start, end) of the string value of a top-level member `key` (the quotes included), or null
 * when there is none or its key is written with escapes. `text` must be JSON that JSON.parse accepted
 * and whose objects repeat no key (validate-request.ts refuses those).
 */
export function topLevelStringSpan(text: string, key: string): [number, number] | null {
  let depth = 0;
  let expectKey = false;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      const end = stringEnd(text, i);
      if (depth === 1 && expectKey) {
        expectKey = false;
        if (end - i - 1 === key.length && text.startsWith(key, i + 1)) {
          let j = end + 1;
          while (isSpace(text.charCodeAt(j))) j++;
          // A colon follows a key in valid JSON.
          j++;
          while (isSpace(text.charCodeAt(j))) j++;
          if (text.charCodeAt(j) !== 34) return null;
          return [j, stringEnd(text, j) + 1];
        }
      }
      i = end;
    } else if (c === 123 /* { */ || c === 91 /* [ */) {
      depth++;
      if (depth === 1) expectKey = c === 123;
    } else if (c === 125 /* } */ || c === 93 /* ] */) depth--;
    else if (c === 44 /* , */ && depth === 1) expectKey = true;
  }
  return null;
}

/** Index of the closing quote of the string token that opens at `start`. */
function stringEnd(text: string, start: number): number {
  let i = start + 1;
  for (;;) {
    const c = text.charCodeAt(i);
    if (c === 34 || Number.isNaN(c)) return i;
    i += c === 92 /* \ */ ? 2 : 1;
  }
}

function isSpace(c: number): boolean {
  return c === 32 || c === 10 || c === 13 || c === 9;
}

/**
 * The body with its top-level `model` replaced by `model`, and, with `addIncludeUsage`, a
 * `"stream_options":{"include_usage":true}` member added first (the body must have no stream_options).
 * Null when the text cannot be rewritten in place (the caller re-serialises).
 */
export function rewriteChatBody(text: string, model: string | null, addIncludeUsage: boolean): string | null {
  let out = text;
  if (model !== null) {
    const span = topLevelStringSpan(text, 'model');
    if (!span) return null;
    out = text.slice(0, span[0]) + JSON.stringify(model) + text.slice(span[1]);
  }
  if (addIncludeUsage) {
    const open = out.indexOf('{');
    if (open === -1) return null;
    out = `${out.slice(0, open + 1)}"stream_options":{"include_usage":true},${out.slice(open + 1)}`;
  }
  return out;
}

/**
 * The body with top-level string members set: each of `set` replaces the member's string value where
 * the body has it, else is added first. Null when a member to replace is not a plain string (the
 * caller re-serialises). `present`: the members the parsed body has.
 */
export function setTopLevelStrings(text: string, set: Readonly<Record<string, string>>, present: (key: string) => boolean): string | null {
  const spans: Array<[number, number, string]> = [];
  let added = '';
  for (const [key, value] of Object.entries(set)) {
    if (!present(key)) {
      added += `${JSON.stringify(key)}:${JSON.stringify(value)},`;
      continue;
    }
    const span = topLevelStringSpan(text, key);
    if (!span) return null;
    spans.push([span[0], span[1], JSON.stringify(value)]);
  }
  // From the last span to the first, so each index still holds.
  spans.sort((a, b) => b[0] - a[0]);
  let out = text;
  for (const [start, end, value] of spans) out = out.slice(0, start) + value + out.slice(end);
  if (added === '') return out;
  const open = out.indexOf('{');
  if (open === -1) return null;
  // `added` ends with a comma: an empty object `{}` needs it dropped.
  const rest = out.slice(open + 1);
  return `${out.slice(0, open + 1)}${/^\s*\}/.test(rest) ? added.slice(0, -1) : added}${rest}`;
}
