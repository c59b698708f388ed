// The usage readers: one per upstream protocol, each reading what the upstream says it served from
// an answer going through, in memory bounded whatever the answer's length.
// - JSON answers (chat, embeddings, transcriptions): `JsonUsageReader`, a streaming scanner of the
//   top-level object that keeps only the members it was asked for (`usage`, bounded), wherever they
//   come, and skips everything else as it passes.
// - SSE streams (chat with `stream: true`): `SseUsageReader`, event by event, holding at most one
//   incomplete event and a bounded batch of deltas still to count.
// - The Responses API (`POST /v1/responses`): `ResponsesJsonReader` (the JSON reader, naming the
//   response's id as soon as it is read) and `ResponsesSseReader` (the SSE framing above, events told
//   apart by their parsed `type`, usage from the final event's `response.usage`).
// - Realtime events: `tokenUsageOf` on `response.done`'s usage (realtime/session.ts).
// Both readers can write the charge into the `usage` they pass on (`usage.cost`, USD, six decimals),
// from the same micro-dollars the request is recorded with.
import { StringDecoder } from 'node:string_decoder';
import { usdNumberText, type TokenCounts } from '../../proto/lib/money.js';
import type { BodyInspector } from './stream-proxy.js';
import { countTokens, estimateOutputTokens } from './tokens.js';

/** The largest count one usage field may report (as request-context.ts MAX_TOKENS_PER_REQUEST). */
const MAX_COUNT = 100_000_000;

/** Usage as the gateway bills it: the token counts and the parts priced apart. */
export type TokenUsage = TokenCounts;

/** Prices a usage (micro-dollars), to write it into the answer; null writes nothing. */
export type UsagePricer = (usage: TokenUsage) => number;

/**
 * The token counts of an upstream's `usage` object, or null when it holds no token counts (a
 * transcription's `{type: "duration"}`, anything not an object). Reads every shape an
 * OpenAI-compatible upstream uses:
 * - chat: `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.{cached_tokens, audio_tokens,
 *   cache_write_tokens}`, `completion_tokens_details.audio_tokens`;
 * - responses and realtime: `input_tokens`, `output_tokens`, `input_tokens_details` /
 *   `input_token_details` (`cached_tokens`, `audio_tokens`, `cached_tokens_details.audio_tokens`),
 *   `output_tokens_details` / `output_token_details` (`audio_tokens`);
 * - Anthropic style beside `input_tokens`: `cache_read_input_tokens` and `cache_creation_input_tokens`
 *   are not part of `input_tokens` and are added to it; beside `prompt_tokens` (as OpenAI-compatible
 *   proxies report them) they are parts of it.
 * Reasoning tokens (`completion_tokens_details` / `output_tokens_details`.`reasoning_tokens`) are
 * output tokens: they are inside `completion_tokens` / `output_tokens`; an upstream reporting more
 * reasoning than output, or a `total_tokens` above input and output together, is billed the rest as
 * output.
 */
export function tokenUsageOf(u: unknown): TokenUsage | null {
  if (!isObj(u)) return null;
  const chatStyle = u.prompt_tokens !== undefined || u.completion_tokens !== undefined;
  if (!chatStyle && u.input_tokens === undefined && u.output_tokens === undefined) return null;
  let prompt = cleanCount(chatStyle ? u.prompt_tokens : u.input_tokens, chatStyle ? 'usage.prompt_tokens' : 'usage.input_tokens');
  let completion = cleanCount(chatStyle ? u.completion_tokens : u.output_tokens, chatStyle ? 'usage.completion_tokens' : 'usage.output_tokens');
  const pd = obj(u.prompt_tokens_details) ?? obj(u.input_tokens_details) ?? obj(u.input_token_details);
  const cd = obj(u.completion_tokens_details) ?? obj(u.output_tokens_details) ?? obj(u.output_token_details);
  const cacheRead = cleanCount(u.cache_read_input_tokens, 'usage.cache_read_input_tokens');
  const cacheCreate = cleanCount(u.cache_creation_input_tokens, 'usage.cache_creation_input_tokens');
  if (!chatStyle) prompt = Math.min(MAX_COUNT, prompt + cacheRead + cacheCreate);
  const reasoning = cleanCount(cd?.reasoning_tokens, 'usage reasoning_tokens');
  if (reasoning > completion) completion = reasoning;
  const total = u.total_tokens === undefined ? 0 : cleanCount(u.total_tokens, 'usage.total_tokens');
  if (total > prompt + completion) completion = Math.min(MAX_COUNT, total - prompt);
  const out: TokenUsage = { promptTokens: prompt, completionTokens: completion };
  const cached = Math.max(cleanCount(pd?.cached_tokens, 'usage cached_tokens'), cacheRead);
  if (cached > 0) out.cachedPromptTokens = cached;
  const write = Math.max(cleanCount(pd?.cache_write_tokens, 'usage cache_write_tokens'), cleanCount(pd?.cache_creation_tokens, 'usage cache_creation_tokens'), cacheCreate);
  if (write > 0) out.cacheWriteTokens = write;
  const audioIn = cleanCount(pd?.audio_tokens, 'usage input audio_tokens');
  if (audioIn > 0) out.audioPromptTokens = audioIn;
  const cachedAudio = cleanCount(obj(pd?.cached_tokens_details)?.audio_tokens, 'usage cached audio_tokens');
  if (cachedAudio > 0) out.cachedAudioPromptTokens = cachedAudio;
  const audioOut = cleanCount(cd?.audio_tokens, 'usage output audio_tokens');
  if (audioOut > 0) out.audioCompletionTokens = audioOut;
  return out;
}

