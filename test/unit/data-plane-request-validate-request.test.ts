// Request validation of the JSON model endpoints as tables: duplicate keys, chat messages, the
// messages' grammar.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { findDuplicateKey, validateJson } from '../../data-plane/request/validate-request.js';

/** `"k0":0,"k1":1,…` with n distinct keys. */
const many = (n: number) => Array.from({ length: n }, (_, i) => `"k${i}":${i}`).join(',');
import { RouteTable, type Route } from '../../data-plane/routing/routes.js';
import type { GatewayConfig } from '../../proto/gen/tollgate/v1/sync.js';

const CONFIG = {
  serviceName: 'tollgate',
  tiers: [],
  models: [
    { id: 'chat-1', kind: 'chat', provider: 'demo', voices: [] },
    { id: 'embed-1', kind: 'embeddings', provider: 'demo', voices: [] },
  ],
  toolBackends: [],
  realtimeUpstreams: [],
  trustedProxies: [],
  maxStalenessMs: 0,
} as unknown as GatewayConfig;
const state = new GatewayState(CONFIG);
const routes = new RouteTable([]);
const chat = routes.match('/v1/chat/completions', 'POST') as Route;
const embeddings = routes.match('/v1/embeddings', 'POST') as Route;

test('duplicate keys are found at any depth, with their path; distinct keys and escapes are not confused', () => {
  // Before the fix, {"model":"a",…,"model":"b"} was validated and billed as "b" but forwarded as sent,
  // so an upstream that keeps the first key ran model "a".
  const rows: Array<[string, string | null]> = [
    ['{"model":"a","messages":[],"model":"b"}', 'model'],
    ['{"model":"a","messages":[{"role":"user","content":"x","role":"system"}]}', 'messages.[0].role'],
    ['{"a":{"b":{"c":1,"c":2}}}', 'a.b.c'],
    ['{"a":[1,{"x":1},{"y":1,"y":2}]}', 'a.[2].y'],
    ['{"mo\\u0064el":"a","model":"b"}', 'model'],
    ['{"model":"a","messages":[{"role":"user"},{"role":"user"}]}', null],
    ['{"a":"\\"model\\":1","model":2}', null],
    ['{"a":{"k":1},"b":{"k":1}}', null],
    ['[{"k":1},{"k":1}]', null],
    ['{"k":"}{,:[]\\\\","k2":1}', null],
    ['"just a string"', null],
    ['{}', null],
    // Objects with many keys: repeats early and late.
    [`{${many(40)}}`, null],
    [`{${many(20)},"k0":1}`, 'k0'],
    [`{${many(16)},"k15":1}`, 'k15'],
    [`{${many(17)},"k16":1}`, 'k16'],
    [`{"o":{${many(30)},"k29":1}}`, 'o.k29'],
  ];
  for (const [text, expected] of rows) {
    JSON.parse(text);
    assert.equal(findDuplicateKey(text), expected, text);
  }
});

test('chat messages: each an object with a string role, and content a string, an array of parts or null where allowed', () => {
  const ok = (messages: unknown) => validateJson(chat, 'application/json', { model: 'chat-1', messages }, false, state);
  const rows: Array<[unknown, string | null]> = [
    [[{ role: 'user', content: 'hi' }], null],
    [[{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], null],
    [[{ role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c', content: 'r' }], null],
    [[{ role: 'assistant', tool_calls: [] }], null],
    [['hi'], 'messages.[0]'],
    [[null], 'messages.[0]'],
    [[{ content: 'hi' }], 'messages.[0].role'],
    [[{ role: 7, content: 'hi' }], 'messages.[0].role'],
    [[{ role: '', content: 'hi' }], 'messages.[0].role'],
    [[{ role: 'user', content: 'a' }, { role: 'user', content: 5 }], 'messages.[1].content'],
    [[{ role: 'user', content: null }], 'messages.[0].content'],
    [[{ role: 'user' }], 'messages.[0].content'],
    [[{ role: 'user', content: { text: 'x' } }], 'messages.[0].content'],
    [[{ role: 'user', content: ['x'] }], 'messages.[0].content.[0]'],
    [[{ role: 'user', content: [{ text: 'x' }] }], 'messages.[0].content.[0]'],
  ];
  for (const [messages, param] of rows) {
    const err = ok(messages);
    if (param === null) assert.equal(err, null, JSON.stringify(messages));
    else {
      assert.ok(err, JSON.stringify(messages));
      assert.equal(err!.code, 'INVALID_REQUEST');
      assert.equal(err!.param, param, JSON.stringify(messages));
    }
  }
});

test('messages name the model kind with the right article', () => {
  const err = validateJson(chat, 'application/json', { model: 'embed-1', messages: [{ role: 'user', content: 'x' }] }, false, state);
  assert.match(err!.message, /is an embeddings model/);
  const err2 = validateJson(embeddings, 'application/json', { model: 'chat-1', input: 'x' }, false, state);
  assert.match(err2!.message, /is a chat model/);
});
