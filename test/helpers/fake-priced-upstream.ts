// A fake OpenAI upstream whose answers report what the test sets (`answer`): the service tier it ran
// on, the built-in tool call items of its output, and its usage; chat completions and the Responses
// API, JSON and SSE (a stream cut before its end with `cut`), compactions, in the order OpenAI writes them (a chat answer's `service_tier` after its usage).
// A background create (`background: true`) answers `queued`; `GET /v1/responses/{id}` answers it
// completed, as `answer` said at its create. The Responses API's WebSocket mode too (`/v1/responses` upgraded): each `response.create` answered
// with the same events. It records every request body (and every create, path `ws:/v1/responses`) it gets.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { WebSocketServer } from 'ws';
import { listenLocal } from './http.js';

export interface PricedAnswer {
  /** The `service_tier` the answer reports; undefined: none. */
  serviceTier?: string;
  /** Output items before the message (Responses only): `{type: 'web_search_call', …}`. */
  items?: Array<Record<string, unknown>>;
  inputTokens: number;
  cachedTokens?: number;
  outputTokens: number;
  /** A stream cut before its end: no usage chunk (chat), no final event (Responses); the stream just ends. */
  cut?: boolean;
}

export interface FakePricedUpstream {
  /** base_url for the gateway config, ending in /v1. */
  baseUrl: string;
  /** Every request: its path and parsed body. */
  requests: Array<{ path: string; body: any }>;
  answer: PricedAnswer;
  close(): Promise<void>;
}

export const DEFAULT_ANSWER: PricedAnswer = { inputTokens: 500, cachedTokens: 100, outputTokens: 200 };

function readBody(req: IncomingMessage): Promise<any> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(parts).toString('utf8')));
      } catch {
        resolve(null);
      }
    });
  });
}

function sendJson(res: ServerResponse, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function sendSse(res: ServerResponse, events: unknown[], done = false): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  for (const e of events) res.write(`data: ${JSON.stringify(e)}\n\n`);
  if (done) res.write('data: [DONE]\n\n');
  res.end();
}

export async function startFakePricedUpstream(): Promise<FakePricedUpstream> {
  const requests: FakePricedUpstream['requests'] = [];
  const state = { answer: DEFAULT_ANSWER };
  let n = 0;
  /** A Responses answer to `body` as `answer` says, and its stream of events. */
  const responseOf = (body: any, a: PricedAnswer) => {
    const tier = a.serviceTier === undefined ? {} : { service_tier: a.serviceTier };
    const items = [...(a.items ?? []), { type: 'message', id: 'msg_1', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'Hi', annotations: [] }] }];
    const usage = { input_tokens: a.inputTokens, input_tokens_details: { cached_tokens: a.cachedTokens ?? 0 }, output_tokens: a.outputTokens, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: a.inputTokens + a.outputTokens };
    const response = { id: `resp_fake${++n}`, object: 'response', created_at: 1, status: 'completed', model: body?.model, output: items, ...tier, usage, safety_identifier: body?.safety_identifier };
    const events: unknown[] = [{ type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', output: [], usage: null } }];
    items.forEach((item, i) => events.push({ type: 'response.output_item.added', sequence_number: events.length, output_index: i, item: { ...item, status: 'in_progress' } }));
    events.push({ type: 'response.output_text.delta', sequence_number: events.length, output_index: items.length - 1, delta: 'Hi' });
    if (!a.cut) events.push({ type: 'response.completed', sequence_number: events.length, response });
    return { response, events };
  };
  /** Background responses, completed, by id. */
  const background = new Map<string, unknown>();
  const server = createServer(async (req, res) => {
    const body = await readBody(req);
    const path = (req.url ?? '').split('?')[0];
    requests.push({ path, body });
    const stored = req.method === 'GET' ? /\/responses\/([^/]+)$/.exec(path) : null;
    if (stored) {
      const r = background.get(stored[1]);
      if (!r) return void res.writeHead(404).end();
      return sendJson(res, r);
    }
    const a = state.answer;
    const tier = a.serviceTier === undefined ? {} : { service_tier: a.serviceTier };
    if (path.endsWith('/chat/completions')) {
      const usage = { prompt_tokens: a.inputTokens, completion_tokens: a.outputTokens, total_tokens: a.inputTokens + a.outputTokens, prompt_tokens_details: { cached_tokens: a.cachedTokens ?? 0 } };
      if (body?.stream) {
        const chunk = (extra: Record<string, unknown>) => ({ id: `chatcmpl-${n}`, object: 'chat.completion.chunk', created: 1, model: body.model, ...tier, ...extra });
        const first = chunk({ choices: [{ index: 0, delta: { role: 'assistant', content: 'Hi' } }], usage: null });
        return a.cut ? sendSse(res, [first]) : sendSse(res, [first, chunk({ choices: [], usage })], true);
      }
      // As OpenAI writes it: service_tier after usage.
      return sendJson(res, { id: `chatcmpl-${n}`, object: 'chat.completion', created: 1, model: body?.model, choices: [{ index: 0, message: { role: 'assistant', content: 'Hi' }, finish_reason: 'stop' }], usage, ...tier, system_fingerprint: 'fp_fake' });
    }
    if (path.endsWith('/responses/compact')) {
      // A compaction, with the tier it ran on after its usage (as a response object writes it).
      const usage = { input_tokens: a.inputTokens, input_tokens_details: { cached_tokens: a.cachedTokens ?? 0 }, output_tokens: a.outputTokens, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: a.inputTokens + a.outputTokens };
      return sendJson(res, { id: `cmp_fake${++n}`, object: 'response.compaction', created_at: 1, output: [{ type: 'compaction', id: `cmp_item${n}`, encrypted_content: 'x' }], usage, ...tier });
    }
    if (path.endsWith('/responses')) {
      const { response, events } = responseOf(body, a);
      if (body?.background === true) {
        background.set(response.id, { ...response, background: true });
        return sendJson(res, { ...response, background: true, status: 'queued', output: [], usage: null });
      }
      return body?.stream ? sendSse(res, events) : sendJson(res, response);
    }
    res.writeHead(404).end();
  });
  const wss = new WebSocketServer({ server, path: '/v1/responses' });
  wss.on('connection', (ws) => {
    ws.on('message', (d) => {
      const ev = JSON.parse(d.toString());
      if (ev.type !== 'response.create') return;
      requests.push({ path: 'ws:/v1/responses', body: ev });
      for (const e of responseOf(ev, state.answer).events) ws.send(JSON.stringify(e));
    });
  });
  const port = await listenLocal(server);
  return {
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    get answer() {
      return state.answer;
    },
    set answer(a: PricedAnswer) {
      state.answer = a;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const c of wss.clients) c.terminate();
        wss.close();
        server.close(() => resolve());
      }),
  };
}
