// GET /v1/usage's query and body (data-plane/request/usage-endpoint.ts), and the CLI's time flags
// (cli/time-arg.ts): tables over the pure functions.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseTimeArg } from '../../cli/time-arg.js';
import { FindKeyLimiter } from '../../control-plane/console/find-key-limiter.js';
import { CpError } from '../../control-plane/errors.js';
import { GatewayError } from '../../data-plane/errors.js';
import { MAX_UNIX_SECONDS, parseUsageQuery, renderUsage } from '../../data-plane/request/usage-endpoint.js';

const NOW = Date.UTC(2026, 2, 10, 12, 0, 0);
const MARCH = Date.UTC(2026, 2, 1) / 1000;

test('usage query: accepted forms and their defaults', () => {
  const rows: Array<[string, { groupBy: string; startTime: number; endTime: number | null }]> = [
    ['', { groupBy: 'day', startTime: MARCH, endTime: null }],
    ['group_by=model', { groupBy: 'model', startTime: MARCH, endTime: null }],
    ['group_by=key&start_time=0', { groupBy: 'key', startTime: 0, endTime: null }],
    ['start_time=100&end_time=200', { groupBy: 'day', startTime: 100, endTime: 200 }],
    ['end_time=1900000000', { groupBy: 'day', startTime: MARCH, endTime: 1900000000 }],
    [`start_time=${MAX_UNIX_SECONDS - 1}&end_time=${MAX_UNIX_SECONDS}`, { groupBy: 'day', startTime: MAX_UNIX_SECONDS - 1, endTime: MAX_UNIX_SECONDS }],
    ['group%5Fby=model', { groupBy: 'model', startTime: MARCH, endTime: null }],
  ];
  for (const [query, want] of rows) assert.deepEqual(parseUsageQuery(query, NOW), want, query);
});

test('usage query: refusals are 400 in Shape A naming the parameter', () => {
  const rows: Array<[string, string | null]> = [
    ['project_id=proj_other', 'project_id'],
    ['org_id=org_x', 'org_id'],
    ['key_id=key_x', 'key_id'],
    ['bucket_width=1d', 'bucket_width'],
    [`${'x'.repeat(100)}=1`, null],
    ['group_by=', 'group_by'],
    ['group_by=Model', 'group_by'],
    ['group_by=day&group_by=day', 'group_by'],
    ['start_time=', 'start_time'],
    ['start_time=1e9', 'start_time'],
    ['start_time=+5', 'start_time'],
    ['start_time=0x10', 'start_time'],
    [`start_time=${MAX_UNIX_SECONDS + 1}`, 'start_time'],
    ['start_time=5&end_time=5', 'end_time'],
    ['end_time=1', 'end_time'],
  ];
  for (const [query, param] of rows) {
    const r = parseUsageQuery(query, NOW);
    assert.ok(r instanceof GatewayError, query);
    assert.equal(r.code, 'INVALID_REQUEST', query);
    assert.equal(r.param, param, query);
    assert.ok(r.message.length < 300, `${query}: a bounded message`);
  }
});

test('usage body: buckets under the group name, totals summed, cost in micros and USD', () => {
  const body = JSON.parse(
    renderUsage(
      { groupBy: 'key', startTime: 10, endTime: null },
      {
        projectId: 'proj_a',
        buckets: [
          { group: 'key_1', requests: 2, promptTokens: 10, completionTokens: 20, costMicros: 1_500_000 },
          { group: 'key_2', requests: 1, promptTokens: 3, completionTokens: 0, costMicros: 7 },
        ],
      },
    ),
  );
  assert.deepEqual(body, {
    object: 'list',
    project_id: 'proj_a',
    group_by: 'key',
    start_time: 10,
    end_time: null,
    data: [
      { object: 'usage.bucket', key_id: 'key_1', requests: 2, input_tokens: 10, output_tokens: 20, cost_micros: 1_500_000, cost_usd: '1.50' },
      { object: 'usage.bucket', key_id: 'key_2', requests: 1, input_tokens: 3, output_tokens: 0, cost_micros: 7, cost_usd: '0.000007' },
    ],
    totals: { requests: 3, input_tokens: 13, output_tokens: 20, cost_micros: 1_500_007, cost_usd: '1.500007' },
  });
});

test('CLI time flags: RFC 3339, a UTC date, or a duration back from now', () => {
  const rows: Array<[string, string | null]> = [
    ['2026-03-10T12:30:00Z', '2026-03-10T12:30:00.000Z'],
    ['2026-03-10T12:30:00+02:00', '2026-03-10T10:30:00.000Z'],
    ['2026-03-10', '2026-03-10T00:00:00.000Z'],
    ['24h', '2026-03-09T12:00:00.000Z'],
    ['90m', '2026-03-10T10:30:00.000Z'],
    ['7d', '2026-03-03T12:00:00.000Z'],
    ['2026-02-30', null],
    ['2026-03-10T12:30:00', null],
    ['yesterday', null],
    ['-1h', null],
    ['', null],
  ];
  for (const [text, want] of rows) assert.equal(parseTimeArg(text, NOW), want, text);
});

test('key find limiter: 30 a minute per caller, a fresh count each clock minute', () => {
  const limiter = new FindKeyLimiter();
  const minute = Date.UTC(2026, 2, 10, 12, 0, 0);
  for (let i = 0; i < 30; i++) limiter.take('acct_a', minute + i);
  assert.throws(() => limiter.take('acct_a', minute + 59_000), (e: CpError) => e.code === 'RATE_LIMITED' && /retry in 1s/.test(e.message));
  limiter.take('acct_b', minute + 59_000);
  limiter.take('acct_a', minute + 60_000);
});
