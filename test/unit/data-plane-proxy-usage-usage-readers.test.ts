// The usage readers and the price math as tables: realtime event types as JSON.parse reads them,
// usage read from JSON and SSE answers of any size in bounded memory, and cost from usage details.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { eventTypeOf } from '../../data-plane/realtime/event-scan.js';
import { upstreamErrorAnswer } from '../../data-plane/proxy/upstream-errors.js';
import { SseUsageReader } from '../../data-plane/proxy/usage/sse-usage-reader.js';
import { JsonUsageReader, tokenUsageOf } from '../../data-plane/proxy/usage/usage-readers.js';
import { usageCostMicros, usdNumberText, type TokenCounts, type TokenPrices } from '../../proto/lib/money.js';

test('realtime events are told apart by their parsed top-level type only', () => {
  const cases: Array<[string, string | undefined]> = [
    ['{"type":"response.done","response":{"metadata":{"note":"response.created"}}}', 'response.done'],
    ['{"event_id":"e1","response":{"type":"response.created"},"type":"response.done"}', 'response.done'],
    ['{"response":{"metadata":{"x":"\\"type\\":\\"response.created\\""}},"type":"response.done"}', 'response.done'],
    ['{"type":"response.created","type":"response.done"}', 'response.done'],
    ['{"ty\\u0070e":"response.done"}', 'response.done'],
    ['{"type":"response.d\\u006fne"}', 'response.done'],
    [' { "type" : "response.created" , "n" : 1 , "b" : true , "z" : null } ', 'response.created'],
    ['{"delta":"' + 'A'.repeat(100_000) + '","type":"response.output_audio.delta"}', 'response.output_audio.delta'],
    ['{"note":"response.done"}', undefined],
    ['{"type":7}', undefined],
    ['{"type":"response.done"', undefined],
    ['{"type":"response.done"} x', undefined],
    ['["type","response.done"]', undefined],
    ['{}', undefined],
    ['', undefined],
  ];
  for (const [text, want] of cases) {
    assert.equal(eventTypeOf(Buffer.from(text)), want, text.slice(0, 80));
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    const viaParse = parsed && typeof parsed === 'object' && !Array.isArray(parsed) && typeof (parsed as any).type === 'string' ? (parsed as any).type : undefined;
    assert.equal(viaParse, want, `JSON.parse agrees: ${text.slice(0, 80)}`);
  }
});

test('usage of every OpenAI-compatible shape is read as tokens and the parts priced apart', () => {
  const table: Array<[unknown, unknown]> = [
    [{ prompt_tokens: 12, completion_tokens: 4000, total_tokens: 4012 }, { promptTokens: 12, completionTokens: 4000 }],
    // Chat with cached and audio input, audio output, reasoning inside completion_tokens.
    [
      { prompt_tokens: 100, completion_tokens: 50, prompt_tokens_details: { cached_tokens: 40, audio_tokens: 30 }, completion_tokens_details: { reasoning_tokens: 20, audio_tokens: 10 } },
      { promptTokens: 100, completionTokens: 50, cachedPromptTokens: 40, audioPromptTokens: 30, audioCompletionTokens: 10 },
    ],
    // Responses API naming.
    [{ input_tokens: 10, output_tokens: 5, input_tokens_details: { cached_tokens: 4 } }, { promptTokens: 10, completionTokens: 5, cachedPromptTokens: 4 }],
    // Realtime: cached audio among the cached tokens.
    [
      { input_tokens: 200, output_tokens: 80, input_token_details: { text_tokens: 50, audio_tokens: 150, cached_tokens: 60, cached_tokens_details: { text_tokens: 20, audio_tokens: 40 } }, output_token_details: { text_tokens: 30, audio_tokens: 50 } },
      { promptTokens: 200, completionTokens: 80, cachedPromptTokens: 60, audioPromptTokens: 150, cachedAudioPromptTokens: 40, audioCompletionTokens: 50 },
    ],
    // OpenRouter: cache writes inside prompt_tokens.
    [{ prompt_tokens: 194, completion_tokens: 2, prompt_tokens_details: { cached_tokens: 0, cache_write_tokens: 100 } }, { promptTokens: 194, completionTokens: 2, cacheWriteTokens: 100 }],
    // Anthropic style beside input_tokens: reads and writes added to it.
    [{ input_tokens: 10, output_tokens: 3, cache_read_input_tokens: 100, cache_creation_input_tokens: 20 }, { promptTokens: 130, completionTokens: 3, cachedPromptTokens: 100, cacheWriteTokens: 20 }],
    // An upstream whose total counts reasoning outside completion_tokens: the rest is output.
    [{ prompt_tokens: 10, completion_tokens: 5, total_tokens: 40 }, { promptTokens: 10, completionTokens: 30 }],
    // Bad values: cleaned as request-context.ts cleanCount does.
    [{ prompt_tokens: 1.5, completion_tokens: -3 }, { promptTokens: 2, completionTokens: 0 }],
    [{ type: 'duration', seconds: 12 }, null],
    [null, null],
    [[1, 2], null],
  ];
  for (const [u, want] of table) assert.deepEqual(tokenUsageOf(u), want, JSON.stringify(u));
});

