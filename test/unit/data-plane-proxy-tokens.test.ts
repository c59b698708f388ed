// The one token estimator (data-plane/proxy/tokens.ts): what a key reserves against tpm and what is
// billed when a request ends without the upstream's usage. Before the fix, an aborted request was
// billed the words of its messages only: images, tools, the response_format schema, reasoning and
// tool-call output were free, and admission reserved by another rule (characters / 4).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { estimateOutputTokens, estimateTextTokens, estimateTokens } from '../../data-plane/proxy/tokens.js';


test('text: ASCII at 4 characters a token, any other character a token of its own', () => {
  const rows: Array<[string, number]> = [
    ['', 0],
    ['a', 1],
    ['abcd', 1],
    ['abcde', 2],
    ['日本語のテキスト', 8],
    ['ab日本', 1 + 2],
    ['😀', 2],
  ];
  for (const [text, want] of rows) assert.equal(estimateTextTokens(text), want, text);
});

test('everything sent counts: images by their detail, tools, functions, response_format, audio, files', () => {
  const schema = { type: 'json_schema', json_schema: { name: 'answer', schema: { type: 'object', properties: { city: { type: 'string' } } } } };
  const tools = [{ type: 'function', function: { name: 'lookup', description: 'Looks a city up', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const rows: Array<[string, unknown, number]> = [
    ['a low-detail image', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:x', detail: 'low' } }] }] }, 3 + 4 + 85],
    ['a high-detail image', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:x', detail: 'high' } }] }] }, 3 + 4 + 1445],
    ['an image at auto detail', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:x' } }] }] }, 3 + 4 + 1445],
    ['tools', { messages: [], tools }, 3 + Math.ceil(JSON.stringify(tools).length / 4)],
    ['legacy functions', { messages: [], functions: [{ name: 'f' }] }, 3 + Math.ceil(JSON.stringify([{ name: 'f' }]).length / 4)],
    ['a response_format schema', { messages: [], response_format: schema }, 3 + Math.ceil(JSON.stringify(schema).length / 4)],
    ['a plain-text response_format costs nothing', { messages: [], response_format: { type: 'text' } }, 3],
    ['input audio', { messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'A'.repeat(120_000), format: 'wav' } }] }] }, 3 + 4 + 100],
    ['a tool result message', { messages: [{ role: 'tool', tool_call_id: 'call_1', content: 'sunny' }] }, 3 + 4 + 2 + 2],
  ];
  for (const [name, body, want] of rows) assert.equal(estimateTokens(body), want, name);
  const file = { type: 'file', file: { filename: 'a.pdf', file_data: 'data:application/pdf;base64,' + 'A'.repeat(4000) } };
  assert.ok(estimateTokens({ messages: [{ role: 'user', content: [file] }] }) >= 1000, 'a file part counts its bytes');
});

test('everything received counts: text, reasoning, refusals, tool calls, in answers and in stream chunks', () => {
  const rows: Array<[string, unknown, number]> = [
    ['an answer', { choices: [{ message: { content: 'abcdefgh' } }] }, 2],
    ['reasoning', { choices: [{ message: { content: 'abcd', reasoning_content: 'x'.repeat(400) } }] }, 1 + 100],
    ['a refusal', { choices: [{ message: { content: null, refusal: 'abcd' } }] }, 1],
    ['tool calls', { choices: [{ message: { content: null, tool_calls: [{ function: { name: 'lookup', arguments: '{"q":"Paris"}' } }] } }] }, 2 + 4],
    ['a chunk', { choices: [{ delta: { content: 'abc' } }] }, 1],
    ['a reasoning chunk', { choices: [{ delta: { reasoning: 'abcdefgh' } }] }, 2],
    ['a tool-call chunk', { choices: [{ delta: { tool_calls: [{ index: 0, function: { arguments: '{"q":' } }] } }] }, 2],
    ['two choices', { choices: [{ message: { content: 'abcd' } }, { message: { content: 'abcd' } }] }, 2],
    ['a completions answer', { choices: [{ text: 'abcdefgh' }] }, 2],
    ['no choices', { usage: { prompt_tokens: 1 } }, 0],
    ['not an object', 'x', 0],
  ];
  for (const [name, answer, want] of rows) assert.equal(estimateOutputTokens(answer), want, name);
});

test('a hostile body estimates 0 and never throws', () => {
  const hostile = {
    get messages(): unknown {
      throw new Error('boom');
    },
  };
  assert.equal(estimateTokens(hostile), 0);
  assert.equal(estimateOutputTokens({ get choices(): unknown { throw new Error('boom'); } }), 0);
});
