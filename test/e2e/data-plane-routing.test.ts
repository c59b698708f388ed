// Routing and error shapes over HTTP: 404 / 405 + Allow / bad_path, and the exact Shape A fields of
// every 400 of the chat endpoint (malformed JSON, wrong Content-Type, missing fields, unknown model).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertRateLimitHeaders, assertShapeA, assertShapeB, gatewayFixture } from '../helpers/gateway-fixture.js';
import { bearer, rawRequest, request } from '../helpers/http.js';
import { type DataPlane } from '../helpers/processes.js';

let dp: DataPlane;
let key: string;
let paidKey: string;

const gw = gatewayFixture({}, async () => {
  dp = gw.node;
  key = (await gw.fundedKey()).key;
  // A paid organisation with credits: 300 rpm, room for the many requests below.
  paidKey = (await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 })).key;
  // Wait until the credit unblocked the paid organisation on the node.
  for (let i = 0; i < 200; i++) {
    const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(paidKey), json: { model: 'demo-chat', messages: [{ role: 'user', content: 'x' }] } });
    if (r.status === 200) break;
    await new Promise((res) => setTimeout(res, 25));
  }
});

test('a path no route matches: 404 Shape B not_found', async () => {
  for (const path of ['/v1/nope', '/v1/chat/completionz', '/v2/chat/completions', '/']) {
    const r = await request(`${dp.url}${path}`, { headers: bearer(paidKey) });
    assertShapeB(r, 404, 'not_found');
  }
});

test('right path, wrong method: 405 with an Allow header', async () => {
  const cases: Array<[string, string, string]> = [
    ['GET', '/v1/chat/completions', 'POST'],
    ['PUT', '/v1/chat/completions', 'POST'],
    ['POST', '/v1/models', 'GET'],
    ['DELETE', '/v1/embeddings', 'POST'],
    ['POST', '/v1/audio/voices', 'GET'],
  ];
  for (const [method, path, allow] of cases) {
    const r = await request(`${dp.url}${path}`, { method, headers: bearer(paidKey) });
    assert.equal(r.status, 405, `${method} ${path}`);
    assert.equal(r.headers.get('allow'), allow);
    assert.equal(r.body.error.code, '405');
    assert.equal(r.body.error.type, 'invalid_request_error');
  }
});

test('malformed paths: 400 Shape B bad_path, before the credential is looked at', async () => {
  const paths = [
    '/v1/../v1/models',
    '/v1/chat/./completions',
    '/v1//models',
    '/v1/%2e%2e/models',
    '/v1/files%2Fx',
    '/v1/files%5Cx',
    '/v1/files/%zz',
    '/v1/files/%4',
    '/v1/files/%00',
    `/v1/files/${'a'.repeat(2100)}`,
  ];
  for (const path of paths) {
    for (const auth of [`Authorization: Bearer ${paidKey}\r\n`, '']) {
      const r = await rawRequest(dp.address, `GET ${path} HTTP/1.1\r\nHost: x\r\n${auth}Connection: close\r\n\r\n`);
      assert.equal(r.status, 400, `${path} ${auth ? 'with' : 'without'} key: ${r.text.slice(0, 200)}`);
      const body = JSON.parse(r.text.slice(r.text.indexOf('\r\n\r\n') + 4));
      assert.deepEqual(body, { error: { code: 'bad_path', message: body.error.message } });
    }
  }
});

function chat(body: string | undefined, contentType = 'application/json') {
  return request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(paidKey), 'content-type': contentType }, body });
}

function assertShapeA400(r: { status: number; body: any }, param: string | null, message: RegExp): void {
  assertShapeA(r, 400, { type: 'invalid_request_error', param, message });
}

test('every 400 of the chat endpoint has the exact Shape A fields', async () => {
  assertShapeA400(await chat('{"model": "demo-chat", "messages": ['), null, /parse the JSON/);
  assertShapeA400(await chat('not json'), null, /parse the JSON/);
  assertShapeA400(await chat(JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'x' }] }), 'text/plain'), null, /Content-Type/);
  assertShapeA400(await chat(JSON.stringify({ model: 'demo-chat', messages: [] }), 'application/x-www-form-urlencoded'), null, /Content-Type/);
  assertShapeA400(await chat(JSON.stringify({ model: 'demo-chat' })), 'messages', /messages/);
  assertShapeA400(await chat(JSON.stringify({ model: 'demo-chat', messages: 'hi' })), 'messages', /messages/);
  assertShapeA400(await chat(JSON.stringify({ messages: [{ role: 'user', content: 'x' }] })), 'model', /model/);
  assertShapeA400(await chat(JSON.stringify({ model: 'gpt-17', messages: [{ role: 'user', content: 'x' }] })), 'model', /gpt-17.*does not exist/);
  assertShapeA400(await chat(JSON.stringify([1, 2])), null, /JSON object/);
  // Content-Type parameters are fine.
  const ok = await chat(JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'x' }] }), 'application/json; charset=utf-8');
  assert.equal(ok.status, 200);
});

test('every response of a key with limits carries the x-ratelimit headers', async () => {
  const ok = await chat(JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'x' }] }));
  const bad = await chat('nope');
  const notFound = await request(`${dp.url}/v1/nope`, { headers: bearer(paidKey) });
  for (const r of [ok, bad, notFound]) {
    assertRateLimitHeaders(r.headers, { requests: 300, tokens: 1_000_000 });
  }
});

test('a body over the path cap is refused from its Content-Length with 413', async () => {
  const r = await rawRequest(
    dp.address,
    `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${paidKey}\r\nContent-Type: application/json\r\nContent-Length: ${64 * 1024 * 1024}\r\n\r\n`,
  );
  assert.equal(r.status, 413);
  const body = JSON.parse(r.text.slice(r.text.indexOf('\r\n\r\n') + 4));
  assert.equal(body.error.code, '413');
});

test('tool paths without a configured backend: 502 Shape B upstream_unreachable', async () => {
  for (const path of ['/v1/pdf', '/v1/files/abc', '/v1/vector_stores', '/v1/sandbox/run', '/v1/route']) {
    const r = await request(`${dp.url}${path}`, { headers: bearer(key) });
    assert.equal(r.status, 502, path);
    assert.equal(r.body.error.code, 'upstream_unreachable');
  }
});

// Before: /v1/realtime answered 502 "not available yet"; it is a WebSocket endpoint now.
test('a plain HTTP request to /v1/realtime is told it takes WebSocket connections only (400 Shape A); other realtime paths 404', async () => {
  const r = await request(`${dp.url}/v1/realtime?model=demo-realtime`, { headers: bearer(key) });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.type, 'invalid_request_error');
  assert.equal(r.body.error.code, '400');
  assert.match(r.body.error.message, /WebSocket/);
  const sub = await request(`${dp.url}/v1/realtime/sessions`, { method: 'POST', headers: bearer(key) });
  assert.equal(sub.status, 404);
  assert.equal(sub.body.error.code, 'not_found');
});
