// Any OpenAI-compatible HTTP API: base URL and upstream key from the model's config, one undici Pool
// (keep-alive) per origin, requests and responses streamed through stream-proxy.ts. Usage comes from the
// upstream's `usage`; when it gives none, the gateway counts tokens with its own tokenizer.
import { StringDecoder } from 'node:string_decoder';
import { Pool } from 'undici';
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import { rewriteChatBody } from '../json-splice.js';
import { proxyRequest, USAGE_GRACE_MS, type BodyInspector } from '../stream-proxy.js';
import { estimateOutputTokens, estimateTokens } from '../tokens.js';
import { AudioDurationProbe } from '../audio-duration.js';
import { boundaryOf } from '../multipart-model.js';
import type { ModelCall, Provider, TranscriptionCall } from './provider.js';

const DEFAULT_TIMEOUT_MS = 60_000;
/** Non-streaming JSON answers are copied up to this size to read their usage. */
const MAX_USAGE_COPY_BYTES = 4 * 1024 * 1024;

/** Per-model constants, computed once per config version (ModelConfig objects change with it). */
interface Target {
  pool: Pool;
  basePath: string;
  jsonHeaders: string[];
  authHeader: string;
  upstreamModel: string;
  timeoutMs: number;
}

export class PoolRegistry {
  private readonly pools = new Map<string, Pool>();

  get(origin: string): Pool {
    let p = this.pools.get(origin);
    if (!p) {
      // No cap on connections: a stream holds its connection for as long as it lasts (minutes), so a
      // cap would make the next stream wait for another to end. What bounds them is what bounds the
      // requests in flight (the keys' parallel limits, the node's descriptors).
      p = new Pool(origin, { connections: null, pipelining: 1, keepAliveTimeout: 30_000, connectTimeout: 10_000 });
      this.pools.set(origin, p);
    }
    return p;
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.pools.values()].map((p) => p.destroy()));
    this.pools.clear();
  }
}

interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
}

/**
 * Watches a JSON answer go through unchanged (so it keeps its length and goes out with tryEnd), holding
 * references to its chunks (bounded, no copy) to read `usage` at the end. OpenAI-compatible APIs put
 * `usage` last: it is read from the tail, and the whole answer is parsed only when it is not there.
 */
class JsonUsage implements BodyInspector {
  readonly passesThrough = true;
  private parts: Buffer[] = [];
  private size = 0;
  transform(chunk: Buffer): Buffer {
    if (this.size + chunk.length <= MAX_USAGE_COPY_BYTES) {
      this.parts.push(chunk);
      this.size += chunk.length;
    } else {
      this.size = Infinity;
      this.parts = [];
    }
    return chunk;
  }
  flush(): string {
    return '';
  }
  /** `usage` when it is the last member of the top-level object, read from the tail alone. */
  usageFromTail(): Usage | null {
    if (this.size === Infinity || this.parts.length === 0) return null;
    const last = this.parts[this.parts.length - 1];
    const tail = (this.parts.length === 1 || last.length >= TAIL_BYTES ? last : Buffer.concat(this.parts)).toString('utf8');
    return usageAtEnd(tail);
  }
  json(): Record<string, unknown> | null {
    if (this.size === Infinity) return null;
    try {
      return JSON.parse(Buffer.concat(this.parts).toString('utf8')) as Record<string, unknown>;
    } catch {
      return null;
    }
  }
}

/** Bytes of an answer's tail enough to hold its `usage` object (with its details). */
const TAIL_BYTES = 2048;

/**
 * The `usage` object of a JSON text when it is the top-level object's last member: `"usage"` whose
 * object is followed by nothing but the top-level object's closing brace. Anything else: null (the
 * caller parses the whole answer). A `"usage"` inside a string value cannot match: quotes in JSON
 * strings are escaped.
 */
