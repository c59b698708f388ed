// error-shapes.ts is the one place that turns an error into status, headers and body: a table.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GatewayError } from '../../data-plane/errors.js';
import { renderError, statusLine } from '../../data-plane/error-shapes.js';

const cases: Array<{ name: string; err: unknown; shape: 'openai' | 'gateway' | 'passthrough'; status: number; body: unknown; headers?: Record<string, string> }> = [
  {
    name: 'missing key on a model path',
    err: new GatewayError('KEY_MISSING', 'no key'),
    shape: 'openai',
    status: 401,
    body: { error: { message: 'no key', type: 'authentication_error', param: null, code: '401' } },
  },
  {
    name: 'missing key on a tool path',
    err: new GatewayError('KEY_MISSING', 'no key'),
    shape: 'gateway',
    status: 401,
    body: { error: { code: 'invalid_api_key', message: 'no key' } },
  },
  { name: 'blocked organisation', err: new GatewayError('ORG_BLOCKED', 'broke'), shape: 'openai', status: 401, body: { error: { message: 'broke', type: 'insufficient_quota', param: null, code: '401' } } },
  {
    name: 'model outside scope',
    err: new GatewayError('MODEL_NOT_ALLOWED', 'nope', { param: 'model' }),
    shape: 'openai',
    status: 401,
    body: { error: { message: 'nope', type: 'model_not_allowed', param: 'model', code: '401' } },
  },
  {
    name: 'missing messages',
    err: new GatewayError('INVALID_REQUEST', 'm', { param: 'messages' }),
    shape: 'openai',
    status: 400,
    body: { error: { message: 'm', type: 'invalid_request_error', param: 'messages', code: '400' } },
  },
  { name: 'unknown model', err: new GatewayError('UNKNOWN_MODEL', 'x', { param: 'model' }), shape: 'openai', status: 400, body: { error: { message: 'x', type: 'invalid_request_error', param: 'model', code: '400' } } },
  {
    name: 'edge 429 has no param and is Shape A even on a tool path',
    err: new GatewayError('EDGE_RATE_LIMITED', 'slow', { retryAfterSec: 12.2 }),
    shape: 'gateway',
    status: 429,
    body: { error: { message: 'slow', type: 'api_error', code: '429' } },
    headers: { 'retry-after': '13' },
  },
  {
    name: 'gateway 429 names the dimension',
    err: new GatewayError('KEY_RATE_LIMITED', 'tpm', { type: 'tokens', param: null, retryAfterSec: 5 }),
    shape: 'openai',
    status: 429,
    body: { error: { message: 'tpm', type: 'tokens', param: null, code: '429' } },
    headers: { 'retry-after': '5' },
  },
  { name: 'not found', err: new GatewayError('NOT_FOUND', 'where'), shape: 'gateway', status: 404, body: { error: { code: 'not_found', message: 'where' } } },
  {
    name: '405 carries Allow',
    err: new GatewayError('METHOD_NOT_ALLOWED', 'use POST', { allow: 'POST' }),
    shape: 'openai',
    status: 405,
    body: { error: { message: 'use POST', type: 'invalid_request_error', param: null, code: '405' } },
    headers: { allow: 'POST' },
  },
  { name: 'bad path', err: new GatewayError('BAD_PATH', 'bad'), shape: 'gateway', status: 400, body: { error: { code: 'bad_path', message: 'bad' } } },
  { name: '413 on a tool path', err: new GatewayError('BODY_TOO_LARGE', 'big'), shape: 'gateway', status: 413, body: { error: { code: 'payload_too_large', message: 'big' } } },
  { name: '413 on a model path', err: new GatewayError('BODY_TOO_LARGE', 'big'), shape: 'openai', status: 413, body: { error: { message: 'big', type: 'invalid_request_error', param: null, code: '413' } } },
  { name: '502 on a tool path', err: new GatewayError('UPSTREAM_UNREACHABLE', 'down'), shape: 'gateway', status: 502, body: { error: { code: 'upstream_unreachable', message: 'down' } } },
  { name: '502 on a model path', err: new GatewayError('UPSTREAM_UNREACHABLE', 'down'), shape: 'openai', status: 502, body: { error: { message: 'down', type: 'api_error', param: null, code: '502' } } },
  { name: 'Shape C', err: new GatewayError('INVALID_REQUEST', 'remote reference'), shape: 'passthrough', status: 400, body: { detail: 'remote reference' } },
  { name: 'a bug is a 500 that says nothing more', err: new TypeError('secret internals'), shape: 'openai', status: 500, body: { error: { message: 'Internal error.', type: 'api_error', param: null, code: '500' } } },
];

for (const c of cases) {
  test(`renderError: ${c.name}`, () => {
    const r = renderError(c.err, c.shape);
    assert.equal(r.status, c.status);
    assert.equal(r.statusLine, statusLine(c.status));
    assert.deepEqual(JSON.parse(r.body), c.body);
    const headers = Object.fromEntries(r.headers);
    assert.equal(headers['content-type'], 'application/json');
    for (const [k, v] of Object.entries(c.headers ?? {})) assert.equal(headers[k], v);
    if (!c.headers?.['retry-after']) assert.equal(headers['retry-after'], undefined);
  });
}

test('status lines carry the reason phrase', () => {
  assert.equal(statusLine(200), '200 OK');
  assert.equal(statusLine(401), '401 Unauthorized');
  assert.equal(statusLine(502), '502 Bad Gateway');
});