let badCountsLogged = 0;

/**
 * A count an upstream reported (usage tokens, audio units), made a safe integer at the boundary: a
 * fraction is rounded up, a numeric string read, anything else (NaN, negative, an object) is 0, and a
 * huge value is clamped; absent or null is 0. Whatever is changed is logged (bounded), so the operator
 * sees an upstream's odd usage and nothing it sends can make a report unencodable.
 */
export function cleanCount(v: unknown, what: string, requestId = ''): number {
  if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v <= MAX_COUNT) return v;
  if (v === undefined || v === null) return 0;
  let n = typeof v === 'number' ? v : typeof v === 'string' && /^\s*\d+(\.\d+)?\s*$/.test(v) ? Number(v) : NaN;
  if (Number.isNaN(n) || n < 0) n = 0;
  const clean = Math.min(MAX_COUNT, Math.ceil(n));
  if (badCountsLogged++ < 100) {
    const shown = typeof v === 'string' ? JSON.stringify(v.slice(0, 40)) : typeof v === 'number' ? String(v) : typeof v;
    console.error(`data plane: ${requestId ? `request ${requestId}: ` : ''}upstream reported ${what} as ${shown}; recorded as ${clean}`);
  }
  return clean;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function obj(v: unknown): Record<string, unknown> | undefined {
  return isObj(v) ? v : undefined;
}

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

/** Bytes of one kept member (a `usage` object, a transcription's `duration`): far above any real one. */
const MAX_MEMBER_BYTES = 64 * 1024;
/** Bytes of `choices` (chat) or `output` (responses) kept to count tokens when the upstream reports no usage. */
const MAX_CHOICES_BYTES = 1024 * 1024;

const enum Expect {
  Key,
  Colon,
  Value,
  Comma,
}

/** A top-level member being kept, from its value's first byte. */
interface Capture {
  name: string;
  parts: Buffer[];
  size: number;
  max: number;
  overflow: boolean;
  /** The usage object held back to be passed on with its cost (a pricer was given). */
  held: boolean;
}

/**
 * Reads the top-level members it is asked for (`usage` always) from a JSON answer as it streams
 * through, wherever they stand in the object, keeping only their bytes (each bounded) and a few
 * integers of scanner state: O(1) memory for an answer of any length. Strings are skipped by the
 * native indexOf of their closing quote. With a pricer, the `usage` object is held back from its first
 * byte to its last (bounded) and passed on with `cost` written in; the answer is then no longer
 * passed through unchanged (it goes out chunked).
 */
export class JsonUsageReader implements BodyInspector {
  readonly passesThrough: boolean;
  /** The last `usage` member's token counts; null when none (or none with token counts). */
  usage: TokenUsage | null = null;
  /** What the usage was charged, when a pricer wrote it into the answer. */
  chargedMicros: number | null = null;
  /** Bytes of each asked-for member's value seen (the whole value, kept or not). */
  readonly memberBytes = new Map<string, number>();
  private readonly kept = new Map<string, string>();
  private readonly limits: ReadonlyMap<string, number>;
  // Scanner state.
  private depth = 0;
  private inString = false;
  /** An odd run of backslashes ended the last chunk inside a string: its next byte is escaped. */
  private escape = false;
  private expect = Expect.Key;
  private inKey = false;
  private keyText = '';
  private key = '';
  private primitive = false;
  private stringValue = false;
  private capture: Capture | null = null;
  /** Where the capture's bytes start in the current chunk (0 when it began in an earlier one). */
  private captureFrom = 0;
  private ended = false;
  // Output of the current chunk: what is passed on, and from where the rest starts.
  private out: Buffer[] | null = null;
  private emitFrom = 0;