export function usageAtEnd(text: string): Usage | null {
  const at = text.lastIndexOf('"usage"');
  if (at === -1) return null;
  let i = at + 7;
  while (isSpace(text.charCodeAt(i))) i++;
  if (text.charCodeAt(i) !== 58 /* : */) return null;
  i++;
  while (isSpace(text.charCodeAt(i))) i++;
  if (text.charCodeAt(i) !== 123 /* { */) return null;
  const start = i;
  let depth = 0;
  for (; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      // Skip the string, escapes included.
      for (i++; i < text.length && text.charCodeAt(i) !== 34; i++) if (text.charCodeAt(i) === 92 /* \ */) i++;
    } else if (c === 123) depth++;
    else if (c === 125 /* } */ && --depth === 0) break;
  }
  if (depth !== 0) return null;
  const end = i + 1;
  let j = end;
  while (isSpace(text.charCodeAt(j))) j++;
  if (text.charCodeAt(j) !== 125) return null;
  for (j++; j < text.length; j++) if (!isSpace(text.charCodeAt(j))) return null;
  // The member before must end with a comma or be the object's opening brace.
  let k = at - 1;
  while (k >= 0 && isSpace(text.charCodeAt(k))) k--;
  if (k >= 0 && text.charCodeAt(k) !== 44 /* , */ && text.charCodeAt(k) !== 123) return null;
  try {
    const u = JSON.parse(text.slice(start, end)) as unknown;
    return u && typeof u === 'object' && !Array.isArray(u) ? (u as Usage) : null;
  } catch {
    return null;
  }
}

function isSpace(c: number): boolean {
  return c === 32 || c === 10 || c === 13 || c === 9;
}

/** The longest SSE event held back whole while it arrives. */
const MAX_SSE_EVENT_CHARS = 1024 * 1024;

/**
 * Passes an SSE stream on event by event (an event goes out as soon as it is complete), reads the
 * usage chunk, and drops it (and the `"usage":null` fields) when only the gateway asked for usage.
 */
export class SseUsage implements BodyInspector {
  usage: Usage | null = null;
  private carry = '';
  private readonly decoder = new StringDecoder('utf8');
  private readonly dataEvents: string[] = [];
  constructor(private readonly strip: boolean) {}

  transform(chunk: Buffer): string {
    const text = this.carry + this.decoder.write(chunk);
    const end = text.lastIndexOf('\n\n');
    if (end === -1) {
      // An "event" this long is not one: passed on as it is, rather than held without end.
      if (text.length > MAX_SSE_EVENT_CHARS) {
        this.carry = '';
        this.keep(text);
        return text;
      }
      this.carry = text;
      return '';
    }
    this.carry = text.slice(end + 2);
    return this.events(text.slice(0, end + 2));
  }

  flush(): string {
    const rest = this.carry + this.decoder.end();
    this.carry = '';
    return rest ? this.events(rest) : '';
  }

  private events(block: string): string {
    // Nothing to read or strip (`"usage":null` fields included) in a block without "usage".
    if (!block.includes('"usage"')) {
      this.keep(block);
      return block;
    }
    let out = '';
    for (const ev of block.split('\n\n')) {
      if (ev.length === 0) continue;
      let e = ev;
      if (e.includes('"usage"')) {
        const data = dataOf(e);
        let obj: { usage?: Usage | null; choices?: unknown[] } | null = null;
        try {
          obj = data ? JSON.parse(data) : null;
        } catch {
          obj = null;
        }
        if (obj && obj.usage) {
          this.usage = obj.usage;
          if (this.strip && Array.isArray(obj.choices) && obj.choices.length === 0) continue;
        }
        if (this.strip) e = e.replace(/,"usage":null|"usage":null,?/g, '');
      }
      this.keep(e);
      out += e + '\n\n';
    }
    return out;
  }

  private keep(block: string): void {
    // Kept only to count tokens when the upstream reports no usage (parsed lazily, at the end).
    if (this.usage === null) this.dataEvents.push(block);
  }

  /** Completion tokens estimated from the streamed deltas (text, reasoning, tool calls: tokens.ts). */
  countedCompletionTokens(): number {
    let n = 0;
    for (const block of this.dataEvents) {
      for (const ev of block.split('\n\n')) {
        const data = dataOf(ev);
        if (!data || data === '[DONE]') continue;
        try {
          n += estimateOutputTokens(JSON.parse(data));
        } catch {
          // not JSON: not a content event
        }
      }
    }
    return n;
  }
}

/**
 * What an exchange that reached its upstream bills, however it ended (docs/billing-endings.md): the
 * upstream's usage when it reported it (in time, for a client gone), else the estimate of everything
 * sent and everything received (tokens.ts). An upstream that answered an error status, or never
 * answered, did no billable work.
 */
