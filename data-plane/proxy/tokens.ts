// Two things about tokens:
// - A simple deterministic tokenizer (`countTokens`): a token is a run of letters/digits or one other
//   non-space character. The demo provider uses it as its own "real" count, for prompt and completion.
// - The gateway's one estimator (`estimateTokens`, `estimateOutputTokens`): what a key reserves
//   against its tpm on admission, and what is billed when a request ends without the upstream's
//   usage (an abort, a revocation, an upstream that reports none). It counts everything sent (text,
//   images by OpenAI's rule, tools, the `response_format` schema) and everything received (text,
//   reasoning, refusals, tool calls), and leans high: ASCII at 4 characters per token (OpenAI's rule
//   of thumb), any other character a token of its own (CJK and emoji cost about that or more). An
//   answer's member too large for its reader to keep (over 1 MiB of `choices` or `output`) is
//   estimated from its bytes, at 4 a token. Chat and the Responses API use it alike.

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

// The estimator (see the top of the file). Never throws; a body it cannot read counts 0.
const CHARS_PER_TOKEN = 4;
/** Per message: role and separators (OpenAI's cookbook counts 3–4). */
const TOKENS_PER_MESSAGE = 4;
/** The reply's priming. */
const TOKENS_PER_REPLY = 3;
/** An image at `detail: "low"`: OpenAI's flat 85 tokens. */
const IMAGE_LOW_TOKENS = 85;
/**
 * An image at `high` or `auto` detail, whose size the gateway does not decode: OpenAI's rule is 85 +
 * 170 per 512-px tile after fitting in 2048×2048 and scaling the short side to 768, at most 2×4 tiles
 * (85 + 170 × 8). The most any image can cost, so an estimate is never below the upstream's bill.
 */
const IMAGE_HIGH_TOKENS = 85 + 170 * 8;
/** Input audio in a chat message: base64 bytes at 16 kB/s (low-bitrate) and 10 tokens a second, leaning high. */
const AUDIO_TOKENS_PER_BASE64_BYTE = 10 / 12_000;

const NON_ASCII = /[^\x00-\x7f]/;
const NON_ASCII_G = /[^\x00-\x7f]/g;

