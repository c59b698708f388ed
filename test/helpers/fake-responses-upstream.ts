// A fake OpenAI-compatible Responses API upstream (plain node:http) with known usage: every create
// reports USAGE (cached and reasoning tokens included), as JSON or as the Responses event stream. It
// keeps what it created so the stored-response paths answer, and records every request it gets.
// Mode 'cut-stream': the stream stops after its first text delta and the connection is reset;
// 'hold-stream': the stream stops after its first text delta and waits until the gateway goes away;
// 'big-json': a JSON answer whose output text is BIG_OUTPUT_BYTES long, its usage after it.
// Background mode (`background: true`) is fake-background-responses.ts's, reached through `background`.
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { WebSocketServer } from 'ws';
import { FakeBackgroundResponses } from './fake-background-responses.js';
import { FakeConversations } from './fake-conversations-upstream.js';
import { listenLocal } from './http.js';

export const USAGE = {
  input_tokens: 1200,
  input_tokens_details: { cached_tokens: 800 },
  output_tokens: 300,
  output_tokens_details: { reasoning_tokens: 120 },
  total_tokens: 1500,
};

export interface ResponsesUpstreamRequest {
  method: string;
  /** Path and query as received. */
  url: string;
  headers: IncomingMessage['headers'];
  body: any;
}

/** The output text of a 'big-json' answer: over the 4 MiB a Responses answer was once read up to. */
export const BIG_OUTPUT_BYTES = 5 * 1024 * 1024;

type SocketMode = 'normal' | 'hold' | 'drop' | 'no-usage';
type Mode = 'normal' | 'cut-stream' | 'hold-stream' | 'big-json';

export interface FakeResponsesUpstream {
  /** base_url for the gateway config, ending in /v1. */
  baseUrl: string;
  requests: ResponsesUpstreamRequest[];
  /** WebSocket mode: the handshakes (URL and authorization) and every message received. */
  sockets: Array<{ url: string; authorization: string | undefined; received: any[] }>;
  setMode(mode: Mode): void;
  /**
   * WebSocket mode: 'hold' answers a create with response.created and one delta, then nothing;
   * 'drop' then kills the connection; 'no-usage' completes it without usage.
   */
  setSocketMode(mode: SocketMode): void;
  /** Background responses: the test finishes (or forgets) them. */
  background: FakeBackgroundResponses;
  /** Conversations, compact and input_tokens (fake-conversations-upstream.ts). */
  conversations: FakeConversations;
  close(): Promise<void>;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export async function startFakeResponsesUpstream(): Promise<FakeResponsesUpstream> {
  const requests: ResponsesUpstreamRequest[] = [];
  const stored = new Map<string, { response: Record<string, unknown>; input: unknown }>();
  let mode: Mode = 'normal';
  const background = new FakeBackgroundResponses();
  const conversations = new FakeConversations();
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      let body: any = null;
      try {
        body = text ? JSON.parse(text) : null;
      } catch {
        body = text;
      }
      requests.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      const path = (req.url ?? '').split('?')[0];
      if (conversations.handle(req.method ?? '', path, body, res, send)) return;
      if (req.method === 'POST' && path === '/v1/responses') {
        const id = `resp_${randomBytes(12).toString('hex')}`;
        const text = mode === 'big-json' ? 'y'.repeat(BIG_OUTPUT_BYTES) : 'Upstream says hello.';
        const message = { id: `msg_${id.slice(5)}`, type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] };
        const response: Record<string, unknown> = { id, object: 'response', created_at: 1, status: 'completed', model: body.model, output: [message], usage: USAGE, metadata: {} };
        stored.set(id, { response, input: body.input });
        if (body.background === true) return background.create(response, body.stream === true, res);
        if (body.stream !== true) return send(res, 200, response);
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        let seq = 0;
        const ev = (type: string, f: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...f })}\n\n`;
        res.write(ev('response.created', { response: { ...response, status: 'in_progress', output: [], usage: null } }));
        res.write(ev('response.output_text.delta', { item_id: message.id, output_index: 0, content_index: 0, delta: 'Upstream says' }));
        if (mode === 'cut-stream') {
          // The connection dies mid-stream, after a delta went out.
          setTimeout(() => res.socket?.destroy(), 50);
          return;
        }
        if (mode === 'hold-stream') return;
        res.write(ev('response.output_text.delta', { item_id: message.id, output_index: 0, content_index: 0, delta: ' hello.' }));
        res.end(ev('response.completed', { response }));
        return;
      }
      const m = /^\/v1\/responses\/([^/]+)(\/input_items|\/cancel)?$/.exec(path);
      const s = m ? stored.get(m[1]) : undefined;
      // A background response the upstream forgot (its retention passed) is gone on every path.
      if (m && background.forgotten.has(m[1])) return send(res, 404, { error: { message: 'not found', type: 'invalid_request_error', param: null, code: null } });
      if (m && background.has(m[1]) && m[2] === '/cancel') return background.cancel(m[1], res);
      if (m && background.has(m[1]) && m[2] === undefined && req.method === 'GET') return background.get(m[1], new URLSearchParams((req.url ?? '').split('?')[1] ?? ''), res);
      if (!m || !s) return send(res, 404, { error: { message: 'not found', type: 'invalid_request_error', param: null, code: null } });
      if (m[2] === '/input_items') return send(res, 200, { object: 'list', data: [{ id: 'msg_in', type: 'message', role: 'user', content: [{ type: 'input_text', text: String(s.input) }] }], first_id: 'msg_in', last_id: 'msg_in', has_more: false });
      if (m[2] === '/cancel') return send(res, 200, { ...s.response, status: 'cancelled' });
      if (req.method === 'DELETE') {
        stored.delete(m[1]);
        return send(res, 200, { id: m[1], object: 'response', deleted: true });
      }
      return send(res, 200, s.response);
    });
  });
  // WebSocket mode on /v1/responses: each response.create answered with created, a delta and completed.
  // It reads the create's fields at the top level, as OpenAI's WebSocket mode does.
  const sockets: FakeResponsesUpstream['sockets'] = [];
  let socketMode: SocketMode = 'normal';
  const wss = new WebSocketServer({ server, path: '/v1/responses' });
  wss.on('connection', (ws, req) => {
    const rec = { url: req.url ?? '', authorization: req.headers.authorization, received: [] as any[] };
    sockets.push(rec);
    ws.on('message', (d) => {
      const ev = JSON.parse(d.toString());
      rec.received.push(ev);
      if (ev.type !== 'response.create') return;
      const id = `resp_${randomBytes(12).toString('hex')}`;
      const response = { id, object: 'response', status: 'completed', model: ev.model, output: [], usage: USAGE };
      ws.send(JSON.stringify({ type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', usage: null } }));
      ws.send(JSON.stringify({ type: 'response.output_text.delta', sequence_number: 1, delta: 'hi' }));
      if (socketMode === 'hold') return;
      if (socketMode === 'drop') return void ws.terminate();
      ws.send(JSON.stringify({ type: 'response.completed', sequence_number: 2, response: socketMode === 'no-usage' ? { ...response, usage: null } : response }));
    });
  });
  const port = await listenLocal(server);
  return {
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    sockets,
    background,
    conversations,
    setMode(m) {
      mode = m;
    },
    setSocketMode(m) {
      socketMode = m;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const c of wss.clients) c.terminate();
        wss.close();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