function billedTokens(
  status: number,
  outcome: 'ok' | 'error' | 'aborted',
  upstreamStatus: number,
  usage: Usage | null,
  estimate: () => { prompt: number; completion: number },
): { status: number; promptTokens: number; completionTokens: number } {
  const st = outcome === 'aborted' ? 499 : status;
  const served = upstreamStatus >= 200 && upstreamStatus < 300;
  // An error status, or (not a client gone) no answer at all: nothing was served.
  if (upstreamStatus !== 0 && !served) return { status: st, promptTokens: 0, completionTokens: 0 };
  if (upstreamStatus === 0 && outcome !== 'aborted') return { status: st, promptTokens: 0, completionTokens: 0 };
  if (usage) return { status: st, promptTokens: usage.prompt_tokens ?? 0, completionTokens: usage.completion_tokens ?? 0 };
  const e = estimate();
  return { status: st, promptTokens: e.prompt, completionTokens: e.completion };
}

function dataOf(event: string): string | null {
  const lines = event.split('\n');
  let data: string | null = null;
  for (const l of lines) if (l.startsWith('data:')) data = (data === null ? '' : data + '\n') + l.slice(5).trimStart();
  return data;
}

export class OpenAIProvider implements Provider {
  private readonly targets = new WeakMap<ModelConfig, Target>();
  constructor(private readonly pools: PoolRegistry) {}

  private target(model: ModelConfig): Target {
    let t = this.targets.get(model);
    if (!t) {
      const url = new URL(model.baseUrl);
      const authHeader = model.upstreamApiKey ? `Bearer ${model.upstreamApiKey}` : '';
      const jsonHeaders = ['content-type', 'application/json'];
      if (authHeader) jsonHeaders.push('authorization', authHeader);
      t = {
        pool: this.pools.get(url.origin),
        basePath: url.pathname.replace(/\/+$/, ''),
        jsonHeaders,
        authHeader,
        upstreamModel: model.upstreamModel || model.id,
        timeoutMs: model.timeoutMs > 0 ? model.timeoutMs : DEFAULT_TIMEOUT_MS,
      };
      this.targets.set(model, t);
    }
    return t;
  }

  chat(call: ModelCall): void {
    const t = this.target(call.model);
    const body = call.body;
    const stream = body.stream === true;
    const so = body.stream_options as Record<string, unknown> | undefined;
    const clientWantsUsage = !!so && so.include_usage === true;
    let payload: Buffer | string = call.rawBody;
    const rename = body.model !== t.upstreamModel;
    const addUsage = stream && !clientWantsUsage;
    if (rename || addUsage) {
      // Rewritten in place when it can be (the common case); re-serialised otherwise.
      const spliced = so === undefined || !addUsage ? rewriteChatBody(call.bodyText, rename ? t.upstreamModel : null, addUsage) : null;
      if (spliced !== null) payload = spliced;
      else {
        const copy: Record<string, unknown> = { ...body, model: t.upstreamModel };
        if (stream) copy.stream_options = { ...(so ?? {}), include_usage: true };
        payload = JSON.stringify(copy);
      }
    }
    let sse: SseUsage | null = null;
    let json: JsonUsage | null = null;
    proxyRequest({
      pool: t.pool,
      method: 'POST',
      path: `${t.basePath}/chat/completions`,
      headers: t.jsonHeaders,
      body: payload,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      shape: 'A',
      passAllHeaders: false,
      // Methods, not arrow properties: under tsx (esbuild keepNames) a named arrow made per request
      // costs a defineProperty of its name.
      inspect(status, contentType) {
        if (status < 200 || status >= 300) return null;
        if (contentType.startsWith('text/event-stream')) return (sse = new SseUsage(!clientWantsUsage));
        return (json = new JsonUsage());
      },
      onAbort: call.onAbort,
      // A client gone: the upstream is read on for its usage (stream-proxy.ts).
      usageGraceMs: USAGE_GRACE_MS,
      onDone(status, outcome, upstreamStatus) {
        let usage: Usage | null = null;
        let obj: Record<string, unknown> | null = null;
        if (sse) usage = (sse as SseUsage).usage;
        else if (json) {
          usage = (json as JsonUsage).usageFromTail();
          obj = usage ? null : (json as JsonUsage).json();
          usage ??= (obj?.usage as Usage | undefined) ?? null;
        }
        call.complete(
          billedTokens(status, outcome, upstreamStatus, usage, () => ({
            prompt: estimateTokens(body),
            completion: sse ? (sse as SseUsage).countedCompletionTokens() : estimateOutputTokens(obj),
          })),
        );
      },
    });
  }

