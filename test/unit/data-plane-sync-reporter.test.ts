// The node's reporter: usage (summed per key, model, minute and lease epoch) and log rows (packed in
// one block per UTC day) become numbered reports in the journal; at most a window of them is on the
// wire; an ack forgets one; a new stream gets every unacknowledged report again in order; a usage
// record carrying values no report could encode (1.5, NaN, 1e30) is still sent.
import assert from 'node:assert/strict';
import test from 'node:test';
import { LogColumns, type NodeMessage, type UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import { decodeLogColumns, type LogRow } from '../../proto/lib/log-columns.js';
import { Journal } from '../../data-plane/sync/journal.js';
import { Reporter, type ReportStream } from '../../data-plane/sync/reporter.js';
import { ManualClock } from '../../data-plane/limits/clock.js';

class FakeStream implements ReportStream {
  readonly sent: NodeMessage[] = [];
  write(msg: NodeMessage): boolean {
    this.sent.push(msg);
    return true;
  }
  once(): void {}
  /** Every report sent, alone or several to a message. */
  reports() {
    return this.sent.flatMap((m) => (m.report ? [m.report] : (m.reports?.reports ?? [])));
  }
}

const tick = () => new Promise((r) => setImmediate(r));

function usage(i: number, over: Partial<UsageRecord> = {}): UsageRecord {
  return { requestId: `r${i}`, keyId: 'k', orgId: 'o', projectId: 'p', model: 'm', path: '/v1/chat/completions', status: 200, promptTokens: 1, completionTokens: 2, costMicros: 3, atMs: 1_700_000_000_000, minute: 1, leaseEpoch: 1, ...over };
}

function logRow(i: number): LogRow {
  return { requestId: `r${i}`, atMs: 1_700_000_000_000 + i, keyId: 'k', projectId: 'p', orgId: 'o', clientIp: '10.0.0.1', userAgent: 'ua', method: 'POST', path: '/v1/chat/completions', status: 200, latencyUs: 5, bytesIn: 1, bytesOut: 2, model: 'm', promptTokens: 1, completionTokens: 2, costMicros: 3, reason: '', keyPrefix: '' };
}

function reporter(journal = new Journal({ dir: null, maxBytes: 1 << 30, log: () => {} }), lines: string[] = [], sendEveryMs = 0) {
  const r = new Reporter(new ManualClock(), { instanceId: 'inst', journal, log: (l) => lines.push(l), flushEveryMs: 3_600_000, sendEveryMs });
  test.after(() => r.stop());
  return { r, journal, lines };
}

test('rows become one numbered report carrying usage and request logs; an ack forgets it', async () => {
  const { r, journal } = reporter();
  const s = new FakeStream();
  r.attach(s);
  r.record(usage(1));
  r.record(usage(2, { promptTokens: 10 }));
  r.record(usage(3, { model: 'm2' }));
  r.record(usage(4, { atMs: 1_700_000_000_000 + 60_000, leaseEpoch: 2 }));
  r.log(logRow(1));
  r.log(logRow(2));
  r.log({ ...logRow(3), keyId: 'k2', atMs: 1_700_000_000_100 });
  // A row of the next UTC day goes in a block of its own.
  const nextDay = Math.ceil(1_700_000_000_000 / 86_400_000) * 86_400_000;
  r.log({ ...logRow(4), atMs: nextDay });
  r.flush();
  await tick();
  const [rep] = s.reports();
  assert.equal(rep.seq, 1);
  assert.equal(rep.instanceId, 'inst');
  assert.deepEqual(rep.usage, []);
  const minute = Math.floor(1_700_000_000_000 / 60_000);
  const total = (over: object) => ({ keyId: 'k', orgId: 'o', projectId: 'p', model: 'm', minute, leaseEpoch: 1, requests: 1, promptTokens: 1, completionTokens: 2, costMicros: 3, ...over });
  assert.deepEqual(rep.usageTotals, [
    total({ requests: 2, promptTokens: 11, completionTokens: 4, costMicros: 6 }),
    total({ model: 'm2' }),
    total({ minute: minute + 1, leaseEpoch: 2 }),
  ]);
  assert.equal(rep.logBlocks.length, 2);
  const [today, tomorrow] = rep.logBlocks;
  assert.deepEqual(decodeLogColumns(LogColumns.decode(today.columns)).rows, [logRow(1), logRow(2), { ...logRow(3), keyId: 'k2', atMs: 1_700_000_000_100 }]);
  assert.deepEqual([today.rows, today.minAtMs, today.maxAtMs], [3, 1_700_000_000_001, 1_700_000_000_100]);
  assert.deepEqual(today.keys, [
    { keyId: 'k', projectId: 'p', orgId: 'o', minAtMs: 1_700_000_000_001, maxAtMs: 1_700_000_000_002, rows: 2 },
    { keyId: 'k2', projectId: 'p', orgId: 'o', minAtMs: 1_700_000_000_100, maxAtMs: 1_700_000_000_100, rows: 1 },
  ]);
  assert.deepEqual(decodeLogColumns(LogColumns.decode(tomorrow.columns)).rows, [{ ...logRow(4), atMs: nextDay }]);
  assert.deepEqual([tomorrow.rows, tomorrow.minAtMs, tomorrow.maxAtMs], [1, nextDay, nextDay]);
  assert.equal(r.status.journalBatches, 1);
  r.ack(1, 'inst');
  assert.equal(journal.depth.batches, 0);
});

/** The report numbers of each message sent (a single report, or several in one). */
function messages(s: FakeStream): number[][] {
  return s.sent.filter((m) => m.report || m.reports).map((m) => (m.report ? [m.report.seq] : m.reports!.reports.map((r) => r.seq)));
}

test('reports waiting go several to a message (8 at most); at most 16 are on the wire; acks let the next go; a new stream gets the unacknowledged again, in order', async () => {
  const { r } = reporter();
  for (let i = 1; i <= 20; i++) {
    r.record(usage(i));
    r.flush();
  }
  const s1 = new FakeStream();
  r.attach(s1);
  await tick();
  assert.deepEqual(messages(s1), [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]);
  r.ack(2, 'inst');
  await tick();
  assert.deepEqual(messages(s1).slice(2), [[17]]);
  r.detach();
  const s2 = new FakeStream();
  r.attach(s2);
  await tick();
  assert.deepEqual(messages(s2), [[1, 3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17]]);
});

test('once caught up, new reports wait for the send interval and then go together', async () => {
  const { r } = reporter(undefined, [], 300);
  const s = new FakeStream();
  r.attach(s);
  r.record(usage(1));
  r.flush();
  await tick();
  // A new stream is sent to at once.
  assert.deepEqual(messages(s), [[1]]);
  r.ack(1, 'inst');
  for (let i = 2; i <= 4; i++) {
    r.record(usage(i));
    r.flush();
  }
  await tick();
  assert.deepEqual(messages(s), [[1]], 'reports made right after a send wait');
  const deadline = Date.now() + 5000;
  while (messages(s).length < 2 && Date.now() < deadline) await new Promise((res) => setTimeout(res, 20));
  assert.deepEqual(messages(s), [[1], [2, 3, 4]]);
});

test('a usage record with 1.5, NaN and 1e30 in it is sent with safe integers (the stream is never poisoned)', async () => {
  const { r } = reporter();
  const s = new FakeStream();
  r.attach(s);
  r.record(usage(1, { promptTokens: 1.5, completionTokens: NaN, costMicros: 1e30, atMs: -5 }));
  r.flush();
  await tick();
  const u = s.reports()[0].usageTotals[0];
  assert.equal(u.promptTokens, 2);
  assert.equal(u.completionTokens, 0);
  assert.equal(u.costMicros, Number.MAX_SAFE_INTEGER);
  assert.equal(u.minute, 0);
});

test('past the journal cap request-log rows are dropped (said once, counted) while usage is kept; past 1.5 times it whole reports are', async () => {
  const lines: string[] = [];
  const { r } = reporter(new Journal({ dir: null, maxBytes: 200, log: () => {} }), lines);
  for (let i = 0; i < 20; i++) {
    r.record(usage(i));
    r.log(logRow(i));
    r.flush();
  }
  assert.ok(r.status.droppedLogRows > 0);
  assert.equal(lines.filter((l) => /request-log rows are dropped/.test(l)).length, 1, lines.join('\n'));
  // Past 1.5 times the cap whole reports go too, and that is said as well.
  assert.ok(lines.some((l) => /whole reports \(usage too\) dropped/.test(l)), lines.join('\n'));
  const s = new FakeStream();
  r.attach(s);
  await tick();
  // The reports kept after the cap still carry usage.
  assert.ok(s.reports().length > 0);
  assert.ok(s.reports().every((x) => x.usageTotals.length === 1 && x.usageTotals[0].requests === 1));
});

test('replaying n unacknowledged reports costs work linear in n: each acknowledgement looks at O(1) entries', async () => {
  // Before the fix, each ack searched the journal's array (find, indexOf, splice) and each send
  // filtered all of it: replaying 20,000 reports looked at hundreds of millions of entries.
  const counts: Array<[number, number]> = [];
  for (const n of [2_000, 20_000]) {
    const journal = new Journal({ dir: null, maxBytes: 2 ** 40, log: () => {} });
    const { r } = reporter(journal);
    // n reports piled up while the control plane was away.
    for (let i = 0; i < n; i++) {
      r.record(usage(i));
      r.flush();
    }
    assert.equal(journal.depth.batches, n);
    // A control plane that acknowledges every report as soon as it is written.
    const pending: number[] = [];
    const stream: ReportStream = {
      write(msg) {
        for (const rep of msg.report ? [msg.report] : (msg.reports?.reports ?? [])) pending.push(rep.seq);
        return true;
      },
      once() {},
    };
    const before = journal.entriesVisited;
    r.attach(stream);
    while (journal.depth.batches > 0) {
      await tick();
      for (const seq of pending.splice(0)) r.ack(seq, 'inst');
    }
    counts.push([n, journal.entriesVisited - before]);
  }
  // A constant per report (lookups, and the window's in-flight entries skipped per send), the same at
  // 2,000 and at 20,000 reports.
  for (const [n, work] of counts) assert.ok(work <= 30 * n, `${n} reports replayed with ${work} entries looked at`);
  const [[n1, w1], [n2, w2]] = counts;
  assert.ok(w2 / n2 <= 1.5 * (w1 / n1), `work per report grew from ${(w1 / n1).toFixed(1)} to ${(w2 / n2).toFixed(1)}`);
});
