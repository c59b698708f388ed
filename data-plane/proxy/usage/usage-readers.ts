// The usage readers: one per upstream protocol, each reading what the upstream says it served from
// an answer going through, in memory bounded whatever the answer's length.
// - JSON answers (chat, embeddings, transcriptions): `JsonUsageReader` (this file), a streaming
//   scanner of the top-level object that keeps only the members it was asked for (`usage`, bounded),
//   wherever they come, and skips everything else as it passes.
// - SSE streams (chat with `stream: true`): `SseUsageReader` (sse-usage-reader.ts), event by event,
//   holding at most one incomplete event and a bounded batch of deltas still to count.
// - The Responses API (`POST /v1/responses`, responses-usage-readers.ts): `ResponsesJsonReader` (the
//   JSON reader, naming the response's id as soon as it is read) and `ResponsesSseReader` (the SSE
//   framing, events told apart by their parsed `type`, usage from the final event's `response.usage`).
// - Realtime events: `tokenUsageOf` on `response.done`'s usage (realtime/session.ts).
// Both readers can write the charge into the `usage` they pass on (`usage.cost`, USD, six decimals),
// from the same micro-dollars the request is recorded with (usage-cost.ts writes it). This file also
// holds what they share: reading an upstream's usage object (`tokenUsageOf`, `cleanCount`).
import type { TokenCounts } from '../../../proto/lib/money.js';
import { toolCallsOfOutput, type ReportedFacts } from '../../../proto/lib/reported-prices.js';
import type { BodyInspector } from '../stream-proxy.js';
import { usageWithCost } from './usage-cost.js';

/** The largest count one usage field may report (as request-context.ts MAX_TOKENS_PER_REQUEST). */
const MAX_COUNT = 100_000_000;

/** Usage as the gateway bills it: the token counts and the parts priced apart. */
export type TokenUsage = TokenCounts;

/** Prices a usage (micro-dollars) with what the answer reported besides (tier, tool calls), to write it into the answer. */
export type UsagePricer = (usage: TokenUsage, facts: ReportedFacts) => number;

/** The `service_tier` an answer (or its final event) reports, when it is a short string. */
export function serviceTierOf(v: unknown): string | undefined {
  return typeof v === 'string' && v.length > 0 && v.length <= 32 ? v : undefined;
}

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

export function isObj(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

export function obj(v: unknown): Record<string, unknown> | undefined {
  return isObj(v) ? v : undefined;
}

/** Bytes of one kept member (a `usage` object, a transcription's `duration`): far above any real one. */
const MAX_MEMBER_BYTES = 64 * 1024;
/** Bytes of `choices` (chat) or `output` (responses) kept to count tokens when the upstream reports no usage, and of a page of items (`data`) whose ids are recorded. */
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
 * A usage object read whole and not yet passed on: what follows it (a chat answer's `service_tier`
 * comes after its usage) is held too, bounded, so that its cost is written with every fact the
 * answer reports.
 */
interface PendingUsage {
  usage: Record<string, unknown>;
  counts: TokenUsage;
  rest: Buffer[];
  size: number;
}

const limitsOfMembers = new WeakMap<object, Map<string, number>>(); // per frozen members list (one per endpoint): built once, not per answer
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
  private pending: PendingUsage | null = null;

  constructor(
    members: Iterable<string> = [],
    private readonly pricer: UsagePricer | null = null,
  ) {
    let limits = limitsOfMembers.get(members);
    if (limits === undefined) {
      limits = new Map<string, number>([['usage', MAX_MEMBER_BYTES]]);
      for (const m of members) limits.set(m, m === 'choices' || m === 'output' || m === 'data' ? MAX_CHOICES_BYTES : MAX_MEMBER_BYTES);
      if (Array.isArray(members) && Object.isFrozen(members)) limitsOfMembers.set(members, limits);
    }
    this.limits = limits;
    this.passesThrough = pricer === null;
  }

  /** What the answer reports besides its tokens: its `service_tier` and the built-in tool calls of its `output` (when kept). */
  facts(): ReportedFacts {
    const facts: ReportedFacts = {};
    const tier = serviceTierOf(this.member('service_tier'));
    if (tier) facts.serviceTier = tier;
    const output = this.member('output');
    if (Array.isArray(output)) facts.toolCalls = toolCallsOfOutput(output);
    return facts;
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
    const p = this.pending;
    if (p) {
      if (this.ended) this.releaseUsage();
      else {
        const held = chunk.subarray(this.emitFrom, n);
        // Copied: a view would keep the whole chunk alive.
        if (held.length > 0) p.rest.push(Buffer.from(held));
        p.size += held.length;
        this.emitFrom = n;
        if (p.size > MAX_MEMBER_BYTES) this.releaseUsage();
      }
    }
    const out = this.out as Buffer[] | null;
    this.out = null;
    if (!out) return this.emitFrom === 0 ? chunk : this.emitFrom >= n ? EMPTY : chunk.subarray(this.emitFrom);
    if (this.emitFrom < n) out.push(chunk.subarray(this.emitFrom));
    return out.length === 1 ? out[0] : Buffer.concat(out);
  }

  flush(): Buffer {
    if (this.pending) {
      this.out = null;
      this.releaseUsage();
      const out = this.out as Buffer[] | null;
      this.out = null;
      return out ? Buffer.concat(out) : EMPTY;
    }
    // An answer that ended inside a held usage object (truncated): passed on as it came.
    const cap = this.capture;
    if (cap?.held && !cap.overflow) {
      this.capture = null;
      return Buffer.concat(cap.parts);
    }
    return EMPTY;
  }

  /** The pending usage goes out with its cost, priced with what the answer reported so far, and what was held after it. */
  private releaseUsage(): void {
    const p = this.pending!;
    this.pending = null;
    const micros = this.pricer!(p.counts, this.facts());
    this.chargedMicros = micros;
    this.emit(Buffer.from(usageWithCost(p.usage, micros)));
    for (const b of p.rest) this.emit(b);
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
      this.pending = { usage, counts, rest: [], size: 0 };
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
