// The Responses API's usage readers (`POST /v1/responses`), beside the chat readers of the OpenAI
// provider: each watches an answer go through unchanged and reads the response's id (to record who
// owns it before the client can see it) and the usage the upstream reports, in bounded memory.
// - JSON answers: `ResponsesJsonReader` (id from the head, `usage` from the whole answer up to a bound).
// - SSE streams: `ResponsesSseReader`, event by event; events are told apart by their parsed `type`,
//   never by a substring: `response.created` names the id, `response.completed`, `response.incomplete`
//   and `response.failed` carry the usage, `response.output_text.delta` is counted for a stream that
//   ends without one (client abort, upstream failure).
// Usage: `input_tokens` (with `input_tokens_details.cached_tokens` as a part of it, priced apart),
// `output_tokens` (with `output_tokens_details.reasoning_tokens` inside it, billed as output).
import { StringDecoder } from 'node:string_decoder';
import type { BodyInspector } from './stream-proxy.js';
import { countTokens } from './tokens.js';

/** The largest count one usage field may report (as request-context.ts MAX_TOKENS_PER_REQUEST). */
const MAX_COUNT = 100_000_000;
/** Bytes of a JSON answer kept to read its usage (a Responses answer puts `usage` near, not at, the end). */
const MAX_JSON_BYTES = 4 * 1024 * 1024;
/** Bytes of a JSON answer's head searched for its `id` (the first member in OpenAI's answers). */
const HEAD_BYTES = 4096;
/** The longest SSE event held to be parsed; longer events are passed on unread. */
const MAX_EVENT_CHARS = 1024 * 1024;

/**
 * Usage as the gateway bills a response. The field names are those of CallResult's token details
 * (`cachedPromptTokens` is a part of `promptTokens`, priced at the model's cached-input price).
 */
export interface ResponsesUsage {
  promptTokens: number;
  completionTokens: number;
  cachedPromptTokens?: number;
  /** Part of `completionTokens`, kept for the record; billed as output. */
  reasoningTokens?: number;
}

/** Event types that end a response and carry its usage. */
const FINAL_TYPES = new Set(['response.completed', 'response.incomplete', 'response.failed']);

/** The token counts of a Responses `usage` object, or null when it holds none. */
export function responsesUsageOf(u: unknown): ResponsesUsage | null {
  if (!isObj(u) || (u.input_tokens === undefined && u.output_tokens === undefined)) return null;
  const prompt = count(u.input_tokens);
  let completion = count(u.output_tokens);
  const reasoning = count(obj(u.output_tokens_details)?.reasoning_tokens);
  // Reasoning tokens are output tokens: an upstream reporting them beside output_tokens (or a total
  // above input and output together) is billed the rest as output.
  if (reasoning > completion) completion = reasoning;
  const total = u.total_tokens === undefined ? 0 : count(u.total_tokens);
  if (total > prompt + completion) completion = Math.min(MAX_COUNT, total - prompt);
  const out: ResponsesUsage = { promptTokens: prompt, completionTokens: completion };
  const cached = Math.min(count(obj(u.input_tokens_details)?.cached_tokens), prompt);
  if (cached > 0) out.cachedPromptTokens = cached;
  if (reasoning > 0) out.reasoningTokens = reasoning;
  return out;
}

/** A response id as the upstream names it, or null. */
function idOf(v: unknown): string | null {
  return typeof v === 'string' && v.length > 0 && v.length <= 128 ? v : null;
}

/**
 * A JSON answer of `POST /v1/responses`, passed through unchanged (it keeps its length and may go out
 * with tryEnd, so its end is read in `finish`, called when the upstream ended, not in `flush`).
 */
export class ResponsesJsonReader implements BodyInspector {
  readonly passesThrough = true;
  usage: ResponsesUsage | null = null;
  id: string | null = null;
  private head = '';
  private parts: Buffer[] = [];
  private size = 0;
  /** `onId` runs as soon as the id is read, before the bytes naming it are passed on. */
  constructor(private readonly onId: (id: string) => void) {}

