// The built-in `demo` provider: answers locally, deterministically, with real token counts from the
// gateway's tokenizer, so the embedded default works with no network.
import { createHash } from 'node:crypto';
import { logBug } from '../../log.js';
import { usageCostMicros } from '../../../proto/lib/money.js';
import { countMessageTokens, countTokens, contentText, truncateTokens } from '../tokens.js';
import { withUsageCost } from '../usage/usage-cost.js';
import type { ModelCall, Provider, TranscriptionCall } from './provider.js';

const JSON_HEADERS = [['content-type', 'application/json']] as const;
const SSE_HEADERS = [
  ['content-type', 'text/event-stream; charset=utf-8'],
  ['cache-control', 'no-cache'],
] as const;

/** The reply text: derived from the last user message only. */
export function demoReplyText(messages: unknown): string {
  let last = '';
  if (Array.isArray(messages)) {
    for (let i = messages.length - 1; i >= 0; i--) {
      const m = messages[i] as { role?: unknown; content?: unknown } | null;
      if (m && m.role === 'user') {
        last = contentText(m.content).trim();
        break;
      }
    }
  }
  if (!last) return 'Hello from the Tollgate demo model.';
  return `You said: "${last}". This is the Tollgate demo model answering.`;
}

function maxTokensOf(body: Record<string, unknown>): number {
  const v = body.max_completion_tokens ?? body.max_tokens;
  return typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : Number.MAX_SAFE_INTEGER;
}

/** Splits a text into up to `parts` pieces at token boundaries (for streaming). */
export function splitText(text: string, parts: number): string[] {
  const total = countTokens(text);
  if (total <= 1 || parts <= 1) return [text];
  const per = Math.ceil(total / parts);
  const out: string[] = [];
  let rest = text;
  while (rest.length > 0) {
    const head = truncateTokens(rest, per);
    if (!head.cut) {
      out.push(rest);
      break;
    }
    out.push(head.text);
    rest = rest.slice(head.text.length);
  }
  return out;
}

/** 64-dimensional deterministic unit vector of a text. */
export function demoEmbedding(text: string): Float32Array {
  const v = new Float32Array(64);
  let block = createHash('sha256').update(text).digest();
  let sum = 0;
  for (let i = 0; i < 64; i++) {
    if (i % 8 === 0 && i > 0) block = createHash('sha256').update(block).digest();
    const x = block.readUInt32LE((i % 8) * 4) / 0xffffffff - 0.5;
    v[i] = x;
    sum += x * x;
  }
  const norm = Math.sqrt(sum) || 1;
  for (let i = 0; i < 64; i++) v[i] /= norm;
  return v;
}

/** A short mono 16-bit PCM WAV: a tone whose pitch depends on the voice, length on the text. */
export function demoWav(voiceIndex: number, chars: number): Buffer {
  const rate = 8000;
  const seconds = Math.min(2, 0.25 + chars * 0.01);
  const samples = Math.round(rate * seconds);
  const buf = Buffer.alloc(44 + samples * 2);
  buf.write('RIFF', 0);
  buf.writeUInt32LE(36 + samples * 2, 4);
  buf.write('WAVE', 8);
  buf.write('fmt ', 12);
  buf.writeUInt32LE(16, 16);
  buf.writeUInt16LE(1, 20); // PCM
  buf.writeUInt16LE(1, 22); // mono
  buf.writeUInt32LE(rate, 24);
  buf.writeUInt32LE(rate * 2, 28);
  buf.writeUInt16LE(2, 32);
  buf.writeUInt16LE(16, 34);
  buf.write('data', 36);
  buf.writeUInt32LE(samples * 2, 40);
  const freq = 220 * (1 + (voiceIndex % 4));
  for (let i = 0; i < samples; i++) buf.writeInt16LE(Math.round(Math.sin((2 * Math.PI * freq * i) / rate) * 8000), 44 + i * 2);
  return buf;
}

/** Seconds of audio billed for an upload of this many bytes (16 kHz 16-bit mono), at least 1. */
export function audioSecondsOf(bytes: number): number {
  return Math.max(1, Math.ceil(bytes / 32000));
}