test('price math: cached at the cached price (else the input price, never 0), audio at the audio prices, one rounding up', () => {
  const base = { inputMicrosPerMtok: 2_500_000, outputMicrosPerMtok: 10_000_000 };
  const full = { ...base, cachedInputMicrosPerMtok: 1_250_000, cacheWriteMicrosPerMtok: 3_125_000, inputAudioMicrosPerMtok: 40_000_000, outputAudioMicrosPerMtok: 80_000_000 };
  const table: Array<[TokenCounts, TokenPrices, number]> = [
    [{ promptTokens: 12, completionTokens: 4000 }, { inputMicrosPerMtok: 1_000_000, outputMicrosPerMtok: 10_000_000 }, 40_012],
    [{ promptTokens: 1_000_000, completionTokens: 0, cachedPromptTokens: 400_000 }, base, 2_500_000],
    [{ promptTokens: 1_000_000, completionTokens: 0, cachedPromptTokens: 400_000 }, full, 600_000 * 2.5 + 400_000 * 1.25],
    [{ promptTokens: 1_000_000, completionTokens: 0, cacheWriteTokens: 1_000_000 }, full, 3_125_000],
    [{ promptTokens: 1_000_000, completionTokens: 0, cacheWriteTokens: 1_000_000 }, base, 2_500_000],
    // Realtime: 200 in (150 audio of which 40 cached, 20 cached text), 80 out (50 audio).
    [
      { promptTokens: 200, completionTokens: 80, cachedPromptTokens: 60, audioPromptTokens: 150, cachedAudioPromptTokens: 40, audioCompletionTokens: 50 },
      full,
      Math.ceil((30 * 2_500_000 + 20 * 1_250_000 + 40 * 1_250_000 + 110 * 40_000_000 + 30 * 10_000_000 + 50 * 80_000_000) / 1_000_000),
    ],
    // Without a cached price, cached audio is billed at the audio price.
    [{ promptTokens: 100, completionTokens: 0, cachedPromptTokens: 100, audioPromptTokens: 100, cachedAudioPromptTokens: 100 }, { ...base, inputAudioMicrosPerMtok: 40_000_000 }, 4_000],
    // Parts larger than their whole are cut to it.
    [{ promptTokens: 10, completionTokens: 10, cachedPromptTokens: 50, audioCompletionTokens: 99 }, full, Math.ceil((10 * 1_250_000 + 10 * 80_000_000) / 1_000_000)],
    // One rounding up for the whole request.
    [{ promptTokens: 1, completionTokens: 1 }, { inputMicrosPerMtok: 1, outputMicrosPerMtok: 1 }, 1],
    [{ promptTokens: 0, completionTokens: 0 }, full, 0],
    // Beyond the safe integers: exact.
    [{ promptTokens: 100_000_000, completionTokens: 100_000_000 }, { inputMicrosPerMtok: 900_000_000_000, outputMicrosPerMtok: 900_000_000_000 }, 180_000_000_000_000],
  ];
  for (const [c, p, want] of table) assert.equal(usageCostMicros(c, p), want, JSON.stringify([c, p]));
  assert.equal(usdNumberText(40_012), '0.040012');
  assert.equal(usdNumberText(1_000_000), '1.000000');
  assert.equal(usdNumberText(0), '0.000000');
});

