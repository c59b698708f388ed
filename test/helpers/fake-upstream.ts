// A fake OpenAI-compatible upstream (plain node:http) for data-plane tests. Its behaviour is set per
// test with setMode: answer normally, stream SSE and hold the rest until the test calls release(),
// stall (never answer), reset the connection mid-body, or answer an error status.
// Transcription uploads (/audio/transcriptions) are counted as they stream, never held: the recorded
// body is `{ bytes, model }`; 'hold-body' stops reading one after its first chunk until release().
// 'hold-head' holds any answer (chat, embeddings, speech, transcription) before its head until
// release(). Transcriptions answer in the `response_format` the upload asked for, with `duration`
// only where OpenAI gives one (verbose_json), unless `transcriptionDuration` is set to null.
// 'error-503' answers 503; 'error-429' answers 429, with `retryAfter` as its retry-after when set.
// Speech answers SPEECH_BYTES of audio. Known usage: chat 11 + 6 tokens, embeddings 7.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { listenLocal } from './http.js';

export type UpstreamMode = 'normal' | 'hold-stream' | 'stall' | 'reset-mid-body' | 'no-usage' | 'error-429' | 'hold-body' | 'hold-head' | 'error-503';

/** Bytes of audio a speech request gets back. */
export const SPEECH_BYTES = 64 * 1024;

/** What the fake records of a transcription upload; `bytes` grows while it streams in. */
export interface UploadRecord {
  bytes: number;
  /** The multipart `model` field's value, once the upload ended (null if none was seen). */
  model: string | null;
  /** The multipart `response_format` field's value, once the upload ended (null if none was seen). */
  responseFormat: string | null;
  ended: boolean;
}

/** Bytes kept from each end of an upload: enough for a model field sent first or last. */
const UPLOAD_EDGE_BYTES = 64 * 1024;

function multipartModel(edge: Buffer, field = 'model'): string | null {
  const m = new RegExp(`content-disposition:[^\\r\\n]*; *name="${field}"[^\\r\\n]*\\r\\n(?:[^\\r\\n]+\\r\\n)*\\r\\n([^\\r\\n]*)\\r\\n`, 'i').exec(edge.toString('latin1'));
  return m ? m[1] : null;
}

export interface UpstreamRequest {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  body: any;
}

export interface FakeUpstream {
  /** base_url for the gateway config, ending in /v1. */
  baseUrl: string;
  requests: UpstreamRequest[];
  setMode(mode: UpstreamMode): void;
  /** Lets a held stream send the rest, and held uploads be read on. */
  release(): void;
  /** Resolves when the next request (or the n-th overall) has arrived. */
  waitForRequests(n: number): Promise<void>;
  /** Resolves when a held or stalled response's connection was closed by the gateway. */
  waitForClientClose(): Promise<void>;
  /** Resolves once `n` answers are being held (hold-head, hold-stream) waiting for release(). */
  waitForHeld(n: number): Promise<void>;
  /** Seconds a verbose_json transcription reports (default 42); null: no duration in any format. */
  transcriptionDuration: number | null;
  /**
   * Non-zero: answers grow past this many bytes before their usage (chat logprobs, embedding values,
   * many SSE chunks, transcription segments), the usage itself unchanged.
   */
  padAnswerBytes: number;
  /** The retry-after header of an 'error-429' answer (none when null). */
  retryAfter: string | null;
  close(): Promise<void>;
}

/** Logprob entries of about `bytes` bytes in all. */
function padLogprobs(bytes: number): unknown[] {
  const one = { token: 'x', logprob: -0.01, bytes: [120], top_logprobs: [] };
  return new Array(Math.ceil(bytes / JSON.stringify(one).length)).fill(one);
}

function chunk(id: string, model: string, delta: Record<string, unknown>, finish: string | null, withUsageNull: boolean): string {
  const obj: Record<string, unknown> = { id, object: 'chat.completion.chunk', created: 1, model, choices: [{ index: 0, delta, finish_reason: finish }] };
  if (withUsageNull) obj.usage = null;
  return `data: ${JSON.stringify(obj)}\n\n`;
}

