// A fake OpenAI-compatible upstream (plain node:http) for data-plane tests. Its behaviour is set per
// test with setMode: answer normally, stream SSE and hold the rest until the test calls release(),
// stall (never answer), reset the connection mid-body, or answer an error status.
// Transcription uploads (/audio/transcriptions) are counted as they stream, never held: the recorded
// body is `{ bytes, model }`; 'hold-body' stops reading one after its first chunk until release().
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export type UpstreamMode = 'normal' | 'hold-stream' | 'stall' | 'reset-mid-body' | 'no-usage' | 'error-429' | 'hold-body';

/** What the fake records of a transcription upload; `bytes` grows while it streams in. */
export interface UploadRecord {
  bytes: number;
  /** The multipart `model` field's value, once the upload ended (null if none was seen). */
  model: string | null;
  ended: boolean;
}

/** Bytes kept from each end of an upload: enough for a model field sent first or last. */
const UPLOAD_EDGE_BYTES = 64 * 1024;

function multipartModel(edge: Buffer): string | null {
  const m = /content-disposition:[^\r\n]*; *name="model"[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n([^\r\n]*)\r\n/i.exec(edge.toString('latin1'));
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
  close(): Promise<void>;
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
    if (mode === 'error-429') {
      res.writeHead(429, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'upstream says slow down', type: 'requests', param: null, code: 'rate_limit_exceeded' } }));
      return;
    }
    if (req.url?.endsWith('/embeddings')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ object: 'embedding', index: 0, embedding: [1, 0] }], model, usage: { prompt_tokens: 7, total_tokens: 7 } }));
      return;
    }
    const words = ['Hello', ' from', ' the', ' fake', ' upstream', '.'];
    if (body?.stream === true) {
      const includeUsage = body?.stream_options?.include_usage === true && mode !== 'no-usage';
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write(chunk('up-1', model, { role: 'assistant', content: words[0] }, null, includeUsage));
      const rest = () => {
        for (const w of words.slice(1)) res.write(chunk('up-1', model, { content: w }, null, includeUsage));
        res.write(chunk('up-1', model, {}, 'stop', includeUsage));
        if (includeUsage) {
          res.write(`data: ${JSON.stringify({ id: 'up-1', object: 'chat.completion.chunk', created: 1, model, choices: [], usage: { prompt_tokens: 11, completion_tokens: 6, total_tokens: 17 } })}\n\n`);
        }
        res.end('data: [DONE]\n\n');
      };
      if (mode === 'hold-stream') releaseWaiters.push(rest);
      else if (mode === 'reset-mid-body') setTimeout(() => res.socket?.destroy(), 20);
      else rest();
      return;
    }
    const answer = {
      id: 'up-2',
      object: 'chat.completion',
      created: 1,
      model,
      choices: [{ index: 0, message: { role: 'assistant', content: words.join('') }, finish_reason: 'stop' }],
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
    const upload: UploadRecord = { bytes: 0, model: null, ended: false };
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
      if (mode === 'stall') return;
      if (mode === 'error-429') {
        res.writeHead(429, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'upstream says slow down', type: 'requests', param: null, code: 'rate_limit_exceeded' } }));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ text: `Fake transcription of ${upload.bytes} bytes.` }));
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
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
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
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
