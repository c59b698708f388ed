// Pure parts of the proxy: the tokenizer and SSE usage extraction (the multipart model finder has its
// own file, data-plane-multipart-model.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
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
