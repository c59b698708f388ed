// The parts of a fake OpenAI-compatible Responses upstream beyond creating responses: the
// Conversations API (`/v1/conversations…`), `POST /v1/responses/compact` and
// `POST /v1/responses/input_tokens`, in the shapes OpenAI documents. fake-responses-upstream.ts hands
// it every request it does not answer itself.
import { randomBytes } from 'node:crypto';
import type { ServerResponse } from 'node:http';

/** What every compaction reports. */
export const COMPACT_USAGE = {
  input_tokens: 900,
  input_tokens_details: { cached_tokens: 0 },
  output_tokens: 200,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: 1100,
};
/** What every input-token count answers. */
export const COUNTED_INPUT_TOKENS = 42;

type Send = (res: ServerResponse, status: number, body: unknown) => void;
type Item = Record<string, unknown> & { id: string };

interface Conversation {
  id: string;
  created_at: number;
  metadata: Record<string, unknown>;
  items: Item[];
}

const hex = () => randomBytes(12).toString('hex');

function itemsOf(list: unknown): Item[] {
  return (Array.isArray(list) ? list : []).map((x) => {
    const it = { ...(x as Record<string, unknown>) };
    if (it.type === undefined) it.type = 'message';
    if (typeof it.content === 'string') it.content = [{ type: 'input_text', text: it.content }];
    return { id: `msg_${hex()}`, status: 'completed', ...it } as Item;
  });
}

function list(data: Item[]): Record<string, unknown> {
  return { object: 'list', data, first_id: data[0]?.id ?? null, last_id: data[data.length - 1]?.id ?? null, has_more: false };
}

export class FakeConversations {
  readonly conversations = new Map<string, Conversation>();

  private view(c: Conversation): Record<string, unknown> {
    return { id: c.id, object: 'conversation', created_at: c.created_at, metadata: c.metadata };
  }

  /** Answers a request it knows (true), or leaves it (false). */
  handle(method: string, path: string, body: any, res: ServerResponse, send: Send): boolean {
    const notFound = () => send(res, 404, { error: { message: 'not found', type: 'invalid_request_error', param: null, code: null } });
    if (method === 'POST' && path === '/v1/responses/compact') {
      const kept = itemsOf(typeof body?.input === 'string' ? [{ role: 'user', content: body.input }] : body?.input);
      const output = [...kept, { id: `cmp_${hex()}`, type: 'compaction', encrypted_content: 'c29tZXRoaW5n' }];
      send(res, 200, { id: `resp_${hex()}`, object: 'response.compaction', created_at: 1, output, usage: COMPACT_USAGE });
      return true;
    }
    if (method === 'POST' && path === '/v1/responses/input_tokens') {
      send(res, 200, { object: 'response.input_tokens', input_tokens: COUNTED_INPUT_TOKENS });
      return true;
    }
    if (path === '/v1/conversations' && method === 'POST') {
      const c: Conversation = { id: `conv_${hex()}`, created_at: 1, metadata: body?.metadata ?? {}, items: itemsOf(body?.items) };
      this.conversations.set(c.id, c);
      send(res, 200, this.view(c));
      return true;
    }
    const m = /^\/v1\/conversations\/([^/]+)(\/items(?:\/([^/]+))?)?$/.exec(path);
    if (!m) return false;
    const c = this.conversations.get(m[1]);
    if (!c) return notFound(), true;
    if (m[2] === undefined) {
      if (method === 'GET') send(res, 200, this.view(c));
      else if (method === 'POST') {
        c.metadata = body?.metadata ?? {};
        send(res, 200, this.view(c));
      } else if (method === 'DELETE') {
        this.conversations.delete(c.id);
        send(res, 200, { id: c.id, object: 'conversation.deleted', deleted: true });
      } else notFound();
      return true;
    }
    if (m[3] === undefined) {
      if (method === 'GET') send(res, 200, list(c.items));
      else if (method === 'POST') {
        const added = itemsOf(body?.items);
        c.items.push(...added);
        send(res, 200, list(added));
      } else notFound();
      return true;
    }
    const i = c.items.findIndex((x) => x.id === m[3]);
    if (i === -1) return notFound(), true;
    if (method === 'GET') send(res, 200, c.items[i]);
    else if (method === 'DELETE') {
      c.items.splice(i, 1);
      send(res, 200, this.view(c));
    } else notFound();
    return true;
  }
}