/** Estimated tokens of a text: ASCII at 4 characters a token, every other character (UTF-16 unit) one token. */
export function estimateTextTokens(text: string): number {
  if (text.length === 0) return 0;
  if (!NON_ASCII.test(text)) return Math.ceil(text.length / CHARS_PER_TOKEN);
  let wide = 0;
  NON_ASCII_G.lastIndex = 0;
  while (NON_ASCII_G.exec(text) !== null) wide++;
  return Math.ceil((text.length - wide) / CHARS_PER_TOKEN) + wide;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A JSON value (a tool definition, a schema) as the text the upstream renders into the prompt. */
function jsonTokens(v: unknown): number {
  if (v === undefined || v === null) return 0;
  try {
    return estimateTextTokens(typeof v === 'string' ? v : JSON.stringify(v));
  } catch {
    return 0;
  }
}

/**
 * Estimated prompt tokens of a model request: chat (`messages` with text, image, audio and file parts,
 * tool calls, `tools`/`functions`, `response_format`), embeddings and completions (`input`, `prompt`:
 * strings or token ids), responses (`instructions`, `input` items). Never throws.
 */
export function estimateTokens(body: unknown): number {
  try {
    if (!isObject(body)) return 0;
    let tokens = 0;
    if (Array.isArray(body.messages)) tokens += estimateMessages(body.messages);
    if (body.input !== undefined) tokens += estimateInput(body.input);
    if (body.prompt !== undefined) tokens += estimateInput(body.prompt);
    if (typeof body.instructions === 'string') tokens += estimateTextTokens(body.instructions);
    tokens += jsonTokens(body.tools) + jsonTokens(body.functions);
    // A JSON schema (or any response format but plain text) is rendered into the prompt.
    if (isObject(body.response_format) && body.response_format.type !== 'text') tokens += jsonTokens(body.response_format);
    if (isObject(body.text)) tokens += jsonTokens(body.text.format);
    return tokens;
  } catch {
    return 0;
  }
}

function estimateMessages(messages: unknown[]): number {
  let tokens = TOKENS_PER_REPLY;
  for (const m of messages) {
    tokens += TOKENS_PER_MESSAGE;
    if (!isObject(m)) continue;
    tokens += estimateContent(m.content);
    if (typeof m.name === 'string') tokens += estimateTextTokens(m.name);
    if (typeof m.refusal === 'string') tokens += estimateTextTokens(m.refusal);
    if (typeof m.tool_call_id === 'string') tokens += estimateTextTokens(m.tool_call_id);
    tokens += estimateToolCalls(m.tool_calls);
    if (isObject(m.function_call)) tokens += estimateFunction(m.function_call);
  }
  return tokens;
}

function estimateToolCalls(calls: unknown): number {
  if (!Array.isArray(calls)) return 0;
  let tokens = 0;
  for (const call of calls) if (isObject(call) && isObject(call.function)) tokens += estimateFunction(call.function);
  return tokens;
}

function estimateFunction(f: Record<string, unknown>): number {
  return (typeof f.name === 'string' ? estimateTextTokens(f.name) : 0) + (typeof f.arguments === 'string' ? estimateTextTokens(f.arguments) : 0);
}

/** A message content: a string, or parts (text, images, input audio, files). */
function estimateContent(content: unknown): number {
  if (typeof content === 'string') return estimateTextTokens(content);
  if (!Array.isArray(content)) return 0;
  let tokens = 0;
  for (const part of content) {
    if (typeof part === 'string') tokens += estimateTextTokens(part);
    else if (isObject(part)) tokens += estimatePart(part);
  }
  return tokens;
}

function estimatePart(part: Record<string, unknown>): number {
  if (typeof part.text === 'string') return estimateTextTokens(part.text);
  if (typeof part.refusal === 'string') return estimateTextTokens(part.refusal);
  const image = part.image_url ?? (part.type === 'input_image' ? part : undefined);
  if (image !== undefined) {
    const detail = isObject(image) ? image.detail : undefined;
    return detail === 'low' ? IMAGE_LOW_TOKENS : IMAGE_HIGH_TOKENS;
  }
  if (isObject(part.input_audio) && typeof part.input_audio.data === 'string') {
    return Math.ceil(part.input_audio.data.length * AUDIO_TOKENS_PER_BASE64_BYTE);
  }
  // A file (a PDF's text and page images) or an unknown part: its JSON, at the text rate.
  return jsonTokens(part);
}

/**
 * Embeddings / completions / responses input: a string, an array of strings (each estimated on its
 * own), an array of token ids (one token each), an array of token-id arrays, or (responses API) an
 * array of message-like items.
 */
function estimateInput(input: unknown): number {
  if (typeof input === 'string') return estimateTextTokens(input);
  if (!Array.isArray(input)) return 0;
  let tokens = 0;
  for (const item of input) {
    if (typeof item === 'string') tokens += estimateTextTokens(item);
    else if (typeof item === 'number') tokens += 1;
    else if (Array.isArray(item)) tokens += item.length;
    else if (isObject(item)) tokens += TOKENS_PER_MESSAGE + estimateContent(item.content ?? item.text);
  }
  return tokens;
}

/**
 * Estimated output tokens of what an upstream sent back: a chat completion (`choices[].message`), a
 * streamed chunk (`choices[].delta`), text, reasoning (`reasoning_content`, `reasoning`), refusals and
 * tool calls (names and arguments) all count. Called per chunk as a stream passes, so the count of a
 * stream cut short is what had arrived. Never throws.
 */
export function estimateOutputTokens(answer: unknown): number {
  try {
    if (!isObject(answer) || !Array.isArray(answer.choices)) return 0;
    let tokens = 0;
    for (const c of answer.choices) {
      if (!isObject(c)) continue;
      const m = isObject(c.message) ? c.message : isObject(c.delta) ? c.delta : null;
      if (m) {
        tokens += estimateContent(m.content);
        for (const k of ['reasoning_content', 'reasoning', 'refusal'] as const) if (typeof m[k] === 'string') tokens += estimateTextTokens(m[k] as string);
        tokens += estimateToolCalls(m.tool_calls);
        if (isObject(m.function_call)) tokens += estimateFunction(m.function_call);
        if (isObject(m.audio) && typeof m.audio.transcript === 'string') tokens += estimateTextTokens(m.audio.transcript);
      } else if (typeof c.text === 'string') tokens += estimateTextTokens(c.text);
    }
    return tokens;
  } catch {
    return 0;
  }
}
