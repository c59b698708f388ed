// Choosing among a tool prefix's backends: round robin over healthy URLs, a URL that failed is tried
// only after the healthy ones while it cools down, and is healthy again once it answers.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';
import { ToolBackends } from '../../data-plane/proxy/tool-backends.js';

const backends = new ToolBackends();
after(() => backends.close());

const b = ToolBackend.fromPartial({ prefix: '/v1/files', baseUrls: ['http://127.0.0.1:1', 'http://127.0.0.1:2/base/', 'http://127.0.0.1:3'], timeoutMs: 1000 });
const urls = (list: { baseUrl: string }[]) => list.map((u) => u.baseUrl.slice(-1) === '/' ? u.baseUrl.slice(-7, -6) : u.baseUrl.slice(-1));

test('round robin over healthy backends', () => {
  assert.deepEqual(urls(backends.order(b)), ['1', '2', '3']);
  assert.deepEqual(urls(backends.order(b)), ['2', '3', '1']);
  assert.deepEqual(urls(backends.order(b)), ['3', '1', '2']);
  assert.equal(backends.order(b).find((u) => u.baseUrl.includes(':2'))!.basePath, '/base');
});

test('a failed backend goes last while it cools down, and is back once it answers', () => {
  const first = backends.order(b).find((u) => u.baseUrl === 'http://127.0.0.1:1')!;
  backends.markDown(first);
  assert.ok(backends.isDown('http://127.0.0.1:1'));
  for (let i = 0; i < 3; i++) assert.equal(urls(backends.order(b)).at(-1), '1');
  backends.markUp(first);
  assert.equal(backends.isDown('http://127.0.0.1:1'), false);
});

test('older control planes send one base_url only', () => {
  const old = ToolBackend.fromPartial({ prefix: '/v1/pdf', baseUrl: 'http://127.0.0.1:9', timeoutMs: 1000 });
  assert.deepEqual(ToolBackends.urlsOf(old), ['http://127.0.0.1:9']);
  assert.equal(backends.order(old)[0].baseUrl, 'http://127.0.0.1:9');
});
