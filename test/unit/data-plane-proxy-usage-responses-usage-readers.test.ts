// The Responses API's pure parts: usage read from `usage` objects, the SSE and JSON readers of
// usage-readers.ts (event types parsed, never matched as substrings; the id read before its bytes go
// on), the stored-response paths, the owner records and the tpm estimate.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { estimateResponseTokens } from '../../data-plane/endpoints/responses/responses.js';
import { parseStoredResponsePath } from '../../data-plane/routing/responses-paths.js';
import { RESPONSE_RETENTION_MS, ResponseOwners } from '../../data-plane/state/response-owners.js';
import { ResponsesJsonReader, ResponsesSseReader } from '../../data-plane/proxy/usage/responses-usage-readers.js';
import { tokenUsageOf } from '../../data-plane/proxy/usage/usage-readers.js';
import { estimateTextTokens, estimateTokens } from '../../data-plane/proxy/tokens.js';
import { usageCostMicros, type TokenPrices } from '../../proto/lib/money.js';
import { LogColumns } from '../../proto/gen/tollgate/v1/sync.js';
import { scanLogBlock } from '../../proto/lib/log-block-scan.js';
import { decodeLogColumns, LogColumnsBuilder, type LogRow } from '../../proto/lib/log-columns.js';

test('tokenUsageOf reads the Responses usage shape: input, cached, output and reasoning tokens', () => {
  const rows: Array<[unknown, unknown]> = [
    [{ input_tokens: 10, output_tokens: 5 }, { promptTokens: 10, completionTokens: 5 }],
    [
      { input_tokens: 100, input_tokens_details: { cached_tokens: 40 }, output_tokens: 30, output_tokens_details: { reasoning_tokens: 20 }, total_tokens: 130 },
      { promptTokens: 100, completionTokens: 30, cachedPromptTokens: 40 },
    ],
    // Reasoning reported beside output (a total above input + output): the rest is output.
    [{ input_tokens: 10, output_tokens: 5, output_tokens_details: { reasoning_tokens: 7 }, total_tokens: 22 }, { promptTokens: 10, completionTokens: 12 }],
    // More reasoning than output and no total: the reasoning is billed as output.
    [{ input_tokens: 10, output_tokens: 5, output_tokens_details: { reasoning_tokens: 7 } }, { promptTokens: 10, completionTokens: 7 }],
    [{ input_tokens: -4, output_tokens: 'x' }, { promptTokens: 0, completionTokens: 0 }],
    [{ type: 'duration', seconds: 3 }, null],
    [null, null],
    [[1, 2], null],
  ];
  for (const [u, want] of rows) assert.deepEqual(tokenUsageOf(u), want, JSON.stringify(u));
  // Priced: cached tokens at the cached price, reasoning inside output at the output price; more
  // cached than input is cut to the input.
  const prices: TokenPrices = { inputMicrosPerMtok: 1_000_000, cachedInputMicrosPerMtok: 100_000, outputMicrosPerMtok: 4_000_000 };
  assert.equal(usageCostMicros(tokenUsageOf(rows[1][0])!, prices), Math.ceil((60 * 1_000_000 + 40 * 100_000 + 30 * 4_000_000) / 1e6));
  const over = tokenUsageOf({ input_tokens: 3_000_000, input_tokens_details: { cached_tokens: 9_000_000 }, output_tokens: 0 })!;
  assert.equal(usageCostMicros(over, prices), 300_000);
});

const ev = (type: string, fields: Record<string, unknown>, named = true) => `${named ? `event: ${type}\n` : ''}data: ${JSON.stringify({ type, ...fields })}\n\n`;

test('the SSE reader takes usage from the final event by its parsed type, split anywhere, and names the id first', () => {
  const usage = { input_tokens: 7, output_tokens: 3, input_tokens_details: { cached_tokens: 2 } };
  const text =
    ev('response.created', { response: { id: 'resp_1', usage: null } }) +
    // A delta whose text mentions the final event's name and a usage is just text.
    ev('response.output_text.delta', { delta: 'response.completed "usage":{"input_tokens":999}' }) +
    ev('response.completed', { response: { id: 'resp_1', usage } }, false);
  for (const crlf of [false, true]) {
    const sent = crlf ? text.replace(/\n/g, '\r\n') : text;
    const bytes = Buffer.from(sent);
    for (const size of [1, 2, 7, 64, bytes.length]) {
      const ids: string[] = [];
      const r = new ResponsesSseReader((id) => ids.push(id));
      let out = '';
      for (let i = 0; i < bytes.length; i += size) out += r.transform(bytes.subarray(i, i + size)).toString();
      out += r.flush();
      // Every event read whole, however a CRLF is split between chunks, and passed on unchanged.
      assert.equal(out.replace(/\r\n/g, '\n'), text, `passed on, chunks of ${size}`);
      assert.deepEqual(ids, ['resp_1']);
      assert.deepEqual(r.usage, { promptTokens: 7, completionTokens: 3, cachedPromptTokens: 2 }, `chunks of ${size}`);
      assert.equal(r.finalType, 'response.completed');
    }
  }
});