  constructor(
    members: Iterable<string> = [],
    private readonly pricer: UsagePricer | null = null,
  ) {
    const limits = new Map<string, number>([['usage', MAX_MEMBER_BYTES]]);
    for (const m of members) limits.set(m, m === 'choices' || m === 'output' ? MAX_CHOICES_BYTES : MAX_MEMBER_BYTES);
    this.limits = limits;
    this.passesThrough = pricer === null;
  }

  /** A kept member's value, parsed; undefined when absent, too large or not JSON. */
  member(name: string): unknown {
    const text = this.kept.get(name);
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text);
    } catch {
      return undefined;
    }
  }

  /** Bytes this reader holds now (kept members and the member being kept). */
  retainedBytes(): number {
    let n = (this.capture?.size ?? 0) + this.keyText.length;
    for (const v of this.kept.values()) n += v.length;
    return n;
  }

  transform(chunk: Buffer): Buffer {
    if (this.ended) return chunk;
    this.out = null;
    this.emitFrom = 0;
    this.captureFrom = 0;
    const n = chunk.length;
    let i = 0;
    while (i < n && !this.ended) {
      if (this.inString) {
        const q = chunk.indexOf(34, i);
        if (q < 0) {
          this.escape = oddRun(chunk, i, n, this.escape);
          if (this.inKey && this.keyText.length < 256) this.keyText += chunk.toString('latin1', i, Math.min(n, i + 256));
          break;
        }
        const escaped = oddRun(chunk, i, q, this.escape);
        this.escape = false;
        if (this.inKey && this.keyText.length < 256) this.keyText += chunk.toString('latin1', i, Math.min(q + 1, i + 256));
        i = q + 1;
        if (escaped) continue;
        this.inString = false;
        if (this.inKey) {
          this.inKey = false;
          this.key = keyOf(this.keyText);
          this.keyText = '';
          this.expect = Expect.Colon;
        } else if (this.stringValue) {
          this.stringValue = false;
          this.endValue(chunk, i);
        }
        continue;
      }
      const c = chunk[i];
      if (this.depth > 1) {
        // Inside a member's value: only strings and brackets matter.
        if (c === 34) this.inString = true;
        else if (c === 123 || c === 91) this.depth++;
        else if ((c === 125 || c === 93) && --this.depth === 1) this.endValue(chunk, i + 1);
        i++;
        continue;
      }
      if (this.depth === 1) {
        if (this.primitive && (c === 44 || c === 125 || c === 32 || c === 10 || c === 13 || c === 9)) {
          this.primitive = false;
          this.endValue(chunk, i);
        }
        if (c === 34) {
          this.inString = true;
          if (this.expect === Expect.Key) {
            this.inKey = true;
            this.keyText = '"';
          } else if (this.expect === Expect.Value) {
            this.stringValue = true;
            this.startValue(chunk, i);
          }
        } else if (c === 123 || c === 91) {
          if (this.expect === Expect.Value) this.startValue(chunk, i);
          this.depth++;
        } else if (c === 125) {
          this.depth = 0;
          this.ended = true;
        } else if (c === 58) {
          this.expect = Expect.Value;
        } else if (c === 44) {
          this.expect = Expect.Key;
        } else if (this.expect === Expect.Value && c !== 32 && c !== 10 && c !== 13 && c !== 9) {
          this.primitive = true;
          this.startValue(chunk, i);
        }
        i++;
        continue;
      }
      // Before the top-level object.
      if (c === 123) {
        this.depth = 1;
        this.expect = Expect.Key;
      } else if (c !== 32 && c !== 10 && c !== 13 && c !== 9) {
        // Not an object: nothing to read in it.
        this.ended = true;
      }
      i++;
    }
    // The rest of the chunk: kept by a capture (and held, for a usage object), else passed on.
    const cap = this.capture;
    if (cap) {
      this.keep(chunk.subarray(this.captureFrom, n));
      if (cap.held) {
        this.emitFrom = n;
        if (cap.overflow) {
          // Too large to rewrite: what was held is passed on as it came.
          cap.held = false;
        }
      }
    }
    const out = this.out as Buffer[] | null;
    this.out = null;
    if (!out) return this.emitFrom === 0 ? chunk : this.emitFrom >= n ? EMPTY : chunk.subarray(this.emitFrom);
    if (this.emitFrom < n) out.push(chunk.subarray(this.emitFrom));
    return out.length === 1 ? out[0] : Buffer.concat(out);
  }

  flush(): Buffer {
    // An answer that ended inside a held usage object (truncated): passed on as it came.
    const cap = this.capture;
    if (cap?.held && !cap.overflow) {
      this.capture = null;
      return Buffer.concat(cap.parts);
    }
    return EMPTY;
  }

  private emit(b: Buffer): void {
    if (b.length > 0) (this.out ??= []).push(b);
  }

  private startValue(chunk: Buffer, at: number): void {
    this.expect = Expect.Comma;
    const max = this.limits.get(this.key);
    if (max === undefined) return;
    const held = this.key === 'usage' && this.pricer !== null && chunk[at] === 123;
    this.capture = { name: this.key, parts: [], size: 0, max, overflow: false, held };
    this.captureFrom = at;
    this.memberBytes.set(this.key, 0);
    if (held) {
      // Held from its first byte: what came before it is passed on.
      this.emit(chunk.subarray(this.emitFrom, at));
      this.emitFrom = at;
    }
  }

  private keep(bytes: Buffer): void {
    const cap = this.capture!;
    this.memberBytes.set(cap.name, (this.memberBytes.get(cap.name) ?? 0) + bytes.length);
    if (cap.overflow || bytes.length === 0) return;
    if (cap.size + bytes.length > cap.max) {
      cap.overflow = true;
      if (cap.held) {
        for (const p of cap.parts) this.emit(p);
        this.emit(bytes);
      }
      cap.parts = [];
      cap.size = 0;
      return;
    }
    // Copied: a view would keep the whole chunk alive.
    cap.parts.push(Buffer.from(bytes));
    cap.size += bytes.length;
  }

  private endValue(chunk: Buffer, end: number): void {
    const cap = this.capture;
    if (!cap) return;
    const wasHeld = cap.held && !cap.overflow;
    this.keep(chunk.subarray(this.captureFrom, end));
    this.capture = null;
    this.captureFrom = 0;
    if (cap.overflow) {
      this.kept.delete(cap.name);
      if (cap.held) this.emitFrom = end;
      return;
    }
    const whole = cap.parts.length === 1 ? cap.parts[0] : Buffer.concat(cap.parts);
    this.kept.set(cap.name, whole.toString('utf8'));
    if (cap.name !== 'usage') return;
    const usage = this.member('usage');
    this.usage = tokenUsageOf(usage) ?? this.usage;
    if (!wasHeld) return;
    const counts = tokenUsageOf(usage);
    if (counts && isObj(usage)) {
      const micros = this.pricer!(counts);
      this.chargedMicros = micros;
      this.emit(Buffer.from(usageWithCost(usage, micros)));
    } else {
      this.emit(whole);
    }
    this.emitFrom = end;
  }
}