  transform(chunk: Buffer): Buffer {
    if (this.id === null && this.head.length < HEAD_BYTES) {
      this.head += chunk.subarray(0, HEAD_BYTES - this.head.length).toString('latin1');
      const m = /^\s*\{\s*"id"\s*:\s*"([A-Za-z0-9_-]{1,128})"/.exec(this.head);
      if (m) this.noteId(m[1]);
    }
    if (this.size + chunk.length <= MAX_JSON_BYTES) {
      this.parts.push(chunk);
      this.size += chunk.length;
    } else {
      this.size = Infinity;
      this.parts = [];
    }
    return chunk;
  }

  flush(): string {
    return '';
  }

  /** Reads the whole answer (when within the bound): its usage, and its id if the head had none. */
  finish(): void {
    if (this.size !== Infinity && this.parts.length > 0) {
      try {
        const o = JSON.parse(Buffer.concat(this.parts).toString('utf8')) as unknown;
        if (isObj(o)) {
          this.usage = responsesUsageOf(o.usage);
          const id = idOf(o.id);
          if (id && this.id === null) this.noteId(id);
        }
      } catch {
        // Not JSON: no usage read; the caller counts.
      }
    }
    this.parts = [];
  }

  private noteId(id: string): void {
    this.id = id;
    this.onId(id);
  }
}

/** An SSE stream of `POST /v1/responses` with `stream: true`, passed on chunk by chunk, unchanged. */
export class ResponsesSseReader implements BodyInspector {
  usage: ResponsesUsage | null = null;
  id: string | null = null;
  /** The final event's type (`response.completed`, …), once seen. */
  finalType: string | null = null;
  /** Output tokens counted from the text deltas passed on. */
  countedOutputTokens = 0;
  private carry = '';
  private skipping = false;
  private readonly decoder = new StringDecoder('utf8');
  constructor(private readonly onId: (id: string) => void) {}

  transform(chunk: Buffer): Buffer {
    this.read(this.decoder.write(chunk));
    return chunk;
  }

  flush(): string {
    this.read(this.decoder.end() + '\n\n');
    return '';
  }

  private read(text: string): void {
    let s = this.carry + text;
    // A CR ending the text may be half of a CRLF split between chunks: kept for the next one.
    const cr = s.endsWith('\r') ? '\r' : '';
    if (cr) s = s.slice(0, -1);
    if (s.includes('\r')) s = s.replace(/\r\n?/g, '\n');
    let start = 0;
    for (;;) {
      const end = s.indexOf('\n\n', start);
      if (end === -1) break;
      if (this.skipping) this.skipping = false;
      else if (end > start) this.event(s.slice(start, end));
      start = end + 2;
    }
    this.carry = s.slice(start) + cr;
    // An event this long is not read: passed on, and skipped up to its end.
    if (this.carry.length > MAX_EVENT_CHARS) {
      this.carry = '';
      this.skipping = true;
    }
  }

  private event(ev: string): void {
    let name = '';
    let data = '';
    for (const line of ev.split('\n')) {
      if (line.startsWith('event:')) name = line.slice(6).trim();
      else if (line.startsWith('data:')) data += (data ? '\n' : '') + line.slice(5).trimStart();
    }
    if (!data) return;
    // Only the events that matter are parsed; the type that counts is the parsed one.
    if (name !== '' && name !== 'response.created' && name !== 'response.output_text.delta' && !FINAL_TYPES.has(name)) return;
    let o: unknown;
    try {
      o = JSON.parse(data);
    } catch {
      return;
    }
    if (!isObj(o) || typeof o.type !== 'string') return;
    if (o.type === 'response.output_text.delta') {
      if (typeof o.delta === 'string') this.countedOutputTokens += countTokens(o.delta);
      return;
    }
    const response = obj(o.response);
    if (o.type === 'response.created' || FINAL_TYPES.has(o.type)) {
      const id = idOf(response?.id);
      if (id && this.id === null) {
        this.id = id;
        this.onId(id);
      }
    }
    if (FINAL_TYPES.has(o.type)) {
      this.finalType = o.type;
      this.usage = responsesUsageOf(response?.usage) ?? this.usage;
    }
  }
}

/** A count made whole (fractions up), non-negative and bounded. */
function count(v: unknown): number {
  const n = typeof v === 'number' ? v : typeof v === 'string' && /^\s*\d+(\.\d+)?\s*$/.test(v) ? Number(v) : NaN;
  if (Number.isNaN(n) || n < 0) return 0;
  return Math.min(MAX_COUNT, Math.ceil(n));
}

function isObj(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function obj(v: unknown): Record<string, unknown> | undefined {
  return isObj(v) ? v : undefined;
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
