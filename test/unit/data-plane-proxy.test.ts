// Pure parts of the proxy: the tokenizer, SSE usage extraction, and the multipart model finder.
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { test } from 'node:test';
import { boundaryOf, findModelField, type ModelField } from '../../data-plane/proxy/multipart-model.js';
import { SseUsage } from '../../data-plane/proxy/providers/openai.js';
import { countTokens, truncateTokens } from '../../data-plane/proxy/tokens.js';

test('tokenizer: words and punctuation', () => {
  const table: Array<[string, number]> = [
    ['', 0],
    ['Hello', 1],
    ['Hello, world!', 4],
    ['  spaced   out  ', 2],
    ["don't", 3],
    ['héllo wörld', 2],
  ];
  for (const [text, n] of table) assert.equal(countTokens(text), n, text);
  assert.deepEqual(truncateTokens('one two three', 2), { text: 'one two', tokens: 2, cut: true });
  assert.deepEqual(truncateTokens('one two', 5), { text: 'one two', tokens: 2, cut: false });
});

const ev = (obj: unknown) => `data: ${JSON.stringify(obj)}\n\n`;

test('SSE: passes events as they complete, reads usage and strips what only the gateway asked for', () => {
  const s = new SseUsage(true);
  const a = ev({ choices: [{ delta: { content: 'Hi' } }], usage: null });
  const u = ev({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } });
  // An event split across chunks is held until complete.
  assert.equal(s.transform(Buffer.from(a.slice(0, 10))), '');
  assert.equal(s.transform(Buffer.from(a.slice(10))), ev({ choices: [{ delta: { content: 'Hi' } }] }));
  assert.equal(s.transform(Buffer.from(u + 'data: [DONE]\n\n')), 'data: [DONE]\n\n');
  assert.deepEqual(s.usage, { prompt_tokens: 3, completion_tokens: 1 });
  assert.equal(s.flush(), '');
});

test('SSE: a client that asked for usage gets it untouched; no usage means counting', () => {
  const keep = new SseUsage(false);
  const u = ev({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } });
  assert.equal(keep.transform(Buffer.from(u)), u);
  const none = new SseUsage(true);
  none.transform(Buffer.from(ev({ choices: [{ delta: { content: 'Hello there.' } }] }) + 'data: [DONE]\n\n'));
  assert.equal(none.usage, null);
  assert.equal(none.countedCompletionTokens(), 3);
});

function multipart(boundary: string, parts: Array<[string, string, string?]>): Buffer {
  let s = '';
  for (const [name, value, filename] of parts) {
    s += `--${boundary}\r\nContent-Disposition: form-data; name="${name}"${filename ? `; filename="${filename}"` : ''}\r\n`;
    if (filename) s += 'Content-Type: application/octet-stream\r\n';
    s += `\r\n${value}\r\n`;
  }
  return Buffer.from(`${s}--${boundary}--\r\n`);
}

function find(body: Buffer, boundary: string, chunk: number): Promise<{ err: unknown; field: ModelField | null }> {
  const parts: Buffer[] = [];
  for (let i = 0; i < body.length; i += chunk) parts.push(body.subarray(i, i + chunk));
  const stream = Readable.from(parts, { objectMode: false });
  return new Promise((resolve) => findModelField(stream, boundary, (err, field) => resolve({ err, field })));
}

test('multipart: the model field is found after a file part, at any chunking, and its bytes located', async () => {
  const b = 'XyZ123';
  const body = multipart(b, [['file', `audio--XyZ12 not a boundary ${'a'.repeat(500)}`, 'a.wav'], ['model', 'demo-transcribe'], ['language', 'en']]);
  for (const chunk of [1, 7, 64, 100_000]) {
    const { err, field } = await find(body, b, chunk);
    assert.equal(err, null);
    assert.equal(field!.model, 'demo-transcribe');
    assert.equal(field!.prefix.subarray(field!.modelValueStart, field!.modelValueEnd).toString(), 'demo-transcribe');
  }
  const missing = await find(multipart(b, [['file', 'x', 'a.wav']]), b, 5);
  assert.equal((missing.err as { param?: string }).param, 'model');
  assert.equal(boundaryOf('multipart/form-data; boundary=----abc'), '----abc');
  assert.equal(boundaryOf('multipart/form-data; boundary="q r"'), 'q r');
  assert.equal(boundaryOf('application/json'), null);
});
