// The usage reader of an SSE stream (chat with `stream: true`): `SseUsageReader`, passing the stream
// on event by event and reading the usage chunk wherever it comes; see usage-readers.ts for the
// readers of the other protocols. Also the SSE framing helpers the Responses reader shares.
import { StringDecoder } from 'node:string_decoder';
import type { BodyInspector } from '../stream-proxy.js';
import { estimateOutputTokens } from '../tokens.js';
import type { ReportedFacts } from '../../../proto/lib/reported-prices.js';
import { withUsageCost } from './usage-cost.js';
import { isObj, serviceTierOf, tokenUsageOf, type TokenUsage, type UsagePricer } from './usage-readers.js';

/** The longest SSE event held back whole while it arrives; longer is passed on as it comes. */
const MAX_SSE_EVENT_CHARS = 1024 * 1024;
/** Deltas kept before they are counted: a stream whose usage may still come is counted in batches. */
const COUNT_BATCH_CHARS = 256 * 1024;

/** A blank line, in any of the line endings SSE allows (CRLF, LF, CR; a lone CR not followed by LF). */
const BLANK_LINE = /(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)/g;
export const LINE_END = /\r\n|\r|\n/;

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
  /** What the stream reported besides its tokens (the usage chunk's `service_tier`; the Responses reader adds tool calls). */
  protected reported: ReportedFacts = {};
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

  /** What the stream reported besides its tokens (service tier, built-in tool calls). */
  facts(): ReportedFacts {
    return this.reported;
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
        // Every chunk names the tier it runs on: a stream cut before its usage is billed at that one.
        const tier = obj ? serviceTierOf(obj.service_tier) : undefined;
        if (tier && tier !== this.reported.serviceTier) this.reported = { ...this.reported, serviceTier: tier };
        if (obj && counts) {
          this.readUsage(counts);
          if (this.strip && Array.isArray(obj.choices) && obj.choices.length === 0) continue;
          if (this.pricer) {
            const micros = this.pricer(counts, this.reported);
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

export function splitEvents(block: string): string[] {
  return block.includes('\r') ? block.split(BLANK_LINE) : block.split('\n\n');
}

/** An event's data: its `data:` lines joined (one leading space removed from each, as SSE says). */
export function dataOf(event: string): string | null {
  let data: string | null = null;
  for (const l of event.split(LINE_END)) {
    if (!l.startsWith('data:')) continue;
    const v = l.charCodeAt(5) === 32 ? l.slice(6) : l.slice(5);
    data = data === null ? v : `${data}\n${v}`;
  }
  return data;
}

/** The event with its data lines replaced by one carrying `data` (its other fields kept). */
export function withData(event: string, data: string): string {
  const others = event.split(LINE_END).filter((l) => !l.startsWith('data:'));
  others.push(`data: ${data}`);
  return others.join('\n');
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
