// The built-in `demo` provider's Conversations API, compaction and input-token counts, in memory
// (bounded), so the embedded `npm start` answers them with no network: conversations and their items
// (a response created with `conversation` adds its input and output to it), `POST
// /v1/responses/compact` (the user messages kept and one `compaction` item, usage counted by the
// gateway's tokenizer) and `POST /v1/responses/input_tokens`.
import { randomBytes } from 'node:crypto';
import { GatewayError } from '../../errors.js';
import type { ResponseSink } from '../response-sink.js';
import { countTokens } from '../tokens.js';
import { countResponsesInputTokens, itemIdsOf, responsesInputText } from '../usage/responses-usage.js';
import type { ForwardCall } from './responses-provider.js';

type Obj = Record<string, unknown>;
const JSON_HEADERS = [['content-type', 'application/json']] as const;
/** Conversations the demo keeps at most (per node); the oldest go first. */
const MAX_CONVERSATIONS = 10_000;

interface Conversation {
  id: string;
  createdAt: number;
  metadata: unknown;
  items: Obj[];
}

/** What the demo knows of one of its stored responses: its input items and its output. */
export interface DemoStoredItems {
  inputItems: Obj[];
  output: Obj[];
}

export function newDemoId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString('hex')}`;
}

/** Input as stored items, each with an id. */
export function demoItemsOf(input: unknown): Obj[] {
  const items: unknown[] = typeof input === 'string' ? [{ type: 'message', role: 'user', content: input }] : Array.isArray(input) ? input : [];
  return items.map((x) => {
    const it = { ...(x as Obj) };
    if (it.type === undefined && it.role !== undefined) it.type = 'message';
    if (typeof it.content === 'string') it.content = [{ type: 'input_text', text: it.content }];
    return { id: newDemoId('msg'), ...it };
  });
}

/** A page of items as the API lists them: `order` (default desc), `after`, `limit` (default 20). */
export function demoItemsPage(items: Obj[], query: string): Obj {
  const q = new URLSearchParams(query);
  const order = q.get('order') === 'asc' ? 'asc' : 'desc';
  const limit = Math.min(100, Math.max(1, Number(q.get('limit')) || 20));
  let list = order === 'asc' ? items : [...items].reverse();
  const after = q.get('after');
  if (after) {
    const i = list.findIndex((x) => x.id === after);
    list = i === -1 ? [] : list.slice(i + 1);
  }
  const data = list.slice(0, limit);
  return { object: 'list', data, first_id: data[0]?.id ?? null, last_id: data[data.length - 1]?.id ?? null, has_more: list.length > limit };
}

function conversationView(c: Conversation): Obj {
  return { id: c.id, object: 'conversation', created_at: Math.floor(c.createdAt / 1000), metadata: c.metadata ?? {} };
}

function send(reply: ResponseSink, call: ForwardCall, body: unknown, promptTokens = 0, completionTokens = 0): void {
  call.complete({ status: 200, promptTokens, completionTokens });
  reply.send(200, JSON_HEADERS, JSON.stringify(body));
}

function missing(call: ForwardCall, what: string, id: string): void {
  call.complete({ status: 404, promptTokens: 0, completionTokens: 0 });
  call.reply.sendError(new GatewayError('NOT_FOUND', `No ${what} found with id '${id}'.`, { param: null }));
}

export class DemoConversations {
  private readonly kept = new Map<string, Conversation>();

  constructor(
    private readonly now: () => number,
    /** The demo's stored responses (compaction and counts read a `previous_response_id`'s items). */
    private readonly response: (id: string) => DemoStoredItems | undefined,
  ) {}

  /** The items a response created with `conversation` reads before its own input. */
  itemsOf(id: string): Obj[] {
    return this.kept.get(id)?.items ?? [];
  }

  /** A response created with `conversation` ended: its input and output join the conversation. */
  append(id: string, items: Obj[]): void {
    this.kept.get(id)?.items.push(...items);
  }

  forward(call: ForwardCall): void {
    const body = call.body ?? {};
    if (call.op === 'input_tokens') return send(call.reply, call, { object: 'response.input_tokens', input_tokens: this.contextTokens(body) });
    if (call.op === 'compact') return this.compact(call, body);
    const at = call.conversation!;
    if (at.action === 'create') {
      const c: Conversation = { id: newDemoId('conv'), createdAt: this.now(), metadata: body.metadata ?? {}, items: demoItemsOf(body.items) };
      this.kept.set(c.id, c);
      while (this.kept.size > MAX_CONVERSATIONS) this.kept.delete(this.kept.keys().next().value as string);
      call.recordOwned([c.id, ...itemIdsOf(c.items)], '');
      return send(call.reply, call, conversationView(c));
    }
    const c = this.kept.get(at.id);
    if (!c) return missing(call, 'conversation', at.id);
    if (at.action === 'conversation') {
      if (call.method === 'POST') c.metadata = body.metadata ?? {};
      if (call.method !== 'DELETE') return send(call.reply, call, conversationView(c));
      this.kept.delete(c.id);
      call.forget(c.id);
      return send(call.reply, call, { id: c.id, object: 'conversation.deleted', deleted: true });
    }
    if (at.action === 'items') {
      if (call.method === 'GET') return send(call.reply, call, demoItemsPage(c.items, call.query));
      const added = demoItemsOf(body.items);
      c.items.push(...added);
      call.recordOwned(itemIdsOf(added), '');
      return send(call.reply, call, { object: 'list', data: added, first_id: added[0]?.id ?? null, last_id: added[added.length - 1]?.id ?? null, has_more: false });
    }
    const i = c.items.findIndex((x) => x.id === at.itemId);
    if (i === -1) return missing(call, 'item', at.itemId);
    if (call.method === 'GET') return send(call.reply, call, c.items[i]);
    c.items.splice(i, 1);
    call.forget(at.itemId);
    send(call.reply, call, conversationView(c));
  }

  /** The items a compaction or a count reads: a previous response's, a conversation's, then the input. */
  private contextItems(body: Obj): Obj[] {
    const items: Obj[] = [];
    if (typeof body.previous_response_id === 'string') {
      const r = this.response(body.previous_response_id);
      if (r) items.push(...r.inputItems, ...r.output);
    }
    const conv = typeof body.conversation === 'string' ? body.conversation : (body.conversation as Obj | null)?.id;
    if (typeof conv === 'string') items.push(...this.itemsOf(conv));
    return items;
  }

  private contextTokens(body: Obj): number {
    return countTokens(responsesInputText(this.contextItems(body))) + countResponsesInputTokens(body);
  }

  private compact(call: ForwardCall, body: Obj): void {
    const items = [...this.contextItems(body), ...demoItemsOf(body.input)];
    const kept = items.filter((x) => x.role === 'user');
    const summary = `Compacted ${items.length} items.`;
    const compaction = { id: newDemoId('cmp'), type: 'compaction', encrypted_content: Buffer.from(summary).toString('base64') };
    const input = this.contextTokens(body);
    const output = countTokens(summary);
    const usage = { input_tokens: input, input_tokens_details: { cached_tokens: 0 }, output_tokens: output, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: input + output };
    const out = [...kept, compaction];
    call.recordOwned(itemIdsOf(out), '');
    send(call.reply, call, { id: newDemoId('resp'), object: 'response.compaction', created_at: Math.floor(this.now() / 1000), output: out, usage }, input, output);
  }
}
