// The test helper that parses Prometheus text must reject what Prometheus rejects, or the metrics
// tests built on it could pass on broken output. And the node's registry, rendered by prom-client,
// parses: label values escaped, histograms cumulative with +Inf equal to _count.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parsePrometheus } from '../helpers/prometheus.js';
import { recordReply, registry, requestStarted } from '../../data-plane/metrics.js';
import { familyOf } from '../../data-plane/routing/path-families.js';

const good = [
  '# HELP x_total Things.',
  '# TYPE x_total counter',
  'x_total{a="1",b="q\\"uote\\\\"} 3',
  '# TYPE h histogram',
  'h_bucket{le="0.1"} 1',
  'h_bucket{le="+Inf"} 2',
  'h_sum 0.3',
  'h_count 2',
  '',
].join('\n');

test('well-formed text parses, with escaped label values', () => {
  const m = parsePrometheus(good);
  assert.equal(m.value('x_total', { a: '1', b: 'q"uote\\' }), 3);
  assert.equal(m.value('h_count'), 2);
  assert.equal(m.type('h'), 'histogram');
});

const bad: Array<[string, string]> = [
  ['a sample of an undeclared family', '# TYPE a counter\na 1\nb 2\n'],
  ['a value that is not a number', '# TYPE a gauge\na one\n'],
  ['an unquoted label value', '# TYPE a gauge\na{x=1} 1\n'],
  ['an unterminated label set', '# TYPE a gauge\na{x="1" 1\n'],
  ['a negative counter', '# TYPE a counter\na -1\n'],
  ['buckets that are not cumulative', '# TYPE h histogram\nh_bucket{le="1"} 3\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 2\n'],
  ['+Inf bucket different from _count', '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n'],
  ['a missing trailing newline', '# TYPE a gauge\na 1'],
];

for (const [what, text] of bad) {
  test(`rejected: ${what}`, () => {
    assert.throws(() => parsePrometheus(text));
  });
}

test("the node's metrics render as valid Prometheus text, counting each response once", async () => {
  const chat = familyOf('/v1/chat/completions');
  const reply = { family: chat, status: 0, refusal: null, startedAt: 0, upstreamAt: 0, headAt: 0, upstreamError: false, aborted: false };
  for (const [status, reason, upstreamAt, headAt] of [
    [200, '', 1, 51],
    [200, '', 1, 2001],
    [429, 'KEY_RATE_LIMITED', 0, 0.2],
    [0, '', 0, 0],
  ] as const) {
    requestStarted();
    recordReply({ ...reply, status, refusal: reason ? { code: reason } : null, upstreamAt, headAt });
  }
  const m = parsePrometheus(await registry.metrics());
  assert.equal(m.value('tollgate_node_requests_total', { family: 'chat', status: '200', reason: 'none' }), 2);
  assert.equal(m.value('tollgate_node_requests_total', { family: 'chat', status: '429', reason: 'KEY_RATE_LIMITED' }), 1);
  // Gone before an answer: 499, and no latency observed.
  assert.equal(m.value('tollgate_node_requests_total', { family: 'chat', status: '499', reason: 'none' }), 1);
  assert.equal(m.value('tollgate_node_added_latency_seconds_count', { family: 'chat' }), 3);
  assert.equal(m.value('tollgate_node_upstream_seconds_count', { family: 'chat' }), 2);
  // 50 ms and 2 s upstream times: one in the 0.05 bucket, both by 2.5 s.
  assert.equal(m.value('tollgate_node_upstream_seconds_bucket', { family: 'chat', le: '0.05' }), 1);
  assert.equal(m.value('tollgate_node_upstream_seconds_bucket', { family: 'chat', le: '2.5' }), 2);
  assert.equal(m.value('tollgate_node_upstream_seconds_sum', { family: 'chat' }), 2.05);
  assert.equal(m.value('tollgate_node_inflight_requests'), 0);
  // A second scrape counts nothing twice.
  const again = parsePrometheus(await registry.metrics());
  assert.equal(again.value('tollgate_node_requests_total', { family: 'chat', status: '200', reason: 'none' }), 2);
});
