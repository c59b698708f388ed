// Request-log batches: rows survive the columnar encoding exactly, values no report could carry
// (1.5 tokens, "12", NaN, 1e30, negatives) are made safe integers so a report always encodes, the
// upstream boundary (cleanCount) turns what an upstream reports into a safe count, and the block
// reader of queries answers exactly what a full decode answers.
import assert from 'node:assert/strict';
import test from 'node:test';
import fc from 'fast-check';
import { LogColumns, Report } from '../../proto/gen/tollgate/v1/sync.js';
import { scanLogBlock } from '../../proto/lib/log-block-scan.js';
import { clampCount, decodeLogColumns, emptyColumns, LogColumnsBuilder, matchLogColumns, type LogRow } from '../../proto/lib/log-columns.js';
import { MAX_TOKENS_PER_REQUEST } from '../../data-plane/request/request-context.js';
import { cleanCount } from '../../data-plane/proxy/usage/usage-readers.js';

function row(i: number, over: Partial<LogRow> = {}): LogRow {
  return {
    requestId: `inst-${i}`, atMs: 1_700_000_000_000 + i * 7, keyId: `key_${i % 3}`, projectId: 'proj_1', orgId: 'org_1', clientIp: `10.0.0.${i % 5}`,
    userAgent: 'openai-node/6', method: 'POST', path: '/v1/chat/completions', status: i % 4 === 0 ? 429 : 200, latencyUs: 1234 + i, bytesIn: 120, bytesOut: 900 + i,
    model: 'demo-chat', promptTokens: 10 + i, completionTokens: 5, costMicros: 17, reason: i % 4 === 0 ? 'requests' : '', keyPrefix: '', ...over,
  };
}

test('rows survive encode → protobuf → decode unchanged, in order', () => {
  const b = new LogColumnsBuilder();
  const rows = Array.from({ length: 500 }, (_, i) => row(i));
  for (const r of rows) b.add(r);
  const bytes = Report.encode({ seq: 1, usage: [], lastUsed: [], logs: b.cols, instanceId: 'inst', usageTotals: [], logBlocks: [] }).finish();
  const back = decodeLogColumns(Report.decode(bytes).logs);
  assert.equal(back.malformed, 0);
  assert.deepEqual(back.rows, rows);
  // Repeated text is stored once: a few keys, IPs and one path for 500 rows.
  assert.ok(b.cols.strings.length < 20, `string table of ${b.cols.strings.length}`);
  assert.ok(bytes.length / rows.length < 60, `${(bytes.length / rows.length).toFixed(1)} bytes per row`);
});

const POISON: Array<[unknown, number]> = [
  [1.5, 2],
  ['12', 0],
  [NaN, 0],
  [1e30, Number.MAX_SAFE_INTEGER],
  [-3, 0],
  [Infinity, Number.MAX_SAFE_INTEGER],
  [undefined, 0],
  [{}, 0],
  [7, 7],
];

test('clampCount: every value becomes a safe non-negative integer', () => {
  for (const [v, want] of POISON) assert.equal(clampCount(v), want, `clampCount(${String(v)})`);
});

test('a batch whose rows carry poison values still encodes and decodes', () => {
  const b = new LogColumnsBuilder();
  for (const [v] of POISON) {
    b.add(row(1, { promptTokens: v as number, completionTokens: v as number, costMicros: v as number, latencyUs: v as number, status: v as number, atMs: v as number, userAgent: v as string }));
  }
  const bytes = Report.encode({ seq: 2, usage: [], lastUsed: [], logs: b.cols, instanceId: 'inst', usageTotals: [], logBlocks: [] }).finish();
  const back = decodeLogColumns(Report.decode(bytes).logs);
  assert.equal(back.rows.length, POISON.length);
  for (const r of back.rows) for (const n of [r.promptTokens, r.completionTokens, r.costMicros, r.latencyUs, r.status, r.atMs]) assert.ok(Number.isSafeInteger(n) && n >= 0);
});

test('a malformed LogColumns (short column, index out of the table) yields only whole rows', () => {
  const b = new LogColumnsBuilder();
  for (let i = 0; i < 3; i++) b.add(row(i));
  const cols = structuredClone(b.cols);
  cols.status.pop();
  assert.equal(decodeLogColumns(cols).rows.length, 2);
  const cols2 = structuredClone(b.cols);
  cols2.keyId[1] = 999;
  const d = decodeLogColumns(cols2);
  assert.equal(d.rows.length, 2);
  assert.equal(d.malformed, 1);
});

test('cleanCount at the upstream boundary: fractions round up, numeric strings are read, the rest is 0, huge values are clamped', () => {
  const cases: Array<[unknown, number]> = [[1.5, 2], ['12', 12], [NaN, 0], [1e30, MAX_TOKENS_PER_REQUEST], [-4, 0], ['abc', 0], [null, 0], [42, 42]];
  for (const [v, want] of cases) assert.equal(cleanCount(v, 'usage.prompt_tokens', 'test'), want, `cleanCount(${String(v)})`);
});