test('the SSE reader reads response.incomplete and response.failed usage; a stream without one has none and counts its deltas', () => {
  for (const type of ['response.incomplete', 'response.failed']) {
    const r = new ResponsesSseReader(() => {});
    r.transform(Buffer.from(ev(type, { response: { id: 'resp_2', usage: { input_tokens: 1, output_tokens: 2 } } })));
    assert.deepEqual(r.usage, { promptTokens: 1, completionTokens: 2 }, type);
    assert.equal(r.finalType, type);
  }
  const r = new ResponsesSseReader(() => {});
  r.transform(Buffer.from(ev('response.output_text.delta', { delta: 'one two' }) + ev('response.output_text.delta', { delta: 'response.completed "usage":{"input_tokens":9}' }, false)));
  r.flush();
  assert.equal(r.usage, null);
  assert.equal(r.finalType, null);
  assert.equal(r.countedCompletionTokens(), estimateTextTokens('one two') + estimateTextTokens('response.completed "usage":{"input_tokens":9}'));
});

test('the SSE reader with a pricer writes usage.cost into the final event\'s response.usage, the rest kept', () => {
  const response = { id: 'resp_3', output: [{ type: 'message', content: [{ type: 'output_text', text: 'costs $& and $1' }] }], usage: { input_tokens: 10, output_tokens: 4, cost: 99 } };
  const r = new ResponsesSseReader(() => {}, () => 1234);
  const out = String(r.transform(Buffer.from(ev('response.completed', { sequence_number: 5, response })))) + r.flush();
  assert.match(out, /^event: response\.completed\n/);
  const data = JSON.parse(/^data: (.*)$/m.exec(out)![1]);
  assert.deepEqual(data, { type: 'response.completed', sequence_number: 5, response: { ...response, usage: { input_tokens: 10, output_tokens: 4, cost: 0.001234 } } });
  assert.equal(r.chargedMicros, 1234);
});

test('the JSON reader names the id before the rest goes on and reads usage wherever it stands', () => {
  const body = JSON.stringify({ id: 'resp_9', object: 'response', usage: { input_tokens: 4, output_tokens: 6 }, metadata: {}, user: null });
  const ids: string[] = [];
  const r = new ResponsesJsonReader((id) => ids.push(id));
  r.transform(Buffer.from(body.slice(0, 20)));
  assert.deepEqual(ids, ['resp_9']);
  r.transform(Buffer.from(body.slice(20)));
  assert.deepEqual(r.usage, { promptTokens: 4, completionTokens: 6 });
  assert.deepEqual(ids, ['resp_9']);
});

test('the JSON reader reads the usage of an answer over 4 MiB, its usage after the output, with a bounded amount held', () => {
  // Before the fix the Responses JSON reader kept at most 4 MiB of an answer and read no usage beyond
  // that: the request was billed the gateway's own estimate instead of what the upstream served.
  const text = 'x'.repeat(64 * 1024);
  const item = JSON.stringify({ type: 'message', content: [{ type: 'output_text', text }] });
  const head = Buffer.from('{"id":"resp_big","object":"response","output":[');
  const usage = { input_tokens: 11, input_tokens_details: { cached_tokens: 5 }, output_tokens: 1_400_000, output_tokens_details: { reasoning_tokens: 7 } };
  const tail = Buffer.from(`],"usage":${JSON.stringify(usage)},"metadata":{}}`);
  const ids: string[] = [];
  const r = new ResponsesJsonReader((id) => ids.push(id), () => 42);
  let out = r.transform(head).length;
  let maxHeld = 0;
  const items = 6 * 16; // 6 MiB of output
  for (let i = 0; i < items; i++) {
    out += r.transform(Buffer.from((i ? ',' : '') + item)).length;
    maxHeld = Math.max(maxHeld, r.retainedBytes());
  }
  const last = String(r.transform(tail)) + String(r.flush());
  assert.deepEqual(ids, ['resp_big']);
  assert.deepEqual(r.usage, { promptTokens: 11, completionTokens: 1_400_000, cachedPromptTokens: 5 });
  assert.ok(maxHeld <= 1024 * 1024 + 64 * 1024, `held ${maxHeld} bytes`);
  assert.ok(out > 6 * 1024 * 1024);
  assert.equal(last, `],"usage":${JSON.stringify({ ...usage, cost: 0.000042 })},"metadata":{}}`);
  // Without usage, an output too large to keep is counted from its bytes.
  const n = new ResponsesJsonReader(() => {});
  n.transform(head);
  for (let i = 0; i < items; i++) n.transform(Buffer.from((i ? ',' : '') + item));
  n.transform(Buffer.from(']}'));
  assert.equal(n.usage, null);
  assert.ok(n.countedOutputTokens() >= (items * item.length) / 4);
});

