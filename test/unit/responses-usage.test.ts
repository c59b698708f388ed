// The Responses API's pure parts: usage read from `usage` objects, the SSE and JSON readers (event
// types parsed, never matched as substrings; the id read before its bytes go on), the stored-response
// paths, the owner records and the tpm estimate.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { estimateResponseTokens } from '../../data-plane/endpoints/responses.js';
import { parseStoredResponsePath } from '../../data-plane/endpoints/responses-paths.js';
import { RESPONSE_RETENTION_MS, ResponseOwners } from '../../data-plane/endpoints/response-owners.js';
import { ResponsesJsonReader, ResponsesSseReader, responsesUsageOf } from '../../data-plane/proxy/responses-usage.js';
import { estimateTokens } from '../../data-plane/limits/key-budgets.js';
import { LogColumns } from '../../proto/gen/tollgate/v1/sync.js';
import { scanLogBlock } from '../../proto/lib/log-block-scan.js';
import { decodeLogColumns, LogColumnsBuilder, type LogRow } from '../../proto/lib/log-columns.js';

test('responsesUsageOf reads input, cached, output and reasoning tokens', () => {
  const rows: Array<[unknown, unknown]> = [
    [{ input_tokens: 10, output_tokens: 5 }, { promptTokens: 10, completionTokens: 5 }],
    [
      { input_tokens: 100, input_tokens_details: { cached_tokens: 40 }, output_tokens: 30, output_tokens_details: { reasoning_tokens: 20 }, total_tokens: 130 },
      { promptTokens: 100, completionTokens: 30, cachedPromptTokens: 40, reasoningTokens: 20 },
    ],
    // Reasoning reported beside output (a total above input + output): the rest is output.
    [{ input_tokens: 10, output_tokens: 5, output_tokens_details: { reasoning_tokens: 7 }, total_tokens: 22 }, { promptTokens: 10, completionTokens: 12, reasoningTokens: 7 }],
    // More cached than input: cut to the input.
    [{ input_tokens: 3, input_tokens_details: { cached_tokens: 9 }, output_tokens: 0 }, { promptTokens: 3, completionTokens: 0, cachedPromptTokens: 3 }],
    [{ input_tokens: -4, output_tokens: 'x' }, { promptTokens: 0, completionTokens: 0 }],
    [{ prompt_tokens: 3 }, null],
    [null, null],
    [[1, 2], null],
  ];
  for (const [u, want] of rows) assert.deepEqual(responsesUsageOf(u), want, JSON.stringify(u));
});

const ev = (type: string, fields: Record<string, unknown>, named = true) => `${named ? `event: ${type}\n` : ''}data: ${JSON.stringify({ type, ...fields })}\n\n`;

test('the SSE reader takes usage from the final event by its parsed type, split anywhere, and names the id first', () => {
  const usage = { input_tokens: 7, output_tokens: 3, input_tokens_details: { cached_tokens: 2 } };
  const text =
    ev('response.created', { response: { id: 'resp_1', usage: null } }) +
    // A delta whose text mentions the final event's name and a usage is just text.
    ev('response.output_text.delta', { delta: 'response.completed "usage":{"input_tokens":999}' }) +
    ev('response.completed', { response: { id: 'resp_1', usage } }, false);
  for (const size of [1, 7, 64, text.length]) {
    const ids: string[] = [];
    const names: string[] = [];
    const r = new ResponsesSseReader((id) => ids.push(id));
    // Before the fix a CRLF split between two chunks read as two line ends, so an event's `event:`
    // line and its data were read as two events. Every event is read whole, however CRLF is split.
    const read = (r as any).event.bind(r);
    (r as any).event = (ev: string) => {
      names.push(ev.split('\n')[0]);
      read(ev);
    };
    let out = '';
    const bytes = Buffer.from(text.replace(/\n/g, '\r\n'));
    for (let i = 0; i < bytes.length; i += size) out += r.transform(bytes.subarray(i, i + size)).toString();
    r.flush();
    assert.equal(out, text.replace(/\n/g, '\r\n'), 'passed on unchanged');
    assert.deepEqual(ids, ['resp_1']);
    assert.deepEqual(r.usage, { promptTokens: 7, completionTokens: 3, cachedPromptTokens: 2 });
    assert.equal(r.finalType, 'response.completed');
    assert.deepEqual(names, ['event: response.created', 'event: response.output_text.delta', 'data: {"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":7,"output_tokens":3,"input_tokens_details":{"cached_tokens":2}}}}'], `chunks of ${size}`);
    assert.ok(r.countedOutputTokens > 0);
  }
});

test('the SSE reader reads response.incomplete and response.failed usage; a stream without one has none', () => {
  for (const type of ['response.incomplete', 'response.failed']) {
    const r = new ResponsesSseReader(() => {});
    r.transform(Buffer.from(ev(type, { response: { id: 'resp_2', usage: { input_tokens: 1, output_tokens: 2 } } })));
    assert.deepEqual(r.usage, { promptTokens: 1, completionTokens: 2 }, type);
  }
  const r = new ResponsesSseReader(() => {});
  r.transform(Buffer.from(ev('response.output_text.delta', { delta: 'one two' })));
  assert.equal(r.usage, null);
  assert.equal(r.countedOutputTokens, 2);
});

test('the JSON reader names the id from the head, before the rest, and reads usage wherever it stands', () => {
  const body = JSON.stringify({ id: 'resp_9', object: 'response', usage: { input_tokens: 4, output_tokens: 6 }, metadata: {}, user: null });
  const ids: string[] = [];
  const r = new ResponsesJsonReader((id) => ids.push(id));
  r.transform(Buffer.from(body.slice(0, 20)));
  assert.deepEqual(ids, ['resp_9']);
  r.transform(Buffer.from(body.slice(20)));
  r.finish();
  assert.deepEqual(r.usage, { promptTokens: 4, completionTokens: 6 });
  assert.deepEqual(ids, ['resp_9']);
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
  const o = new ResponseOwners(2);
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

test('the tpm estimate adds tools and max_output_tokens to the input and instructions', () => {
  const body = { model: 'm', input: 'x'.repeat(40), instructions: 'y'.repeat(8) };
  assert.equal(estimateResponseTokens(body), estimateTokens(body));
  assert.equal(estimateResponseTokens({ ...body, max_output_tokens: 100 }), estimateTokens(body) + 100);
  const tools = [{ type: 'function', name: 'f', parameters: {} }];
  assert.equal(estimateResponseTokens({ ...body, tools }), estimateTokens(body) + Math.ceil(JSON.stringify(tools).length / 4));
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
