// The built-in `demo` provider's Responses API: answers `POST /v1/responses` locally (JSON, or the
// Responses event stream with `stream: true`) with real token counts from the gateway's tokenizer,
// and keeps what it created in memory (bounded, for the retention of response-owners.ts) so the
// stored-response paths work offline too. `background: true` answers `queued` and completes the
// response DEMO_BACKGROUND_MS later (until then it reads `in_progress` and can be cancelled).
import { randomBytes } from 'node:crypto';
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { ForwardCall, ResponsesCall, ResponsesProvider, StoredCall, UpstreamRead } from './responses-provider.js';
import { RESPONSE_RETENTION_MS } from '../../state/response-owners.js';
import { GatewayError } from '../../errors.js';
import { countTokens, truncateTokens } from '../tokens.js';
import { countResponsesInputTokens, itemIdsOf, responsesInputText } from '../usage/responses-usage.js';
import { tokenUsageOf } from '../usage/usage-readers.js';
import { splitText } from './demo.js';
import { DemoConversations, demoItemsOf, demoItemsPage } from './demo-conversations.js';

const JSON_HEADERS = [['content-type', 'application/json']] as const;
const SSE_HEADERS = [
  ['content-type', 'text/event-stream; charset=utf-8'],
  ['cache-control', 'no-cache'],
] as const;
/** Responses the demo keeps at most (per node); the oldest go first. */
const MAX_STORED = 10_000;
/** How long a demo background response runs before it completes. */
export const DEMO_BACKGROUND_MS = 200;

interface Stored {
  response: Record<string, unknown>;
  inputItems: Array<Record<string, unknown>>;
  createdAtMs: number;
  /** A background response: its input tokens (what a cancel bills). */
  backgroundInputTokens?: number;
}

function isRunning(r: Record<string, unknown>): boolean {
  return r.status === 'queued' || r.status === 'in_progress';
}

/** A demo response: its events in order, the last the final one. */
export interface DemoResponse {
  id: string;
  final: Record<string, unknown>;
  events: Array<Record<string, unknown>>;
  promptTokens: number;
  outputTokens: number;
}

function sseEvent(e: Record<string, unknown>): string {
  return `event: ${String(e.type)}\ndata: ${JSON.stringify(e)}\n\n`;
}

