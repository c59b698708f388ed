// A simple deterministic tokenizer: a token is a run of letters/digits or one other non-space
// character. The demo provider uses it for prompt and completion alike, and the gateway uses it to
// count usage when an upstream reports none.

const TOKEN_RE = /[\p{L}\p{N}]+|[^\s\p{L}\p{N}]/gu;

export function countTokens(text: string): number {
  let n = 0;
  TOKEN_RE.lastIndex = 0;
  while (TOKEN_RE.exec(text) !== null) n++;
  return n;
}

/** The text of a chat message content: a string, or the text parts of an array. */
export function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  let out = '';
  for (const part of content) {
    if (typeof part === 'string') out += (out ? ' ' : '') + part;
    else if (part && typeof part === 'object' && typeof (part as { text?: unknown }).text === 'string') {
      out += (out ? ' ' : '') + (part as { text: string }).text;
    }
  }
  return out;
}

/** Prompt tokens of a chat request: the tokens of every message's text. */
export function countMessageTokens(messages: unknown): number {
  if (!Array.isArray(messages)) return 0;
  let n = 0;
  for (const m of messages) if (m && typeof m === 'object') n += countTokens(contentText((m as { content?: unknown }).content));
  return n;
}

/** The first `max` tokens of a text (cut right after the last kept token), and whether it was cut. */
export function truncateTokens(text: string, max: number): { text: string; tokens: number; cut: boolean } {
  let n = 0;
  let end = 0;
  TOKEN_RE.lastIndex = 0;
  let m: RegExpExecArray | null;
  while ((m = TOKEN_RE.exec(text)) !== null) {
    if (n === max) return { text: text.slice(0, end), tokens: n, cut: true };
    n++;
    end = m.index + m[0].length;
  }
  return { text, tokens: n, cut: false };
}