test('the JSON reader counts the output of an answer without usage', () => {
  const r = new ResponsesJsonReader(() => {});
  r.transform(Buffer.from(JSON.stringify({ id: 'resp_n', output: [{ type: 'message', content: [{ type: 'output_text', text: 'one two three' }] }, { type: 'function_call', arguments: '{"a":1}' }] })));
  assert.equal(r.usage, null);
  assert.equal(r.countedOutputTokens(), estimateTextTokens('one two three') + estimateTextTokens('{"a":1}'));
});

test('stored-response paths', () => {
  assert.deepEqual(parseStoredResponsePath('/v1/responses/resp_a1'), { id: 'resp_a1', action: 'response' });
  assert.deepEqual(parseStoredResponsePath('/v1/responses/resp_a1/input_items'), { id: 'resp_a1', action: 'input_items' });
  assert.deepEqual(parseStoredResponsePath('/v1/responses/resp_a1/cancel'), { id: 'resp_a1', action: 'cancel' });
  for (const p of ['/v1/responses', '/v1/responses/', '/v1/responses/a/b', '/v1/responses/a%2Fb', '/v1/responses//cancel', `/v1/responses/${'x'.repeat(129)}`]) {
    assert.equal(parseStoredResponsePath(p), null, p);
  }
});

test('owner records expire after the retention and the oldest go first past the bound', () => {
  const o = new ResponseOwners({ maxEntries: 2 });
  o.add('r1', { projectId: 'p', model: 'm', createdAtMs: 0 });
  assert.equal(o.get('r1', RESPONSE_RETENTION_MS - 1)?.projectId, 'p');
  assert.equal(o.get('r1', RESPONSE_RETENTION_MS), undefined);
  o.add('r2', { projectId: 'p', model: 'm', createdAtMs: 10 });
  o.add('r3', { projectId: 'p', model: 'm', createdAtMs: 11 });
  o.add('r4', { projectId: 'p', model: 'm', createdAtMs: 12 });
  assert.equal(o.get('r2', 20), undefined);
  assert.equal(o.size, 2);
  // A snapshot replaces the records but keeps those made here after it was taken.
  o.replaceAll([['s1', { projectId: 'q', model: 'm', createdAtMs: 5 }]], 11);
  assert.equal(o.get('s1', 20)?.projectId, 'q');
  assert.equal(o.get('r4', 20)?.projectId, 'p');
  assert.equal(o.get('r3', 20), undefined);
});

test('the tpm estimate is the one estimator (input, instructions, tools) plus max_output_tokens', () => {
  const body = { model: 'm', input: 'x'.repeat(40), instructions: 'y'.repeat(8) };
  assert.equal(estimateResponseTokens(body), estimateTokens(body));
  assert.equal(estimateResponseTokens({ ...body, max_output_tokens: 100 }), estimateTokens(body) + 100);
  const tools = [{ type: 'function', name: 'f', parameters: {} }];
  // Before, tools were counted twice: once by the estimator, once again here.
  assert.equal(estimateResponseTokens({ ...body, tools }), estimateTokens({ ...body, tools }));
  assert.ok(estimateTokens({ ...body, tools }) > estimateTokens(body), 'tools are counted');
});

test('request-log rows keep a response id through the columns and the block scanner; rows without one stay as they were', () => {
  const base: LogRow = {
    requestId: 'r1', atMs: 1000, keyId: 'k', projectId: 'p', orgId: 'o', clientIp: '1.2.3.4', userAgent: 'ua', method: 'POST', path: '/v1/chat/completions',
    status: 200, latencyUs: 5, bytesIn: 1, bytesOut: 2, model: 'm', promptTokens: 3, completionTokens: 4, costMicros: 5, reason: '', keyPrefix: '',
  };
  const rows: LogRow[] = [base, { ...base, requestId: 'r2', path: '/v1/responses', responseId: 'resp_abc' }, { ...base, requestId: 'r3' }];
  const only = new LogColumnsBuilder();
  only.add(base);
  const plain = only.block();
  assert.deepEqual(scanLogBlock(plain.columns, {}).map((x) => x.row), [base]);
  const b = new LogColumnsBuilder();
  for (const r of rows) b.add(r);
  const block = b.block();
  assert.deepEqual(scanLogBlock(block.columns, {}).map((x) => x.row), rows);
  assert.deepEqual(decodeLogColumns(LogColumns.decode(block.columns)).rows, rows);
});
