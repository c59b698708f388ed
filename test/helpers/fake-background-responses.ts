// Background mode of the fake Responses upstream (fake-responses-upstream.ts), as OpenAI documents it:
// a create with `background: true` answers `queued` with no usage (or, with `stream: true`, streams
// its first events and holds); `GET /v1/responses/{id}` answers `in_progress` until the test calls
// `finish`, then the terminal response with its usage; `GET …?stream=true&starting_after=N` replays
// the events after N and follows the rest; `POST …/cancel` answers `cancelled` with the usage so far
// (CANCEL_USAGE). The response runs on whether or not anyone is connected. No timers: the test decides.
import type { ServerResponse } from 'node:http';

/** What a background response cancelled while running reports: its input, and the output so far. */
export const CANCEL_USAGE = {
  input_tokens: 1200,
  input_tokens_details: { cached_tokens: 0 },
  output_tokens: 40,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: 1240,
};

const TERMINAL = new Set(['completed', 'failed', 'cancelled', 'incomplete', 'expired']);

interface Bg {
  id: string;
  /** The current object (status, output, usage). */
  response: Record<string, unknown>;
  /** What it becomes when finished. */
  final: Record<string, unknown>;
  /** Every event so far, in order (its `sequence_number` is its index). */
  events: string[];
  /** Streams following it (the create's, resumed ones). */
  streams: Set<ServerResponse>;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export class FakeBackgroundResponses {
  private readonly items = new Map<string, Bg>();
  /** Ids the upstream no longer has (`forget`). */
  readonly forgotten = new Set<string>();
  /** Terminal objects without `usage` (an upstream that reports none). */
  noUsage = false;
  /** A create's stream is cut (the connection reset) after its first events; the response runs on. */
  cutCreateStream = false;

  has(id: string): boolean {
    return this.items.has(id);
  }

  /** Ids of the responses created so far, oldest first. */
  ids(): string[] {
    return [...this.items.keys()];
  }

  /** Whether `id` (the newest when omitted) reached a terminal status. */
  isTerminal(id?: string): boolean {
    const b = this.pick(id);
    return TERMINAL.has(String(b.response.status));
  }

  /** How many streams follow `id` now (the create's, resumed ones): 0 once the gateway let go of them. */
  streamsOpen(id: string): number {
    return this.pick(id).streams.size;
  }

  /** A background create: `final` is the completed response (with its usage). */
  create(final: Record<string, unknown>, stream: boolean, res: ServerResponse): void {
    const id = String(final.id);
    const message = (final.output as Array<Record<string, unknown>>)[0];
    const queued = { ...final, status: 'queued', background: true, output: [], usage: null };
    const b: Bg = { id, response: { ...queued, status: 'in_progress' }, final: { ...final, background: true, usage: this.noUsage ? null : final.usage }, events: [], streams: new Set() };
    this.items.set(id, b);
    this.event(b, 'response.created', { response: queued });
    this.event(b, 'response.in_progress', { response: { ...queued, status: 'in_progress' } });
    this.event(b, 'response.output_text.delta', { item_id: message.id, output_index: 0, content_index: 0, delta: 'Upstream says' });
    if (!stream) return send(res, 200, queued);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (!this.cutCreateStream) return this.follow(b, -1, res);
    // Cut: what was sent so far, then the connection dies; the response runs on without it.
    for (const ev of b.events) res.write(ev);
    setTimeout(() => res.socket?.destroy(), 50);
  }

  /** Lets `id` (the newest when omitted) finish: its last events go out, GET answers it completed. */
  finish(id?: string): void {
    const b = this.pick(id);
    if (TERMINAL.has(String(b.response.status))) return;
    const message = (b.final.output as Array<Record<string, unknown>>)[0];
    this.event(b, 'response.output_text.delta', { item_id: message.id, output_index: 0, content_index: 0, delta: ' hello.' });
    b.response = b.final;
    this.event(b, 'response.completed', { response: b.final });
    this.endStreams(b);
  }

  /** The upstream no longer has `id` (its retention passed): every path answers 404. */
  forget(id?: string): void {
    const b = this.pick(id);
    this.endStreams(b);
    this.items.delete(b.id);
    this.forgotten.add(b.id);
  }

  /** `GET /v1/responses/{id}`, with `?stream=true&starting_after=N` too. */
  get(id: string, query: URLSearchParams, res: ServerResponse): void {
    const b = this.items.get(id)!;
    if (query.get('stream') !== 'true') return send(res, 200, b.response);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    // The head goes out at once, even when no event follows yet (a resume of a running response).
    res.flushHeaders();
    const after = query.has('starting_after') ? Number(query.get('starting_after')) : -1;
    this.follow(b, after, res);
  }

  /** `POST /v1/responses/{id}/cancel`: a running response is cancelled with the usage so far. */
  cancel(id: string, res: ServerResponse): void {
    const b = this.items.get(id)!;
    if (!TERMINAL.has(String(b.response.status))) {
      b.response = { ...b.response, status: 'cancelled', usage: this.noUsage ? null : CANCEL_USAGE };
      this.endStreams(b);
    }
    send(res, 200, b.response);
  }

  private pick(id?: string): Bg {
    const b = this.items.get(id ?? this.ids()[this.items.size - 1] ?? '');
    if (!b) throw new Error(`no background response ${id ?? '(none yet)'}`);
    return b;
  }

  private event(b: Bg, type: string, f: Record<string, unknown>): void {
    const text = `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: b.events.length, ...f })}\n\n`;
    b.events.push(text);
    for (const s of b.streams) if (!s.destroyed) s.write(text);
  }

  private follow(b: Bg, after: number, res: ServerResponse): void {
    for (let i = after + 1; i < b.events.length; i++) res.write(b.events[i]);
    if (TERMINAL.has(String(b.response.status))) return void res.end();
    b.streams.add(res);
    res.on('close', () => b.streams.delete(res));
  }

  private endStreams(b: Bg): void {
    for (const s of b.streams) s.end();
    b.streams.clear();
  }
}
