// Pure parts of the proxy: the tokenizer and SSE usage extraction (the multipart model finder has its
// own file, data-plane-proxy-multipart-model.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SseUsageReader } from '../../data-plane/proxy/usage/sse-usage-reader.js';
import { JsonUsageReader } from '../../data-plane/proxy/usage/usage-readers.js';
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
  const s = new SseUsageReader(true);
  const a = ev({ choices: [{ delta: { content: 'Hi' } }], usage: null });
  const u = ev({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } });
  // An event split across chunks is held until complete.
  assert.equal(String(s.transform(Buffer.from(a.slice(0, 10)))), '');
  assert.equal(String(s.transform(Buffer.from(a.slice(10)))), ev({ choices: [{ delta: { content: 'Hi' } }] }));
  assert.equal(String(s.transform(Buffer.from(u + 'data: [DONE]\n\n'))), 'data: [DONE]\n\n');
  assert.deepEqual(s.usage, { promptTokens: 3, completionTokens: 1 });
  assert.equal(s.flush(), '');
});

test('SSE: a client that asked for usage gets it untouched; no usage means counting', () => {
  const keep = new SseUsageReader(false);
  const u = ev({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } });
  assert.equal(String(keep.transform(Buffer.from(u))), u);
  const none = new SseUsageReader(true);
  none.transform(Buffer.from(ev({ choices: [{ delta: { content: 'Hello there.' } }] }) + 'data: [DONE]\n\n'));
  assert.equal(none.usage, null);
  assert.equal(none.countedCompletionTokens(), 3);
});

test('SSE: a block without usage goes on unchanged, a character split across chunks intact', () => {
  const s = new SseUsageReader(true);
  const e = Buffer.from(ev({ choices: [{ delta: { content: 'héllo wörld ✓' } }] }));
  const cut = e.indexOf('✓') + 1;
  assert.equal(String(s.transform(e.subarray(0, cut))), '');
  const out = s.transform(e.subarray(cut));
  assert.equal(String(out), e.toString());
  // The estimate (proxy/tokens.ts): 10 ASCII characters (3) and 3 others (a token each).
  assert.equal(s.countedCompletionTokens(), 6);
  assert.equal(s.flush(), '');
});

test('JSON answers: the top-level usage is read wherever it stands, however the answer is cut into chunks', () => {
  const u = { prompt_tokens: 9, completion_tokens: 21, total_tokens: 30, completion_tokens_details: { reasoning_tokens: 0 } };
  const want = { promptTokens: 9, completionTokens: 21 };
  const table: Array<[string, unknown]> = [
    [JSON.stringify({ id: 'x', choices: [], usage: u }), want],
    [JSON.stringify({ id: 'x', choices: [], usage: u }, null, 2), want],
    [JSON.stringify({ usage: u }), want],
    // Not last (OpenAI puts service_tier and system_fingerprint after it).
    [JSON.stringify({ usage: u, id: 'x', system_fingerprint: 'fp' }), want],
    // Nested, not top-level.
    [JSON.stringify({ id: 'x', meta: { usage: u } }), null],
    // Inside a string value.
    [JSON.stringify({ id: 'x', choices: [{ message: { content: '{"usage":{"prompt_tokens":1}}' } }] }), null],
    [JSON.stringify({ id: 'x', choices: [{ message: { content: 'a \\"usage\\": {"prompt_tokens": 1}}' } }], usage: u }), want],
    // Strings with braces and escapes inside usage; a key spelled with escapes.
    [JSON.stringify({ id: 'x', usage: { prompt_tokens: 1, note: 'a } \\ " {' } }), { promptTokens: 1, completionTokens: 0 }],
    ['{"id":"x","\\u0075sage":{"prompt_tokens":2}}', { promptTokens: 2, completionTokens: 0 }],
    // Not an object, truncated.
    [JSON.stringify({ id: 'x', usage: null }), null],
    // Truncated after its usage: the usage the upstream reported stands.
    ['{"id":"x","usage":{"prompt_tokens":1}', { promptTokens: 1, completionTokens: 0 }],
    ['{"id":"x","usage":{"prompt_tokens":1', null],
    ['[{"usage":{"prompt_tokens":1}}]', null],
    ['', null],
  ];
  for (const [text, expected] of table) {
    for (const size of [1, 2, 3, 7, 64, 1 << 20]) {
      const r = new JsonUsageReader();
      const buf = Buffer.from(text);
      let out = '';
      for (let i = 0; i < buf.length; i += size) out += String(r.transform(buf.subarray(i, i + size)));
      out += r.flush();
      assert.deepEqual(r.usage, expected, `${text} in chunks of ${size}`);
      assert.equal(out, text, 'passed on unchanged');
    }
  }
});

// Before the fix an upstream that never ended an event made the node hold (and re-copy on every
// chunk) everything it sent, without bound.
test('SSE: an "event" over 1 MiB without a blank line is passed on, not held', () => {
  const s = new SseUsageReader(true);
  const big = Buffer.alloc(512 * 1024, 'a');
  assert.equal(String(s.transform(big)), '');
  const out = String(s.transform(big)) + String(s.transform(big));
  assert.equal(out.length, 3 * big.length);
  assert.equal(s.flush(), '');
});