const EMPTY = Buffer.alloc(0);

/** Whether the run of backslashes ending [from, to) is odd, counting one carried over when the run is the whole range. */
function oddRun(chunk: Buffer, from: number, to: number, carried: boolean): boolean {
  let b = to - 1;
  while (b >= from && chunk[b] === 92) b--;
  const run = to - 1 - b + (b < from && carried ? 1 : 0);
  return run % 2 === 1;
}

/** A member name from its quoted text, quotes included (escapes decoded); '' when it is not one. */
function keyOf(quoted: string): string {
  if (!quoted.includes('\\')) return quoted.slice(1, -1);
  try {
    const v = JSON.parse(quoted) as unknown;
    return typeof v === 'string' ? v : '';
  } catch {
    return '';
  }
}

/** The longest SSE event held back whole while it arrives; longer is passed on as it comes. */
const MAX_SSE_EVENT_CHARS = 1024 * 1024;
/** Deltas kept before they are counted: a stream whose usage may still come is counted in batches. */
const COUNT_BATCH_CHARS = 256 * 1024;

/** A blank line, in any of the line endings SSE allows (CRLF, LF, CR; a lone CR not followed by LF). */
const BLANK_LINE = /(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)/g;
const LINE_END = /\r\n|\r|\n/;

/**
 * Passes an SSE stream on event by event (an event goes out as soon as it is complete), reads the
 * usage chunk wherever it comes (last, after any amount of content, as OpenAI sends it), and drops it
 * (and the `"usage":null` fields) when only the gateway asked for usage. Holds at most one incomplete
 * event (bounded) and a bounded batch of deltas not yet counted: memory per stream is bounded
 * whatever its length. With a pricer, the usage chunk passed on carries `usage.cost`.
 */
