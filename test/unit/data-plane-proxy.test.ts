// Pure parts of the proxy: the tokenizer and SSE usage extraction (the multipart model finder has its
// own file, data-plane-multipart-model.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SseUsage, usageAtEnd } from '../../data-plane/proxy/providers/openai.js';
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
  assert.equal(String(s.transform(Buffer.from(a.slice(0, 10)))), '');
  assert.equal(String(s.transform(Buffer.from(a.slice(10)))), ev({ choices: [{ delta: { content: 'Hi' } }] }));
  assert.equal(String(s.transform(Buffer.from(u + 'data: [DONE]\n\n'))), 'data: [DONE]\n\n');
  assert.deepEqual(s.usage, { prompt_tokens: 3, completion_tokens: 1 });
  assert.equal(s.flush(), '');
});

test('SSE: a client that asked for usage gets it untouched; no usage means counting', () => {
  const keep = new SseUsage(false);
  const u = ev({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } });
  assert.equal(String(keep.transform(Buffer.from(u))), u);
  const none = new SseUsage(true);
  none.transform(Buffer.from(ev({ choices: [{ delta: { content: 'Hello there.' } }] }) + 'data: [DONE]\n\n'));
  assert.equal(none.usage, null);
  assert.equal(none.countedCompletionTokens(), 3);
});

test('SSE: a block without usage goes on unchanged, a character split across chunks intact', () => {
  const s = new SseUsage(true);
  const e = Buffer.from(ev({ choices: [{ delta: { content: 'héllo wörld ✓' } }] }));
  const cut = e.indexOf('✓') + 1;
  assert.equal(String(s.transform(e.subarray(0, cut))), '');
  const out = s.transform(e.subarray(cut));
  assert.equal(String(out), e.toString());
  // The estimate (proxy/tokens.ts): 10 ASCII characters (3) and 3 others (a token each).
  assert.equal(s.countedCompletionTokens(), 6);
  assert.equal(s.flush(), '');
});

test('JSON answers: usage is read from the tail only when it is the top-level object\'s last member', () => {
  const u = { prompt_tokens: 9, completion_tokens: 21, total_tokens: 30, completion_tokens_details: { reasoning_tokens: 0 } };
  const table: Array<[string, unknown]> = [
    [JSON.stringify({ id: 'x', choices: [], usage: u }), u],
    [JSON.stringify({ id: 'x', choices: [], usage: u }, null, 2), u],
    [JSON.stringify({ usage: u }), u],
    // Not last: the whole answer must be parsed.
    [JSON.stringify({ usage: u, id: 'x' }), null],
    // Nested, not top-level.
    [JSON.stringify({ id: 'x', meta: { usage: u } }), null],
    // Inside a string value: escaped quotes never match.
    [JSON.stringify({ id: 'x', choices: [{ message: { content: '{"usage":{"prompt_tokens":1}}' } }] }), null],
    [JSON.stringify({ id: 'x', choices: [{ message: { content: 'a "usage": {"prompt_tokens": 1}}' } }], usage: u }), u],
    // Strings with braces and escapes inside usage.
    [JSON.stringify({ id: 'x', usage: { prompt_tokens: 1, note: 'a } \\ " {' } }), { prompt_tokens: 1, note: 'a } \\ " {' }],
    // Not an object, truncated, or trailing garbage.
    [JSON.stringify({ id: 'x', usage: null }), null],
    ['{"id":"x","usage":{"prompt_tokens":1}', null],
    ['{"id":"x","usage":{"prompt_tokens":1}}}', null],
    ['{"id":"x","usage":{"prompt_tokens":1}} x', null],
    ['', null],
  ];
  for (const [text, want] of table) assert.deepEqual(usageAtEnd(text), want, text);
});

// Before the fix an upstream that never ended an event made the node hold (and re-copy on every
// chunk) everything it sent, without bound.
test('SSE: an "event" over 1 MiB without a blank line is passed on, not held', () => {
  const s = new SseUsage(true);
  const big = Buffer.alloc(512 * 1024, 'a');
  assert.equal(String(s.transform(big)), '');
  const out = String(s.transform(big)) + String(s.transform(big));
  assert.equal(out.length, 3 * big.length);
  assert.equal(s.flush(), '');
});