test('JSON answers with a pricer: usage.cost written into the usage object, the upstream\'s own cost dropped', () => {
  const usage = { prompt_tokens: 12, completion_tokens: 4000, cost: 0.95, cost_details: { upstream_inference_cost: 19 } };
  const answer = JSON.stringify({ id: 'x', choices: [{ message: { content: 'hi "usage": {}' } }], usage, system_fingerprint: 'fp' });
  for (const size of [1, 5, 17, 1 << 20]) {
    const r = new JsonUsageReader([], (u) => u.promptTokens * 1000 + u.completionTokens * 10);
    const buf = Buffer.from(answer);
    let out = '';
    for (let i = 0; i < buf.length; i += size) out += String(r.transform(buf.subarray(i, i + size)));
    out += r.flush();
    const parsed = JSON.parse(out);
    assert.deepEqual(parsed.usage, { prompt_tokens: 12, completion_tokens: 4000, cost: 0.052 }, `chunks of ${size}`);
    assert.match(out, /"cost":0\.052000\}/);
    assert.equal(parsed.system_fingerprint, 'fp');
    assert.equal(parsed.choices[0].message.content, 'hi "usage": {}');
    assert.equal(r.chargedMicros, 52_000);
  }
});

test('SSE with a pricer: the chunk carrying usage gets usage.cost; CRLF framing is read too', () => {
  const r = new SseUsageReader(false, (u) => u.promptTokens + u.completionTokens);
  const text = 'data: {"choices":[{"delta":{"content":"Hi"}}]}\r\n\r\n' + 'event: x\r\ndata: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\r\n\r\n' + 'data: [DONE]\r\n\r\n';
  let out = '';
  for (let i = 0; i < text.length; i += 5) out += r.transform(Buffer.from(text.slice(i, i + 5)));
  out += r.flush();
  assert.deepEqual(r.usage, { promptTokens: 3, completionTokens: 1 });
  assert.match(out, /data: \{"choices":\[\],"usage":\{"prompt_tokens":3,"completion_tokens":1,"cost":0\.000004\}\}/);
  assert.match(out, /data: \[DONE\]/);
});

