// Path sanity, the path families' error shapes and the route table, as tables.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../../data-plane/errors.js';
import { RouteTable, shapeOf } from '../../data-plane/routing/routes.js';
import { isBadPath } from '../../data-plane/routing/path-sanity.js';

const bad = [
  '/v1/../x',
  '/v1/./x',
  '/v1/x/..',
  '/v1//x',
  '//v1/x',
  '/v1/%2e%2e/x',
  '/v1/%2E/x',
  '/v1/a%2fb',
  '/v1/a%2Fb',
  '/v1/a%5cb',
  '/v1/a\\b',
  '/v1/a%00',
  '/v1/a\0b',
  '/v1/a%zz',
  '/v1/a%4',
  '/v1/a%',
  `/v1/${'x'.repeat(2050)}`,
  'v1/models',
];
const good = ['/v1/models', '/v1/chat/completions', '/v1/files/file-1.pdf', '/v1/a%20b', '/v1/a...b', '/v1/.well', '/', `/v1/${'x'.repeat(2000)}`];

test('bad paths are recognised', () => {
  for (const p of bad) assert.equal(isBadPath(p), true, p.slice(0, 60));
});
test('good paths pass', () => {
  for (const p of good) assert.equal(isBadPath(p), false, p.slice(0, 60));
});

test('error shape by path family (decided before routing)', () => {
  const table: Array<[string, 'openai' | 'gateway']> = [
    ['/v1/chat/completions', 'openai'],
    ['/v1/chat/completionz', 'openai'],
    ['/v1/embeddings', 'openai'],
    ['/v1/audio/speech', 'openai'],
    ['/v1/models', 'openai'],
    ['/v1/files', 'gateway'],
    ['/v1/pdf', 'gateway'],
    ['/v1/nope', 'gateway'],
    ['/', 'gateway'],
  ];
  for (const [p, s] of table) assert.equal(shapeOf(p), s, p);
});

test('route table: model routes, 405 with Allow, tool prefixes, realtime, 404', () => {
  const rt = new RouteTable([
    ToolBackend.fromPartial({ prefix: '/v1/pdf', baseUrl: 'http://pdf', timeoutMs: 1 }),
    ToolBackend.fromPartial({ prefix: '/v1/files', baseUrl: 'http://files', timeoutMs: 1 }),
  ]);
  const ok: Array<[string, string, string]> = [
    ['POST', '/v1/chat/completions', 'chat'],
    ['GET', '/v1/models', 'models'],
    ['POST', '/v1/embeddings', 'embeddings'],
    ['POST', '/v1/audio/transcriptions', 'transcriptions'],
    ['POST', '/v1/audio/speech', 'speech'],
    ['GET', '/v1/audio/voices', 'voices'],
    ['DELETE', '/v1/files/abc', 'tool'],
    ['POST', '/v1/pdf', 'tool'],
    ['GET', '/v1/skills', 'tool'],
    ['GET', '/v1/sandbox/x', 'tool'],
    ['POST', '/v1/route', 'tool'],
    ['GET', '/v1/realtime', 'realtime'],
  ];
  for (const [m, p, kind] of ok) {
    const r = rt.match(p, m);
    assert.ok(!(r instanceof GatewayError), `${m} ${p}`);
    assert.equal(r.kind, kind);
  }
  const pdf = rt.match('/v1/pdf/render', 'POST');
  assert.ok(!(pdf instanceof GatewayError) && pdf.backend?.baseUrl === 'http://pdf');
  const mcp = rt.match('/v1/mcp', 'POST');
  assert.ok(!(mcp instanceof GatewayError) && mcp.backend === null);

  const wrong = rt.match('/v1/chat/completions', 'GET');
  assert.ok(wrong instanceof GatewayError);
  assert.equal(wrong.code, 'METHOD_NOT_ALLOWED');
  assert.equal(wrong.allow, 'POST');
  for (const p of ['/v1/nope', '/v1/chat', '/v1/sandbox', '/v1/router', '/v2/models']) {
    const r = rt.match(p, 'GET');
    assert.ok(r instanceof GatewayError, p);
    assert.equal(r.code, 'NOT_FOUND');
  }
});
