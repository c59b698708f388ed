// The usage readers of the Responses API (`POST /v1/responses`): `ResponsesJsonReader` (a JSON
// answer) and `ResponsesSseReader` (a stream), the JSON and SSE readers of usage-readers.ts and
// sse-usage-reader.ts that also name the response's id as soon as it is read.
import { estimateTextTokens } from '../tokens.js';
import { itemIdsOf } from './responses-usage.js';
import { dataOf, LINE_END, splitEvents, SseUsageReader, withData } from './sse-usage-reader.js';
import { TOOL_ITEM_TYPES, toolCallsOfOutput, type BuiltInTool, type ToolCallCounts } from '../../../proto/lib/reported-prices.js';
import { withMemberText, withUsageCost } from './usage-cost.js';
import { isObj, JsonUsageReader, obj, serviceTierOf, tokenUsageOf, type UsagePricer } from './usage-readers.js';

/** Responses event types that end a response and carry its usage in `response.usage`. */
const RESPONSES_FINAL_TYPES: ReadonlySet<string> = new Set(['response.completed', 'response.incomplete', 'response.failed']);
/** Responses event types read whole (the others are only counted while no usage came). */
const RESPONSES_READ_TYPES: ReadonlySet<string> = new Set(['response.created', 'response.output_item.added', ...RESPONSES_FINAL_TYPES]);
/** Top-level members of a Responses JSON answer kept besides `usage`: the id, the status (a background response's), the output to count without usage and its tool calls, the tier it ran on. */
const RESPONSES_MEMBERS = Object.freeze(['id', 'status', 'output', 'service_tier']);
/**
 * A built-in tool call item's `type` member, as JSON writes it (any spacing). Only structure can hold
 * it: inside a JSON string every quote is escaped.
 */
const TOOL_ITEM_RE = /"type"\s*:\s*"(web_search_call|file_search_call|code_interpreter_call|image_generation_call)"/g;

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
  /** Tool call items seen in the bytes, for an output too large to keep (code interpreter counted per call). */
  private readonly scanned: ToolCallCounts = {};
  private scanTail = '';

  constructor(
    private readonly onId: (id: string) => void,
    pricer: UsagePricer | null = null,
    /** The ids of the `output` items, named as soon as the whole `output` is read (before it goes on). */
    private readonly onItems: ((ids: string[]) => void) | null = null,
  ) {
    super(RESPONSES_MEMBERS, pricer);
  }

  override facts(): ReturnType<JsonUsageReader['facts']> {
    const facts = super.facts();
    // The output too large to keep: its tool calls as the bytes showed them.
    if (!facts.toolCalls && this.memberBytes.has('output')) facts.toolCalls = { ...this.scanned };
    return facts;
  }

  override transform(chunk: Buffer): Buffer {
    this.scanTools(chunk);
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

  /** Counts the tool call items whose `type` ends in this chunk (a match across chunks counted once). */
  private scanTools(chunk: Buffer): void {
    const text = this.scanTail + chunk.toString('latin1');
    const from = this.scanTail.length;
    TOOL_ITEM_RE.lastIndex = 0;
    let m: RegExpExecArray | null;
    while ((m = TOOL_ITEM_RE.exec(text)) !== null) {
      if (m.index + m[0].length <= from) continue;
      const tool = (TOOL_ITEM_TYPES as Record<string, BuiltInTool>)[m[1]];
      this.scanned[tool] = (this.scanned[tool] ?? 0) + 1;
    }
    this.scanTail = text.slice(-64);
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
  /** Code interpreter containers whose session was counted. */
  private readonly containers = new Set<string>();

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
    if (o.type === 'response.output_item.added') {
      // Each item once, as it starts (small: an image's bytes come with its `done`); a container once.
      const item = obj(o.item);
      const container = item?.type === 'code_interpreter_call' && typeof item.container_id === 'string' ? item.container_id : '';
      if (container !== '' && this.containers.has(container)) return e;
      if (container !== '') this.containers.add(container);
      const calls = toolCallsOfOutput([item]);
      const sum: ToolCallCounts = { ...this.reported.toolCalls };
      for (const [tool, n] of Object.entries(calls) as Array<[BuiltInTool, number]>) sum[tool] = (sum[tool] ?? 0) + n;
      this.reported = { ...this.reported, toolCalls: sum };
      return e;
    }
    const response = obj(o.response);
    const id = responseIdOf(response?.id);
    if (id && this.id === null) {
      this.id = id;
      this.onId(id);
    }
    if (!RESPONSES_FINAL_TYPES.has(o.type) || !response) return e;
    this.finalType = o.type;
    this.onItems?.(itemIdsOf(response.output));
    const tier = serviceTierOf(response.service_tier);
    if (tier) this.reported = { ...this.reported, serviceTier: tier };
    // The final response's output, when it carries it, is the whole list of its items.
    if (Array.isArray(response.output) && response.output.length > 0) this.reported = { ...this.reported, toolCalls: toolCallsOfOutput(response.output) };
    const counts = tokenUsageOf(response.usage);
    if (!counts) return e;
    this.readUsage(counts);
    if (!this.pricer) return e;
    const micros = this.pricer(counts, this.reported);
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