// Before the fix, SseUsage.keep held every event of a stream until its usage chunk came: 200 MiB fed
// left 211 MiB held. Now what a reader holds is bounded whatever the stream's length.
test('SSE: 64 MiB of content then the usage chunk: the reader holds a bounded amount throughout and reads the usage', () => {
  const r = new SseUsageReader(true);
  const event = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'word '.repeat(40) }, logprobs: null }], usage: null })}\n\n`;
  const chunk = Buffer.from(event.repeat(Math.floor((64 * 1024) / event.length)));
  let fed = 0;
  let maxHeld = 0;
  while (fed < 64 * 1024 * 1024) {
    r.transform(chunk);
    fed += chunk.length;
    maxHeld = Math.max(maxHeld, r.retainedBytes());
  }
  const out = String(r.transform(Buffer.from(`data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 12, completion_tokens: 4000 } })}\n\ndata: [DONE]\n\n`)));
  assert.equal(out, 'data: [DONE]\n\n');
  assert.deepEqual(r.usage, { promptTokens: 12, completionTokens: 4000 });
  assert.ok(maxHeld <= 2 * 1024 * 1024, `held at most ${maxHeld} bytes`);
  assert.equal(r.retainedBytes(), 0);
});

test('JSON: an answer of 64 MiB with its usage after the content: read, with a bounded amount held', () => {
  const r = new JsonUsageReader(['choices']);
  const head = Buffer.from('{"id":"x","object":"chat.completion","choices":[{"index":0,"logprobs":{"content":[');
  const item = '{"token":"a\\"b","logprob":-0.25,"bytes":[97],"top_logprobs":[]},';
  const middle = Buffer.from(item.repeat(Math.floor((64 * 1024) / item.length)));
  const tail = Buffer.from('{"token":"z","logprob":0}]},"message":{"role":"assistant","content":"z"}}],"usage":{"prompt_tokens":12,"completion_tokens":4000,"total_tokens":4012},"system_fingerprint":"fp"}');
  r.transform(head);
  let maxHeld = 0;
  for (let fed = 0; fed < 64 * 1024 * 1024; fed += middle.length) {
    assert.equal(r.transform(middle), middle, 'passed through as it came');
    maxHeld = Math.max(maxHeld, r.retainedBytes());
  }
  r.transform(tail);
  assert.deepEqual(r.usage, { promptTokens: 12, completionTokens: 4000 });
  assert.ok(maxHeld <= 1024 * 1024 + 64 * 1024, `held at most ${maxHeld} bytes`);
});

test('JSON with a pricer: an answer cut inside its usage object is passed on as it came, bytes intact', () => {
  const text = '{"id":"é","usage":{"prompt_tokens":1,"note":"ü"';
  const r = new JsonUsageReader([], () => 1);
  const out = Buffer.concat([r.transform(Buffer.from(text)), Buffer.from(r.flush())]);
  assert.equal(out.toString('utf8'), text);
});

test("upstream error answers: 401/403 become 502 in the route's shape, account ids masked, retry-after kept on 429 only", () => {
  const body = (o: unknown) => Buffer.from(JSON.stringify(o));
  const a401 = upstreamErrorAnswer(401, 'application/json', body({ error: { message: 'Incorrect API key provided: sk-proj-Ab12****wxYZ.' } }), undefined, 'openai');
  assert.equal(a401.status, 502);
  assert.deepEqual(Object.keys(JSON.parse(a401.body).error).sort(), ['code', 'message', 'param', 'type']);
  assert.doesNotMatch(a401.body, /sk-proj/);
  const a403 = upstreamErrorAnswer(403, 'application/json', body({}), undefined, 'gateway');
  assert.deepEqual(JSON.parse(a403.body), { error: { code: 'upstream_unreachable', message: JSON.parse(a403.body).error.message } });
  const a429 = upstreamErrorAnswer(429, 'application/json', body({ error: { message: 'Rate limit reached in organization org-AbCdEf123456 for user user-Zz99Yy88Xx', organization: 'acme-corp', code: 'rate_limit_exceeded' } }), '20', 'openai');
  assert.equal(a429.status, 429);
  assert.deepEqual(a429.headers, [['content-type', 'application/json'], ['retry-after', '20']]);
  assert.deepEqual(JSON.parse(a429.body), { error: { message: 'Rate limit reached in organization org-*** for user user-***', organization: '***', code: 'rate_limit_exceeded' } });
  // A retry-after that is not one is dropped; a 400 keeps no retry-after; text bodies are masked too.
  assert.deepEqual(upstreamErrorAnswer(429, 'application/json', body({}), 'soon\r\nx: y', 'openai').headers, [['content-type', 'application/json']]);
  assert.deepEqual(upstreamErrorAnswer(400, 'application/json', body({}), '5', 'openai').headers, [['content-type', 'application/json']]);
  const text = upstreamErrorAnswer(500, 'text/plain', Buffer.from('upstream proj_abcdef1234 failed'), undefined, 'openai');
  assert.deepEqual([text.status, text.body, text.headers], [500, 'upstream proj_*** failed', [['content-type', 'text/plain']]]);
});

test("a chat JSON answer's usage is held until its service_tier, after it, is read: usage.cost priced by the tier reported", () => {
  // Before, the usage was priced as soon as it ended, before the tier that follows it in OpenAI's answers.
  const answer = JSON.stringify({ id: 'x', choices: [], usage: { prompt_tokens: 10, completion_tokens: 1 }, service_tier: 'priority', system_fingerprint: 'fp' });
  for (const size of [1, 7, 1 << 20]) {
    const r = new JsonUsageReader(['service_tier'], (u, facts) => (facts.serviceTier === 'priority' ? 2 : 1) * (u.promptTokens + u.completionTokens));
    const buf = Buffer.from(answer);
    let out = '';
    for (let i = 0; i < buf.length; i += size) out += String(r.transform(buf.subarray(i, i + size)));
    out += r.flush();
    const parsed = JSON.parse(out);
    assert.equal(parsed.usage.cost, 0.000022, `chunks of ${size}`);
    assert.equal(parsed.service_tier, 'priority');
    assert.equal(parsed.system_fingerprint, 'fp');
    assert.deepEqual(r.facts(), { serviceTier: 'priority' });
  }
  // An answer cut after its usage: the usage goes out with the cost as far as known, nothing lost.
  const cut = new JsonUsageReader(['service_tier'], () => 5);
  const text = String(cut.transform(Buffer.from('{"usage":{"prompt_tokens":1,"completion_tokens":1},"service_t'))) + String(cut.flush());
  assert.equal(text, '{"usage":{"prompt_tokens":1,"completion_tokens":1,"cost":0.000005},"service_t');
});