export async function startFakeUpstream(): Promise<FakeUpstream> {
  let mode: UpstreamMode = 'normal';
  const requests: UpstreamRequest[] = [];
  let releaseWaiters: Array<() => void> = [];
  let requestWaiters: Array<() => void> = [];
  let closeWaiters: Array<() => void> = [];
  let heldWaiters: Array<() => void> = [];
  const sockets = new Set<import('node:net').Socket>();

  const onRequest = (req: IncomingMessage, res: ServerResponse, raw: Buffer) => {
    let body: any = undefined;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      body = raw.toString('utf8');
    }
    requests.push({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, body });
    for (const w of requestWaiters) w();
    res.on('close', () => {
      if (!res.writableFinished) for (const w of closeWaiters.splice(0)) w();
    });
    const model = typeof body?.model === 'string' ? body.model : 'unknown';
    if (mode === 'stall') return;
    if (mode === 'hold-head') {
      hold(() => answerRequest(req, res, body, model, 'normal'));
      return;
    }
    answerRequest(req, res, body, model, mode);
  };

  const hold = (go: () => void) => {
    releaseWaiters.push(go);
    for (const w of [...heldWaiters]) w();
  };

  const answerRequest = (req: IncomingMessage, res: ServerResponse, body: any, model: string, mode: UpstreamMode) => {
    if (mode === 'error-503') {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'upstream overloaded', type: 'server_error', param: null, code: null } }));
      return;
    }
    if (mode === 'error-429') {
      res.writeHead(429, { 'content-type': 'application/json', ...(fake.retryAfter === null ? {} : { 'retry-after': fake.retryAfter }) });
      res.end(JSON.stringify({ error: { message: 'upstream says slow down', type: 'requests', param: null, code: 'rate_limit_exceeded' } }));
      return;
    }
    if (req.url?.endsWith('/embeddings')) {
      const usage = mode === 'no-usage' ? {} : { usage: { prompt_tokens: 7, total_tokens: 7 } };
      const embedding = fake.padAnswerBytes > 0 ? new Array(Math.ceil(fake.padAnswerBytes / 20)).fill(0.0123456789012345) : [1, 0];
      const text = JSON.stringify({ object: 'list', data: [{ object: 'embedding', index: 0, embedding }], model, ...usage });
      if (mode === 'reset-mid-body') {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(text.length) });
        res.write(text.slice(0, 10));
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(text);
      return;
    }
    if (req.url?.endsWith('/audio/speech')) {
      res.writeHead(200, { 'content-type': 'audio/mpeg', 'content-length': String(SPEECH_BYTES) });
      if (mode === 'reset-mid-body') {
        res.write(Buffer.alloc(1024, 1));
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      }
      res.end(Buffer.alloc(SPEECH_BYTES, 1));
      return;
    }
    const words = ['Hello', ' from', ' the', ' fake', ' upstream', '.'];
    if (body?.stream === true) {
      const includeUsage = body?.stream_options?.include_usage === true && mode !== 'no-usage';
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write(chunk('up-1', model, { role: 'assistant', content: words[0] }, null, includeUsage));
      const rest = () => {
        for (const w of words.slice(1)) res.write(chunk('up-1', model, { content: w }, null, includeUsage));
        // Padding: chunks with no content (only their bytes count), as a long logprobs stream's.
        for (let sent = 0; sent < fake.padAnswerBytes; ) {
          const c = `data: ${JSON.stringify({ id: 'up-1', object: 'chat.completion.chunk', created: 1, model, choices: [{ index: 0, delta: {}, logprobs: { content: [], pad: 'x'.repeat(4000) }, finish_reason: null }] })}\n\n`;
          res.write(c);
          sent += c.length;
        }
        res.write(chunk('up-1', model, {}, 'stop', includeUsage));
        if (includeUsage) {
          res.write(`data: ${JSON.stringify({ id: 'up-1', object: 'chat.completion.chunk', created: 1, model, choices: [], usage: { prompt_tokens: 11, completion_tokens: 6, total_tokens: 17 } })}\n\n`);
        }
        res.end('data: [DONE]\n\n');
      };
      if (mode === 'hold-stream') hold(rest);
      else if (mode === 'reset-mid-body') setTimeout(() => res.socket?.destroy(), 20);
      else rest();
      return;
    }
    const answer = {
      id: 'up-2',
      object: 'chat.completion',
      created: 1,
      model,
      choices: [{ index: 0, message: { role: 'assistant', content: words.join('') }, finish_reason: 'stop', ...(fake.padAnswerBytes > 0 ? { logprobs: { content: padLogprobs(fake.padAnswerBytes) } } : {}) }],
      ...(mode === 'no-usage' ? {} : { usage: { prompt_tokens: 11, completion_tokens: 6, total_tokens: 17 } }),
    };
    const text = JSON.stringify(answer);
    if (mode === 'reset-mid-body') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(text.length) });
      res.write(text.slice(0, 10));
      setTimeout(() => res.socket?.destroy(), 20);
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(text);
  };

  const onTranscription = (req: IncomingMessage, res: ServerResponse) => {
    const upload: UploadRecord = { bytes: 0, model: null, responseFormat: null, ended: false };
    requests.push({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, body: upload });
    for (const w of requestWaiters) w();
    res.on('close', () => {
      if (!res.writableFinished) for (const w of closeWaiters.splice(0)) w();
    });
    let first = Buffer.alloc(0);
    let last = Buffer.alloc(0);
    let held = false;
    req.on('data', (c: Buffer) => {
      upload.bytes += c.length;
      if (first.length < UPLOAD_EDGE_BYTES) first = Buffer.concat([first, c.subarray(0, UPLOAD_EDGE_BYTES - first.length)]);
      last = Buffer.concat([last, c]);
      if (last.length > UPLOAD_EDGE_BYTES) last = last.subarray(last.length - UPLOAD_EDGE_BYTES);
      // Leaves the gateway with the rest of the upload on its hands.
      if (mode === 'hold-body' && !held) {
        held = true;
        req.pause();
        releaseWaiters.push(() => req.resume());
      }
    });
    req.on('end', () => {
      upload.ended = true;
      upload.model = multipartModel(first) ?? multipartModel(last);
      upload.responseFormat = multipartModel(first, 'response_format') ?? multipartModel(last, 'response_format');
      if (mode === 'stall') return;
      const answer = () => {
        if (mode === 'error-429') {
          res.writeHead(429, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: { message: 'upstream says slow down', type: 'requests', param: null, code: 'rate_limit_exceeded' } }));
          return;
        }
        const text = `Fake transcription of ${upload.bytes} bytes.`;
        const duration = fake.transcriptionDuration;
        switch (upload.responseFormat ?? 'json') {
          case 'verbose_json': {
            res.writeHead(200, { 'content-type': 'application/json' });
            const segments = fake.padAnswerBytes > 0 ? padLogprobs(fake.padAnswerBytes) : [];
            // OpenAI puts `duration` before `segments`: a reader must find it ahead of a long answer.
            res.end(JSON.stringify({ task: 'transcribe', language: 'english', ...(duration === null ? {} : { duration }), text, segments }));
            return;
          }
          case 'text':
            res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
            res.end(text);
            return;
          case 'srt':
            res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
            res.end(`1\n00:00:00,000 --> 00:00:02,000\n${text}\n`);
            return;
          case 'vtt':
            res.writeHead(200, { 'content-type': 'text/vtt; charset=utf-8' });
            res.end(`WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n${text}\n`);
            return;
          default:
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ text }));
        }
      };
      if (mode === 'hold-head') hold(answer);
      else if (mode === 'reset-mid-body') {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' });
        res.write('{"text":"');
        setTimeout(() => res.socket?.destroy(), 20);
      } else answer();
    });
  };

  const server: Server = createServer((req, res) => {
    if (req.url?.endsWith('/audio/transcriptions')) return onTranscription(req, res);
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => onRequest(req, res, Buffer.concat(parts)));
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  const port = await listenLocal(server);

  const fake: FakeUpstream = {
    transcriptionDuration: 42,
    padAnswerBytes: 0,
    retryAfter: null,
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    setMode(m) {
      mode = m;
    },
    release() {
      for (const r of releaseWaiters.splice(0)) r();
    },
    waitForRequests(n) {
      return new Promise((resolve) => {
        const check = () => {
          if (requests.length >= n) {
            requestWaiters = requestWaiters.filter((w) => w !== check);
            resolve();
          }
        };
        requestWaiters.push(check);
        check();
      });
    },
    waitForClientClose() {
      return new Promise((resolve) => closeWaiters.push(resolve));
    },
    waitForHeld(n) {
      return new Promise((resolve) => {
        const check = () => {
          if (releaseWaiters.length >= n) {
            heldWaiters = heldWaiters.filter((w) => w !== check);
            resolve();
          }
        };
        heldWaiters.push(check);
        check();
      });
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return fake;
}