export class DemoProvider implements Provider {
  chat(call: ModelCall): void {
    const { body, model, reply } = call;
    const promptTokens = countMessageTokens(body.messages);
    const full = demoReplyText(body.messages);
    const cut = truncateTokens(full, maxTokensOf(body));
    const text = cut.text;
    const completionTokens = cut.tokens;
    const finishReason = cut.cut ? 'length' : 'stop';
    const id = `chatcmpl-${call.requestId}`;
    const created = Math.floor(Date.now() / 1000);
    const usage = { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
    // Reported before the answer is written (it is written in full, synchronously), so the request is
    // settled when the response's cleanup runs.
    call.complete({ status: 200, promptTokens, completionTokens });
    // What the ledger records for it, shown as usage.cost (docs/billing.md).
    const micros = usageCostMicros({ promptTokens, completionTokens }, model);
    if (body.stream === true) {
      const so = body.stream_options as { include_usage?: unknown } | undefined;
      const includeUsage = !!so && so.include_usage === true;
      const base = { id, object: 'chat.completion.chunk', created, model: model.id, system_fingerprint: null };
      const event = (choices: unknown[], extra: Record<string, unknown> = {}) =>
        `data: ${JSON.stringify({ ...base, choices, ...(includeUsage ? { usage: null } : {}), ...extra })}\n\n`;
      reply.startStream(200, SSE_HEADERS);
      reply.write(event([{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]));
      for (const piece of splitText(text, 4)) {
        reply.write(event([{ index: 0, delta: { content: piece }, logprobs: null, finish_reason: null }]));
      }
      reply.write(event([{ index: 0, delta: {}, logprobs: null, finish_reason: finishReason }]));
      if (includeUsage) reply.write(`data: ${withUsageCost({ ...base, choices: [], usage }, micros)}\n\n`);
      reply.end('data: [DONE]\n\n');
    } else {
      const out = {
        id,
        object: 'chat.completion',
        created,
        model: model.id,
        choices: [{ index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null, finish_reason: finishReason }],
        usage,
        system_fingerprint: null,
      };
      reply.send(200, JSON_HEADERS, withUsageCost(out, micros));
    }
  }

  embeddings(call: ModelCall): void {
    const { body, model, reply } = call;
    const inputs: unknown[] = Array.isArray(body.input) && body.input.some((x) => typeof x !== 'number') ? body.input : [body.input];
    const base64 = body.encoding_format === 'base64';
    let promptTokens = 0;
    const data = inputs.map((input, index) => {
      const text = typeof input === 'string' ? input : JSON.stringify(input);
      promptTokens += typeof input === 'string' ? countTokens(input) : Array.isArray(input) ? input.length : 0;
      const vec = demoEmbedding(text);
      const embedding = base64 ? Buffer.from(vec.buffer, vec.byteOffset, vec.byteLength).toString('base64') : Array.from(vec);
      return { object: 'embedding', index, embedding };
    });
    const out = { object: 'list', data, model: model.id, usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } };
    call.complete({ status: 200, promptTokens, completionTokens: 0 });
    reply.send(200, JSON_HEADERS, withUsageCost(out, usageCostMicros({ promptTokens, completionTokens: 0 }, model)));
  }

  speech(call: ModelCall): void {
    const { body, model, reply } = call;
    const input = typeof body.input === 'string' ? body.input : '';
    const voiceIndex = Math.max(0, model.voices.indexOf(String(body.voice)));
    const wav = demoWav(voiceIndex, input.length);
    call.complete({ status: 200, promptTokens: 0, completionTokens: 0, audioUnits: input.length });
    // Known length: streamed with tryEnd and backpressure.
    reply.startStream(200, [['content-type', 'audio/wav']], wav.length);
    const CHUNK = 16 * 1024;
    let offset = 0;
    const pump = (): void => {
      while (offset < wav.length && !reply.done) {
        const chunk = wav.subarray(offset, offset + CHUNK);
        offset += chunk.length;
        if (!reply.write(chunk)) {
          reply.onDrain(pump);
          return;
        }
      }
    };
    pump();
  }

  transcription(call: TranscriptionCall): void {
    // Answers from the upload's size: what was read before the model field is counted, never read
    // back from a spill; the rest is consumed as a stream (with for-await, which also copes with a
    // stream that ended while the spill was being completed).
    const { rest, prefixBytes } = call.upload;
    const count = async (): Promise<number> => {
      let bytes = prefixBytes;
      for await (const chunk of rest) bytes += (chunk as Buffer).length;
      return bytes;
    };
    count()
      .then(
        (bytes) => {
          const seconds = audioSecondsOf(bytes);
          const text = `Demo transcription: ${seconds} second${seconds === 1 ? '' : 's'} of audio received.`;
          call.complete({ status: 200, promptTokens: 0, completionTokens: countTokens(text), audioUnits: seconds });
          call.reply.send(200, JSON_HEADERS, JSON.stringify({ text }));
        },
        (err) => call.fail(err),
      )
      .catch(logBug);
  }
}