// The block reader a query uses (log-block-scan.ts) reads only what a filter needs; for any rows and any
// filter it must answer exactly what the generated decoder and matchLogColumns answer.
test('scanLogBlock answers what a full decode answers, for any rows and any filter (property, fixed seed)', () => {
  const text = fc.constantFrom('', 'key_a', 'key_b', 'proj_1', 'org_1', '10.0.0.1', '2001:db8::1', 'héllo ☃', 'x'.repeat(300));
  const num = fc.oneof(fc.integer({ min: 0, max: 2000 }), fc.constantFrom(1.5, -3, NaN, 1e30, Number.MAX_SAFE_INTEGER, 2 ** 40));
  const rowArb = fc.record({
    requestId: fc.string({ minLength: 1, maxLength: 12 }),
    atMs: fc.integer({ min: 1_700_000_000_000, max: 1_700_000_100_000 }),
    keyId: text, projectId: text, orgId: text, clientIp: text, userAgent: text, method: fc.constantFrom('GET', 'POST'), path: text,
    status: fc.constantFrom(200, 401, 429, 499), latencyUs: num, bytesIn: num, bytesOut: num, model: text,
    promptTokens: num, completionTokens: num, costMicros: num, reason: text, keyPrefix: text,
  });
  // Filters mostly built from a row's own values (so rows match and the filter's every part matters),
  // sometimes from values no row has.
  const caseArb = fc.array(rowArb, { minLength: 1, maxLength: 60 }).chain((rows) =>
    fc.tuple(
      fc.constant(rows),
      fc.record({
        from: fc.nat(rows.length - 1),
        fields: fc.subarray(['keyId', 'projectId', 'orgId', 'clientIp', 'status'] as const),
        foreign: fc.option(text, { nil: undefined }),
        since: fc.option(fc.integer({ min: 1_700_000_000_000, max: 1_700_000_100_000 }), { nil: undefined }),
        until: fc.option(fc.integer({ min: 1_700_000_000_000, max: 1_700_000_100_001 }), { nil: undefined }),
      }),
    ),
  );
  let matchedSome = 0;
  fc.assert(
    fc.property(caseArb, ([rows, f]) => {
      const b = new LogColumnsBuilder();
      for (const r of rows) b.add(r as LogRow);
      const bytes = LogColumns.encode(b.cols).finish();
      const src = rows[f.from] as Record<string, unknown>;
      const filter: Record<string, unknown> = { sinceMs: f.since, untilMs: f.until };
      for (const k of f.fields) filter[k] = src[k];
      if (f.foreign !== undefined && f.fields.length > 0) filter[f.fields[0]] = f.fields[0] === 'status' ? 500 : f.foreign;
      for (const k of Object.keys(filter)) if (filter[k] === undefined) delete filter[k];
      const want = matchLogColumns(LogColumns.decode(bytes), filter);
      if (want.length > 0 && want.length < rows.length) matchedSome++;
      assert.deepEqual(scanLogBlock(bytes, filter), want);
    }),
    { seed: 20261123, numRuns: 300 },
  );
  assert.ok(matchedSome > 30, `filters that select some rows but not all: ${matchedSome} of 300`);
});

test('scanLogBlock on a truncated or unexpected block answers like the decoder, or throws as the decoder does', () => {
  const b = new LogColumnsBuilder();
  for (let i = 0; i < 20; i++) b.add(row(i));
  const bytes = LogColumns.encode(b.cols).finish();
  for (const cut of [1, 7, 50, bytes.length - 3]) {
    const part = bytes.subarray(0, cut);
    let want: unknown;
    try {
      want = matchLogColumns(LogColumns.decode(part), {});
    } catch (err) {
      want = err;
    }
    if (want instanceof Error) assert.throws(() => scanLogBlock(part, {}));
    else assert.deepEqual(scanLogBlock(part, {}), want);
  }
  // A column in two parts (valid protobuf; never written by a node) is read by the decoder instead.
  const split = Buffer.concat([bytes, LogColumns.encode({ ...emptyColumns(), status: [201] }).finish()]);
  assert.deepEqual(scanLogBlock(split, {}), matchLogColumns(LogColumns.decode(split), {}));
});

test("a pooled model's deployment and attempts survive the columns and the block scanner; rows without them stay as they were", () => {
  const base: LogRow = {
    requestId: 'r1', atMs: 1000, keyId: 'k', projectId: 'p', orgId: 'o', clientIp: '1.2.3.4', userAgent: 'ua', method: 'POST', path: '/v1/chat/completions',
    status: 200, latencyUs: 5, bytesIn: 1, bytesOut: 2, model: 'm', promptTokens: 3, completionTokens: 4, costMicros: 5, reason: '', keyPrefix: '',
  };
  const rows: LogRow[] = [
    base,
    { ...base, requestId: 'r2', deployment: 'west', attempts: 'east:refused west:200' },
    { ...base, requestId: 'r3', responseId: 'resp_1', deployment: 'east', attempts: 'east:200' },
    { ...base, requestId: 'r4' },
  ];
  const b = new LogColumnsBuilder();
  for (const r of rows) b.add(r);
  const block = b.block();
  assert.deepEqual(scanLogBlock(block.columns, {}).map((x) => x.row), rows);
  assert.deepEqual(decodeLogColumns(LogColumns.decode(block.columns)).rows, rows);
  assert.deepEqual(scanLogBlock(block.columns, { status: 200 }).map((x) => x.row.attempts ?? ''), ['', 'east:refused west:200', 'east:200', '']);
});
