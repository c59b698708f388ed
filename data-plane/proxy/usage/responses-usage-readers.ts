// The usage readers of the Responses API (`POST /v1/responses`): `ResponsesJsonReader` (a JSON
// answer) and `ResponsesSseReader` (a stream), the JSON and SSE readers of usage-readers.ts and
// sse-usage-reader.ts that also name the response's id as soon as it is read.
import { estimateTextTokens } from '../tokens.js';
import { itemIdsOf } from './responses-usage.js';
import { dataOf, LINE_END, splitEvents, SseUsageReader, withData } from './sse-usage-reader.js';
import { isObj, JsonUsageReader, obj, tokenUsageOf, withMemberText, withUsageCost, type UsagePricer } from './usage-readers.js';

/** Responses event types that end a response and carry its usage in `response.usage`. */
const RESPONSES_FINAL_TYPES: ReadonlySet<string> = new Set(['response.completed', 'response.incomplete', 'response.failed']);
/** Responses event types read whole (the others are only counted while no usage came). */
const RESPONSES_READ_TYPES: ReadonlySet<string> = new Set(['response.created', ...RESPONSES_FINAL_TYPES]);
/** Top-level members of a Responses JSON answer kept besides `usage`: the id, the status (a background response's), and the output to count without usage. */
const RESPONSES_MEMBERS = Object.freeze(['id', 'status', 'output']);

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
  private outputNamed = false;

  constructor(
    private readonly onId: (id: string) => void,
    pricer: UsagePricer | null = null,
    /** The ids of the `output` items, named as soon as the whole `output` is read (before it goes on). */
    private readonly onItems: ((ids: string[]) => void) | null = null,
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
    if (this.onItems && !this.outputNamed) {
      const output = this.member('output');
      if (output !== undefined) {
        this.outputNamed = true;
        this.onItems(itemIdsOf(output));
      }
    }
    return out;
  }

  /** The response's `status` (`queued`, `in_progress`, `completed`, …), or null. */
  status(): string | null {
    const v = this.member('status');
    return typeof v === 'string' ? v : null;
  }

  /** Output tokens of the answer (for one without usage), by the one estimator (tokens.ts): its output's text, or (too large to keep) its bytes / 4. */
  countedOutputTokens(): number {
    const output = this.member('output');
    if (!Array.isArray(output)) return Math.ceil((this.memberBytes.get('output') ?? 0) / 4);
    let n = 0;
    for (const item of output) {
      if (!isObj(item)) continue;
      if (typeof item.arguments === 'string') n += estimateTextTokens(item.arguments);
      for (const list of [item.content, item.summary]) {
        if (!Array.isArray(list)) continue;
        for (const p of list) if (isObj(p)) n += estimateTextTokens(typeof p.text === 'string' ? p.text : typeof p.refusal === 'string' ? p.refusal : '');
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
    /** The ids of the final response's `output` items, named before the final event goes on. */
    private readonly onItems: ((ids: string[]) => void) | null = null,
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
    this.onItems?.(itemIdsOf(response.output));
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
          if (isObj(o) && typeof o.type === 'string' && o.type.endsWith('.delta') && o.type !== 'response.audio.delta' && typeof o.delta === 'string') n += estimateTextTokens(o.delta);
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

/**
 * A JSON answer listing items (`data`: a page of a response's input items or a conversation's
 * items) or being one (`id`), passed through unchanged: the ids are named through `onIds` as soon as
 * the member is read, before the chunk holding its end goes on.
 */
export class ItemIdsReader extends JsonUsageReader {
  private named = false;

  constructor(
    private readonly memberName: 'data' | 'id',
    private readonly onIds: (ids: string[]) => void,
  ) {
    super([memberName]);
  }

  override transform(chunk: Buffer): Buffer {
    const out = super.transform(chunk);
    if (!this.named) {
      const v = this.member(this.memberName);
      if (v !== undefined) {
        this.named = true;
        this.onIds(this.memberName === 'data' ? itemIdsOf(v) : responseIdOf(v) ? [v as string] : []);
      }
    }
    return out;
  }
}