export class SseUsageReader implements BodyInspector {
  usage: TokenUsage | null = null;
  /** What the usage was charged, when a pricer wrote it into the stream. */
  chargedMicros: number | null = null;
  /** The incomplete event, in the pieces it came in, its length, and its last characters. */
  private carry: string[] = [];
  private carryChars = 0;
  private tail = '';
  private readonly decoder = new StringDecoder('utf8');
  private pending: string[] = [];
  private pendingChars = 0;
  private counted = 0;

  constructor(
    private readonly strip: boolean,
    protected readonly pricer: UsagePricer | null = null,
  ) {}

  transform(chunk: Buffer): string {
    const piece = this.decoder.write(chunk);
    // The carry holds no blank line: only its last characters and the new text are searched, and it is
    // kept in pieces, so an event that arrives in many chunks costs its length once, not once per chunk.
    const probe = this.tail + piece;
    const at = lastEventEnd(probe);
    if (at === -1) {
      this.carryChars += piece.length;
      if (this.carryChars > MAX_SSE_EVENT_CHARS) {
        // An "event" this long is not one: passed on as it is, rather than held without end.
        const text = this.takeCarry() + piece;
        this.note(text);
        return text;
      }
      if (piece.length > 0) this.carry.push(piece);
      this.tail = probe.slice(-3);
      return '';
    }
    const end = this.carryChars - this.tail.length + at;
    const text = this.takeCarry() + piece;
    const rest = text.slice(end);
    if (rest.length > 0) this.carry.push(rest);
    this.carryChars = rest.length;
    this.tail = rest.slice(-3);
    return this.events(text.slice(0, end));
  }

  flush(): string {
    const rest = this.takeCarry() + this.decoder.end();
    return rest ? this.events(rest) : '';
  }

  private takeCarry(): string {
    const text = this.carry.length === 1 ? this.carry[0] : this.carry.join('');
    this.carry = [];
    this.carryChars = 0;
    this.tail = '';
    return text;
  }

  /** Characters this reader holds now: the incomplete event and the deltas not yet counted. */
  retainedBytes(): number {
    return this.carryChars + this.pendingChars;
  }

  /** Completion tokens counted from the streamed deltas (for a stream without usage). */
  countedCompletionTokens(): number {
    return this.counted + this.countDeltas(this.pending);
  }

  /** Output tokens the deltas of some events carry (chat chunks). */
  protected countDeltas(blocks: readonly string[]): number {
    return countDeltaTokens(blocks);
  }

  /** The usage was read: no more deltas to count. */
  protected readUsage(counts: TokenUsage): void {
    this.usage = counts;
    this.pending = [];
    this.pendingChars = 0;
  }

  /** Complete events, passed on as they are to go out. */
  protected events(block: string): string {
    // Nothing to read or strip (`"usage":null` fields included) in a block without "usage".
    if (!block.includes('"usage"')) {
      this.note(block);
      return block;
    }
    let out = '';
    for (const ev of splitEvents(block)) {
      if (ev.length === 0) continue;
      let e = ev;
      if (e.includes('"usage"')) {
        const data = dataOf(e);
        let obj: Record<string, unknown> | null = null;
        try {
          const v = data ? (JSON.parse(data) as unknown) : null;
          obj = isObj(v) ? v : null;
        } catch {
          obj = null;
        }
        const counts = obj ? tokenUsageOf(obj.usage) : null;
        if (obj && counts) {
          this.readUsage(counts);
          if (this.strip && Array.isArray(obj.choices) && obj.choices.length === 0) continue;
          if (this.pricer) {
            const micros = this.pricer(counts);
            this.chargedMicros = micros;
            e = withData(e, withUsageCost(obj, micros));
          }
        }
        if (this.strip) e = e.replace(/,"usage":null|"usage":null,?/g, '');
      }
      this.note(e);
      out += e + '\n\n';
    }
    return out;
  }