function newId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString('hex')}`;
}

/** The reply text: derived from the last user text of the input. */
export function demoResponseText(input: unknown): string {
  let last = '';
  if (typeof input === 'string') last = input.trim();
  else if (Array.isArray(input)) {
    for (let i = input.length - 1; i >= 0 && !last; i--) {
      const item = input[i] as { role?: unknown } | null;
      if (item && (item.role === 'user' || item.role === undefined)) last = responsesInputText([item]).trim();
    }
  }
  if (!last) return 'Hello from the Tollgate demo model.';
  return `You said: "${last}". This is the Tollgate demo model answering.`;
}

export class DemoResponsesProvider implements ResponsesProvider {
  private readonly kept = new Map<string, Stored>();
  /** Conversations, compaction and counts (demo-conversations.ts). */
  private readonly conversations: DemoConversations;

  constructor(private readonly now: () => number = Date.now) {
    this.conversations = new DemoConversations(now, (id) => {
      const s = this.kept.get(id);
      return s && { inputItems: s.inputItems, output: (s.response.output as Array<Record<string, unknown>>) ?? [] };
    });
  }

  forward(call: ForwardCall): void {
    this.conversations.forward(call);
  }

  /**
   * One demo response to a request body: its id, its events in order (the last is the final one,
   * carrying the usage) and its token counts. Kept in memory when stored.
   */
  respond(body: Record<string, unknown>, modelId: string): DemoResponse {
    const id = newId('resp');
    const createdAtMs = this.now();
    const conv = typeof body.conversation === 'string' ? body.conversation : (body.conversation as { id?: unknown } | null)?.id;
    const convItems = typeof conv === 'string' ? this.conversations.itemsOf(conv) : [];
    // A conversation's items are read before the input.
    const promptTokens = countResponsesInputTokens(body) + (convItems.length > 0 ? countTokens(responsesInputText(convItems)) : 0);
    const max = typeof body.max_output_tokens === 'number' && Number.isInteger(body.max_output_tokens) && body.max_output_tokens > 0 ? body.max_output_tokens : Number.MAX_SAFE_INTEGER;
    const cut = truncateTokens(demoResponseText(body.input), max);
    const text = cut.text;
    const outputTokens = cut.tokens;
    const msgId = newId('msg');
    const part = { type: 'output_text', text, annotations: [] as unknown[] };
    const message = { id: msgId, type: 'message', status: cut.cut ? 'incomplete' : 'completed', role: 'assistant', content: [part] };
    const usage = {
      input_tokens: promptTokens,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: outputTokens,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: promptTokens + outputTokens,
    };
    const base = {
      id,
      object: 'response',
      created_at: Math.floor(createdAtMs / 1000),
      status: 'in_progress',
      error: null,
      incomplete_details: null as unknown,
      instructions: typeof body.instructions === 'string' ? body.instructions : null,
      max_output_tokens: max === Number.MAX_SAFE_INTEGER ? null : max,
      model: modelId,
      output: [] as unknown[],
      parallel_tool_calls: true,
      previous_response_id: typeof body.previous_response_id === 'string' ? body.previous_response_id : null,
      reasoning: { effort: null, summary: null },
      store: body.store !== false,
      temperature: typeof body.temperature === 'number' ? body.temperature : 1,
      text: { format: { type: 'text' } },
      tool_choice: 'auto',
      tools: [] as unknown[],
      top_p: typeof body.top_p === 'number' ? body.top_p : 1,
      truncation: 'disabled',
      usage: null as unknown,
      user: null,
      metadata: body.metadata && typeof body.metadata === 'object' ? body.metadata : {},
    };
    const final = { ...base, status: cut.cut ? 'incomplete' : 'completed', incomplete_details: cut.cut ? { reason: 'max_output_tokens' } : null, output: [message], usage };
    const inputItems = demoItemsOf(body.input);
    if (final.store || body.background === true) this.keep(id, { response: final, inputItems, createdAtMs });
    if (typeof conv === 'string') this.conversations.append(conv, [...inputItems, message]);
    const at = { item_id: msgId, output_index: 0, content_index: 0 };
    const events: Array<Record<string, unknown>> = [
      { type: 'response.created', response: base },
      { type: 'response.in_progress', response: base },
      { type: 'response.output_item.added', output_index: 0, item: { ...message, status: 'in_progress', content: [] } },
      { type: 'response.content_part.added', ...at, part: { type: 'output_text', text: '', annotations: [] } },
      ...splitText(text, 4).map((delta) => ({ type: 'response.output_text.delta', ...at, delta, logprobs: [] })),
      { type: 'response.output_text.done', ...at, text, logprobs: [] },
      { type: 'response.content_part.done', ...at, part },
      { type: 'response.output_item.done', output_index: 0, item: message },
      { type: cut.cut ? 'response.incomplete' : 'response.completed', response: final },
    ];
    events.forEach((e, i) => (e.sequence_number = i));
    return { id, final, events, promptTokens, outputTokens };
  }

  create(call: ResponsesCall): void {
    const { body, model, reply } = call;
    const r = this.respond(body, model.id);
    // The owner is recorded before the id goes out, and the request settled before the answer is
    // written (it is written in full, synchronously).
    call.recordOwner(r.id, '');
    call.recordItems(itemIdsOf(r.final.output), '');
    if (body.background === true && body.stream !== true) return this.startBackground(call, r);
    call.complete({ status: 200, promptTokens: r.promptTokens, completionTokens: r.outputTokens });
    if (body.stream !== true) return reply.send(200, JSON_HEADERS, JSON.stringify(r.final));
    reply.startStream(200, SSE_HEADERS);
    let out = '';
    for (let i = 0; i < r.events.length - 1; i++) out += sseEvent(r.events[i]);
    reply.write(out);
    reply.end(sseEvent(r.events[r.events.length - 1]));
  }

  /** Answers `queued` (no usage) and completes the response DEMO_BACKGROUND_MS later; its follower bills it. */
  private startBackground(call: ResponsesCall, r: DemoResponse): void {
    const s = this.kept.get(r.id)!;
    const final = { ...r.final, background: true };
    const queued = { ...final, status: 'queued', incomplete_details: null, output: [], usage: null };
    s.response = { ...queued, status: 'in_progress' };
    s.backgroundInputTokens = r.promptTokens;
    setTimeout(() => {
      if (isRunning(s.response)) s.response = final;
    }, DEMO_BACKGROUND_MS).unref();
    call.follow(r.id, 200, '');
    call.reply.send(200, JSON_HEADERS, JSON.stringify(queued));
  }

  retrieve(_model: ModelConfig, id: string, done: (r: UpstreamRead) => void): void {
    const s = this.kept.get(id);
    done(s ? readOf(s.response) : GONE);
  }

  cancel(_model: ModelConfig, id: string, done: (r: UpstreamRead) => void): void {
    const s = this.kept.get(id);
    if (s) this.cancelRunning(s);
    done(s ? readOf(s.response) : GONE);
  }

  /** A running background response ends `cancelled`, billed its input (no output was produced yet). */
  private cancelRunning(s: Stored): void {
    if (!isRunning(s.response)) return;
    const input = s.backgroundInputTokens ?? 0;
    s.response = { ...s.response, status: 'cancelled', usage: { input_tokens: input, input_tokens_details: { cached_tokens: 0 }, output_tokens: 0, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: input } };
  }

  stored(call: StoredCall): void {
    const s = this.kept.get(call.id);
    const reply = call.reply;
    if (!s || this.now() - s.createdAtMs >= RESPONSE_RETENTION_MS) {
      call.complete({ status: 404, promptTokens: 0, completionTokens: 0 });
      return reply.sendError(new GatewayError('NOT_FOUND', `No response found with id '${call.id}'.`, { param: null }));
    }
    // Only background responses can be cancelled (OpenAI's rule); one that ended answers as it is.
    if (call.action === 'cancel' && s.backgroundInputTokens !== undefined) {
      this.cancelRunning(s);
      call.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
      return reply.send(200, JSON_HEADERS, JSON.stringify(s.response));
    }
    if (call.action === 'cancel') {
      call.complete({ status: 400, promptTokens: 0, completionTokens: 0 });
      return reply.sendError(new GatewayError('INVALID_REQUEST', 'Only responses created with background=true can be cancelled.', { param: null }));
    }
    call.complete({ status: 200, promptTokens: 0, completionTokens: 0 });
    switch (call.action) {
      case 'response':
        if (call.method === 'DELETE') {
          this.kept.delete(call.id);
          call.forget();
          return reply.send(200, JSON_HEADERS, JSON.stringify({ id: call.id, object: 'response', deleted: true }));
        }
        return reply.send(200, JSON_HEADERS, JSON.stringify(s.response));
      case 'input_items': {
        const data = demoItemsPage(s.inputItems, call.query);
        call.recordOwned(itemIdsOf(data.data));
        return reply.send(200, JSON_HEADERS, JSON.stringify(data));
      }
    }
  }

  private keep(id: string, s: Stored): void {
    this.kept.set(id, s);
    while (this.kept.size > MAX_STORED) this.kept.delete(this.kept.keys().next().value as string);
  }
}

const GONE: UpstreamRead = Object.freeze({ httpStatus: 404, status: null, usage: null, outputTokens: 0 });

function readOf(response: Record<string, unknown>): UpstreamRead {
  return { httpStatus: 200, status: String(response.status), usage: tokenUsageOf(response.usage), outputTokens: 0, itemIds: itemIdsOf(response.output) };
}