  embeddings(call: ModelCall): void {
    const t = this.target(call.model);
    const body = call.body;
    const payload = body.model === t.upstreamModel ? call.rawBody : JSON.stringify({ ...body, model: t.upstreamModel });
    let json: JsonUsage | null = null;
    proxyRequest({
      pool: t.pool,
      method: 'POST',
      path: `${t.basePath}/embeddings`,
      headers: t.jsonHeaders,
      body: payload,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      shape: 'A',
      passAllHeaders: false,
      inspect(status) {
        return status >= 200 && status < 300 ? (json = new JsonUsage()) : null;
      },
      onAbort: call.onAbort,
      usageGraceMs: USAGE_GRACE_MS,
      onDone(status, outcome, upstreamStatus) {
        const j = json as JsonUsage | null;
        const usage = j ? (j.usageFromTail() ?? ((j.json()?.usage as Usage | undefined) ?? null)) : null;
        const r = billedTokens(status, outcome, upstreamStatus, usage, () => ({ prompt: estimateTokens(body), completion: 0 }));
        call.complete({ ...r, completionTokens: 0 });
      },
    });
  }

  speech(call: ModelCall): void {
    const t = this.target(call.model);
    const body = call.body;
    const payload = body.model === t.upstreamModel ? call.rawBody : JSON.stringify({ ...body, model: t.upstreamModel });
    const chars = typeof body.input === 'string' ? body.input.length : 0;
    proxyRequest({
      pool: t.pool,
      method: 'POST',
      path: `${t.basePath}/audio/speech`,
      headers: t.jsonHeaders,
      body: payload,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      shape: 'A',
      passAllHeaders: false,
      onAbort: call.onAbort,
      onDone(status, outcome) {
        // An aborted synthesis still ran upstream: its input characters are billed.
        const ok = outcome === 'aborted' || (status >= 200 && status < 300);
        call.complete({ status: outcome === 'aborted' ? 499 : status, promptTokens: 0, completionTokens: 0, audioUnits: ok ? chars : 0 });
      },
    });
  }

  transcription(call: TranscriptionCall): void {
    const t = this.target(call.model);
    const upload = call.upload;
    // The model field's value (in memory) is replaced by the upstream's model name; everything else
    // streams unchanged: the spilled bytes back from disk, then the head, then the rest of the body.
    const head = Buffer.concat([
      upload.head.subarray(0, upload.modelValueStart),
      Buffer.from(t.upstreamModel),
      upload.head.subarray(upload.modelValueEnd),
    ]);
    const rest = upload.rest;
    // What the upload is billed when the upstream reports no duration: read from the file's container
    // as its bytes go by (audio-duration.ts).
    const probe = new AudioDurationProbe(boundaryOf(call.contentType));
    // An async iterable, which undici pulls one chunk at a time: what the spill's reused read buffers
    // need (upload-spill.ts, `chunks`). A Readable in between would read ahead.
    const body = (async function* () {
      for await (const chunk of upload.spill.chunks()) {
        probe.feed(chunk);
        yield chunk;
      }
      probe.feed(head);
      yield head;
      for await (const chunk of rest) {
        probe.feed(chunk as Buffer);
        yield chunk as Buffer;
      }
      probe.end();
    })();
    const headers = ['content-type', call.contentType];
    if (t.authHeader) headers.push('authorization', t.authHeader);
    let json: JsonUsage | null = null;
    proxyRequest({
      pool: t.pool,
      method: 'POST',
      path: `${t.basePath}/audio/transcriptions`,
      headers,
      body,
      timeoutMs: t.timeoutMs,
      reply: call.reply,
      shape: 'A',
      passAllHeaders: false,
      inspect(status, contentType) {
        return status >= 200 && status < 300 && contentType.includes('json') ? (json = new JsonUsage()) : null;
      },
      onAbort: call.onAbort,
      onDone(status, outcome, upstreamStatus) {
        const st = outcome === 'aborted' ? 499 : status;
        // An error status, or no answer and the client still there: nothing was transcribed.
        if ((upstreamStatus !== 0 && (upstreamStatus < 200 || upstreamStatus >= 300)) || (upstreamStatus === 0 && outcome !== 'aborted')) {
          return call.complete({ status: st, promptTokens: 0, completionTokens: 0 });
        }
        // The upstream's duration (verbose_json); else the file's, once its parser is done with it.
        const duration = outcome === 'ok' ? (json as JsonUsage | null)?.json()?.duration : undefined;
        if (typeof duration === 'number' && Number.isFinite(duration) && duration > 0) {
          return call.complete({ status: st, promptTokens: 0, completionTokens: 0, audioUnits: Math.ceil(duration) });
        }
        // However the upload ended, the parser has all it will get.
        probe.end();
        probe.whenSettled((seconds) => call.complete({ status: st, promptTokens: 0, completionTokens: 0, audioUnits: seconds }));
      },
    });
  }
}