  /** Keeps deltas to count while no usage came, counting them in batches (bounded). */
  protected note(block: string): void {
    if (this.usage !== null) return;
    this.pending.push(block);
    this.pendingChars += block.length;
    if (this.pendingChars > COUNT_BATCH_CHARS) {
      this.counted += this.countDeltas(this.pending);
      this.pending = [];
      this.pendingChars = 0;
    }
  }
}

/** The index right after the last blank line of `text`, or -1 (a CR at the very end may be half a CRLF). */
function lastEventEnd(text: string): number {
  if (!text.includes('\r')) {
    const at = text.lastIndexOf('\n\n');
    return at === -1 ? -1 : at + 2;
  }
  let end = -1;
  BLANK_LINE.lastIndex = 0;
  let m: RegExpExecArray | null;
  while ((m = BLANK_LINE.exec(text)) !== null) {
    const e = m.index + m[0].length;
    if (e === text.length && text.charCodeAt(e - 1) === 13) break;
    end = e;
  }
  return end;
}

function splitEvents(block: string): string[] {
  return block.includes('\r') ? block.split(BLANK_LINE) : block.split('\n\n');
}

/** An event's data: its `data:` lines joined (one leading space removed from each, as SSE says). */
function dataOf(event: string): string | null {
  let data: string | null = null;
  for (const l of event.split(LINE_END)) {
    if (!l.startsWith('data:')) continue;
    const v = l.charCodeAt(5) === 32 ? l.slice(6) : l.slice(5);
    data = data === null ? v : `${data}\n${v}`;
  }
  return data;
}

/** The event with its data lines replaced by one carrying `data` (its other fields kept). */
function withData(event: string, data: string): string {
  const others = event.split(LINE_END).filter((l) => !l.startsWith('data:'));
  others.push(`data: ${data}`);
  return others.join('\n');
}

/** An answer's (or a chunk's) JSON with `usage.cost` written in (key order kept). */
export function withUsageCost(obj: Record<string, unknown>, micros: number): string {
  return withMemberText(obj, 'usage', usageWithCost(obj.usage as Record<string, unknown>, micros));
}

/** `obj` as JSON with member `key`'s value replaced by the JSON `text` (key order kept). */
function withMemberText(obj: Record<string, unknown>, key: string, text: string): string {
  const mark = `\u0000${key}`;
  // A function: a replacement string would read `$&` and the like in `text` as patterns.
  return JSON.stringify({ ...obj, [key]: mark }).replace(JSON.stringify(mark), () => text);
}

/** Tokens the deltas of some SSE events carry, by the one output estimator: content, refusals, reasoning, tool calls. */
function countDeltaTokens(blocks: readonly string[]): number {
  let n = 0;
  for (const block of blocks) {
    for (const ev of splitEvents(block)) {
      const data = dataOf(ev);
      if (!data || data === '[DONE]') continue;
      try {
        // One estimator for what was received (tokens.ts): text, refusals, reasoning, tool calls.
        n += estimateOutputTokens(JSON.parse(data));
      } catch {
        // not JSON: not a content event
      }
    }
  }
  return n;
}

/** Responses event types that end a response and carry its usage in `response.usage`. */
const RESPONSES_FINAL_TYPES: ReadonlySet<string> = new Set(['response.completed', 'response.incomplete', 'response.failed']);
/** Responses event types read whole (the others are only counted while no usage came). */
const RESPONSES_READ_TYPES: ReadonlySet<string> = new Set(['response.created', ...RESPONSES_FINAL_TYPES]);
/** Top-level members of a Responses JSON answer kept besides `usage`: the id, and the output to count without usage. */
const RESPONSES_MEMBERS = Object.freeze(['id', 'output']);

/** A response id as the upstream names it, or null. */
function responseIdOf(v: unknown): string | null {
  return typeof v === 'string' && v.length > 0 && v.length <= 128 ? v : null;
}

/**
 * A JSON answer of `POST /v1/responses`: the JSON reader (any size, bounded; `usage.cost` written in
 * with a pricer) that also names the response's `id` (through `onId`) as soon as it is read, before
 * the chunk holding its end is passed on, and keeps `output` (bounded) to count an answer without usage.
 */
