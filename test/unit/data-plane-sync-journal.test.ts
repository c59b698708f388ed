// The node's report journal: reports survive the process (reopened from the segment files), acked ones
// are forgotten and their segments deleted, a torn tail is cut off, and memory mode works without disk.
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'node:test';
import { Report, UsageRecord } from '../../proto/gen/tollgate/v1/sync.js';
import { peekReport } from '../../data-plane/sync/journal-segments.js';
import { Journal } from '../../data-plane/sync/journal.js';

function report(instanceId: string, seq: number, rows = 3): Buffer {
  const usage = Array.from({ length: rows }, (_, i) => ({
    requestId: `${instanceId}-${seq}-${i}`, keyId: 'key_1', orgId: 'org_1', projectId: 'proj_1', model: 'demo-chat', path: '/v1/chat/completions',
    status: 200, promptTokens: 10, completionTokens: 5, costMicros: 7, atMs: 1_700_000_000_000, minute: 28_333_333, leaseEpoch: 1,
  }));
  return Buffer.from(Report.encode({ seq, usage, lastUsed: [], logs: undefined, instanceId, usageTotals: [], logBlocks: [] }).finish());
}

function dir(t: test.TestContext): string {
  const d = mkdtempSync(join(tmpdir(), 'tollgate-journal-'));
  t.after(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

const quiet = { log: () => {} };

test('peekReport reads seq and instance id without decoding the rest', () => {
  assert.deepEqual(peekReport(report('inst-a', 42)), { seq: 42, instanceId: 'inst-a' });
  assert.equal(peekReport(Buffer.from([0xff, 0xff, 0xff])), null);
  assert.equal(peekReport(Buffer.from(Report.encode({ seq: 3, usage: [], lastUsed: [], logs: undefined, instanceId: '', usageTotals: [], logBlocks: [] }).finish())), null);
});

test('unacknowledged reports are found again by a new process; acknowledged ones are not', async (t) => {
  const d = dir(t);
  const j1 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  for (let seq = 1; seq <= 5; seq++) j1.append('inst-a', seq, report('inst-a', seq));
  await j1.sync();
  j1.ack('inst-a', 1);
  j1.ack('inst-a', 3);
  assert.deepEqual(j1.depth.batches, 3);
  // No close: the process is "killed" here.
  const j2 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  const seqs = j2.unacked.map((e) => e.seq);
  // Acks are not journaled: the reopened journal may send acked reports again (the control plane
  // drops them by cursor); it never loses an unacknowledged one.
  for (const s of [2, 4, 5]) assert.ok(seqs.includes(s), `seq ${s} replayed`);
  for (const e of j2.unacked) {
    const r = Report.decode(await j2.read(e));
    assert.equal(r.seq, e.seq);
    assert.equal(r.instanceId, 'inst-a');
    assert.equal(r.usage.length, 3);
  }
});

test('a segment whose reports are all acknowledged is deleted once a newer one exists', async (t) => {
  const d = dir(t);
  const j = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  // ~9 MiB of reports: more than one 4 MiB segment.
  let seq = 0;
  while (j.depth.bytes < 9 * 1024 * 1024) { seq++; j.append("inst-b", seq, report("inst-b", seq, 20_000)); }
  await j.sync();
  assert.ok(readdirSync(d).length >= 2, `several segments: ${readdirSync(d).join(',')}`);
  for (let s = 1; s <= seq; s++) j.ack('inst-b', s);
  // close() returns once the acknowledged segments it is deleting are gone (no wait that hopes).
  await j.close();
  assert.equal(j.depth.batches, 0);
  assert.equal(j.depth.bytes, 0);
  assert.ok(readdirSync(d).length <= 1, `only the current segment is left: ${readdirSync(d).join(',')}`);
});

test('a record cut short by a crash is cut off; the whole ones before it are kept', async (t) => {
  const d = dir(t);
  const j1 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  j1.append('inst-c', 1, report('inst-c', 1));
  j1.append('inst-c', 2, report('inst-c', 2));
  await j1.sync();
  const seg = join(d, readdirSync(d)[0]);
  const before = statSync(seg).size;
  // Half a header and some bytes of a third record.
  appendFileSync(seg, Buffer.from([200, 0, 0, 0, 1, 2]));
  const lines: string[] = [];
  const j2 = new Journal({ dir: d, maxBytes: 1 << 30, log: (l) => lines.push(l) });
  assert.deepEqual(j2.unacked.map((e) => e.seq), [1, 2]);
  assert.equal(statSync(seg).size, before);
  assert.ok(lines.some((l) => /cut off/.test(l)), lines.join('\n'));
});

test('a corrupt record (bad checksum) ends what is read from its segment', async (t) => {
  const d = dir(t);
  const j1 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  j1.append('inst-d', 1, report('inst-d', 1));
  await j1.sync();
  const seg = join(d, readdirSync(d)[0]);
  const r2 = report('inst-d', 2);
  const head = Buffer.alloc(8);
  head.writeUInt32LE(r2.length, 0);
  head.writeUInt32LE(12345, 4);
  appendFileSync(seg, Buffer.concat([head, r2]));
  const j2 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  assert.deepEqual(j2.unacked.map((e) => e.seq), [1]);
});

test('overCap says when the unacknowledged bytes reach the cap; memory mode keeps payloads', () => {
  const j = new Journal({ dir: null, maxBytes: 1000, ...quiet });
  let seq = 0;
  while (!j.overCap) j.append('inst-e', ++seq, report('inst-e', seq));
  assert.ok(j.depth.bytes >= 1000);
  for (const e of j.unacked) assert.ok(e.payload);
  j.ack('inst-e', 1);
  assert.equal(j.depth.batches, seq - 1);
});

test('a report acknowledged before the journal closed is not found again', async (t) => {
  const d = dir(t);
  const j = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  j.append('inst-f', 1, report('inst-f', 1));
  j.ack('inst-f', 1);
  await j.sync();
  await j.close();
  const j2 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  assert.equal(j2.depth.batches, 0);
});

test('usage written after the last report is found by the next process, billed once in a report of its own, and never again', async (t) => {
  // Before the fix, usage reached the journal only inside a report sealed at the next flush: a node
  // killed in between lost what it had answered since the last one.
  const d = dir(t);
  const record = (i: number) => Buffer.from(UsageRecord.encode({ requestId: `r${i}`, keyId: 'key_1', orgId: 'org_1', projectId: 'proj_1', model: 'demo-chat', path: '/v1/chat/completions', status: 200, promptTokens: 10, completionTokens: 5, costMicros: 7, atMs: 1_700_000_000_000, minute: 28_333_333, leaseEpoch: 1 }).finish());
  const j1 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  j1.writeUsage(record(1));
  j1.writeUsage(record(2));
  j1.append('inst-g', 1, report('inst-g', 1));
  j1.writeUsage(record(3));
  j1.writeUsage(record(4));
  // Killed: no sync, no close. Records 1 and 2 are in report 1; 3 and 4 in none.
  const j2 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  assert.deepEqual(j2.unacked.map((e) => e.seq), [1]);
  const orphans = j2.takeOrphanUsage().map((b) => UsageRecord.decode(b).requestId);
  assert.deepEqual(orphans, ['r3', 'r4']);
  assert.deepEqual(j2.takeOrphanUsage(), [], 'taken once');
  // The next process seals them in a report of its own, written after them.
  j2.append('inst-h', 1, report('inst-h', 1));
  // Killed again before anything was acknowledged: both reports are sent again, the records are not.
  const j3 = new Journal({ dir: d, maxBytes: 1 << 30, ...quiet });
  assert.deepEqual(j3.unacked.map((e) => `${e.instanceId}#${e.seq}`), ['inst-g#1', 'inst-h#1']);
  assert.deepEqual(j3.takeOrphanUsage(), []);
  // Both acknowledged and closed: nothing is left.
  j3.ack('inst-g', 1);
  j3.ack('inst-h', 1);
  await j3.close();
  assert.deepEqual(readdirSync(d), []);
});