export class ResponsesJsonReader extends JsonUsageReader {
  id: string | null = null;

  constructor(
    private readonly onId: (id: string) => void,
    pricer: UsagePricer | null = null,
  ) {
    super(RESPONSES_MEMBERS, pricer);
  }

  override transform(chunk: Buffer): Buffer {
    const out = super.transform(chunk);
    if (this.id === null) {
      const id = responseIdOf(this.member('id'));
      if (id) {
        this.id = id;
        this.onId(id);
      }
    }
    return out;
  }

  /** Output tokens of the answer (for one without usage): its output's text, or (too large to keep) its bytes / 4. */
  countedOutputTokens(): number {
    const output = this.member('output');
    if (!Array.isArray(output)) return Math.ceil((this.memberBytes.get('output') ?? 0) / 4);
    let n = 0;
    for (const item of output) {
      if (!isObj(item)) continue;
      if (typeof item.arguments === 'string') n += countTokens(item.arguments);
      for (const list of [item.content, item.summary]) {
        if (!Array.isArray(list)) continue;
        for (const p of list) if (isObj(p)) n += countTokens(typeof p.text === 'string' ? p.text : typeof p.refusal === 'string' ? p.refusal : '');
      }
    }
    return n;
  }
}

/**
 * An SSE stream of `POST /v1/responses` with `stream: true`, framed as `SseUsageReader` frames chat
 * (event by event, bounded). Events are told apart by their parsed `type`, never by a substring (an
 * `event:` name only spares parsing the events not read): `response.created` names the id (through
 * `onId`, before the event goes on), `response.completed`, `response.incomplete` and `response.failed`
 * carry the usage in `response.usage` (with a pricer, passed on with `cost` written in); text deltas
 * are counted for a stream that ends without one.
 */
export class ResponsesSseReader extends SseUsageReader {
  id: string | null = null;
  /** The final event's type (`response.completed`, …), once seen. */
  finalType: string | null = null;

  constructor(
    private readonly onId: (id: string) => void,
    pricer: UsagePricer | null = null,
  ) {
    super(false, pricer);
  }

  protected override events(block: string): string {
    let out = '';
    for (const ev of splitEvents(block)) {
      if (ev.length === 0) continue;
      const e = this.responsesEvent(ev);
      this.note(e);
      out += e + '\n\n';
    }
    return out;
  }

  private responsesEvent(e: string): string {
    const name = eventNameOf(e);
    if (name !== '' && !RESPONSES_READ_TYPES.has(name)) return e;
    const data = dataOf(e);
    if (data === null) return e;
    let o: unknown;
    try {
      o = JSON.parse(data);
    } catch {
      return e;
    }
    if (!isObj(o) || typeof o.type !== 'string' || !RESPONSES_READ_TYPES.has(o.type)) return e;
    const response = obj(o.response);
    const id = responseIdOf(response?.id);
    if (id && this.id === null) {
      this.id = id;
      this.onId(id);
    }
    if (!RESPONSES_FINAL_TYPES.has(o.type) || !response) return e;
    this.finalType = o.type;
    const counts = tokenUsageOf(response.usage);
    if (!counts) return e;
    this.readUsage(counts);
    if (!this.pricer) return e;
    const micros = this.pricer(counts);
    this.chargedMicros = micros;
    return withData(e, withMemberText(o, 'response', withUsageCost(response, micros)));
  }

  /** Output tokens the text deltas carry (output text, refusals, reasoning, tool-call arguments, transcripts). */
  protected override countDeltas(blocks: readonly string[]): number {
    let n = 0;
    for (const block of blocks) {
      for (const ev of splitEvents(block)) {
        const data = dataOf(ev);
        if (!data) continue;
        try {
          const o = JSON.parse(data) as unknown;
          if (isObj(o) && typeof o.type === 'string' && o.type.endsWith('.delta') && o.type !== 'response.audio.delta' && typeof o.delta === 'string') n += countTokens(o.delta);
        } catch {
          // not JSON: not a delta
        }
      }
    }
    return n;
  }
}

/** An event's `event:` name ('' when it has none). */
function eventNameOf(event: string): string {
  if (!event.startsWith('event:') && !event.includes('\nevent:') && !event.includes('\revent:')) return '';
  for (const l of event.split(LINE_END)) if (l.startsWith('event:')) return l.slice(6).trim();
  return '';
}
