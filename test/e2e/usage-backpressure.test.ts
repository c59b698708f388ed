// Ingest backpressure (issue 9, item 5): while the control plane cannot write reports, it stops reading
// the node's stream instead of queueing what arrives, so HTTP/2 flow control holds the node back and
// the control plane's memory stays bounded however much a node sends; once writing works again, every
// report is written and acknowledged, in order, and none is lost. The writes are held up by a test
// that takes logs.db's write lock (the control plane waits on it: busy_timeout).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, test } from 'node:test';
import sqlite3 from 'sqlite3';
import { LogColumnsBuilder, type LogRow } from '../../proto/lib/log-columns.js';
import type { Report } from '../../proto/gen/tollgate/v1/sync.js';
import { eventually } from '../helpers/data-plane.js';
import { startFakeNode } from '../helpers/fake-node.js';
import { scrapeMetrics } from '../helpers/prometheus.js';
import { startControlPlane, stopAll } from '../helpers/processes.js';
import { logsDbOf } from '../helpers/usage-db.js';

after(stopAll);

const rssMiB = (pid: number) => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

/** A report carrying one block of 2,000 rows, each with a long user agent: about 450 KB on the wire. */
function bigReport(seq: number, at: number): Report {
  const b = new LogColumnsBuilder();
  for (let i = 0; i < 2000; i++) {
    const row: LogRow = {
      requestId: `bp-${seq}-${i}`, atMs: at + i, keyId: 'key_backpressure', projectId: 'proj_bp', orgId: 'org_bp', clientIp: `10.1.${i >> 8}.${i & 255}`,
      userAgent: `agent-${seq}-${i}-${'x'.repeat(200)}`, method: 'POST', path: '/v1/chat/completions', status: 200, latencyUs: 900, bytesIn: 190,
      bytesOut: 400, model: 'demo-chat', promptTokens: 3, completionTokens: 4, costMicros: 0, reason: '', keyPrefix: '',
    };
    b.add(row);
  }
  return { seq, usage: [], lastUsed: [], logs: undefined, instanceId: '', usageTotals: [], logBlocks: [b.block()] };
}

function exec(db: sqlite3.Database, sql: string): Promise<void> {
  return new Promise((resolve, reject) => db.exec(sql, (err) => (err ? reject(err) : resolve())));
}

test('a control plane that cannot write stops reading the node: its memory stays bounded, then every report is written once, in order', async () => {
  const cp = await startControlPlane({ adminListen: true });
  const node = await startFakeNode(cp, { holdAcks: false });
  const at = Date.now();
  // One report first: logs.db's tables exist and the baseline includes a written report.
  node.write({ report: bigReport(1, at) });
  await eventually(async () => node.reportAcks.includes(1), 'the first report acknowledged');
  const pid = cp.proc.child.pid!;
  const rssBefore = rssMiB(pid);

  const lock = new sqlite3.Database(logsDbOf(cp.dbPath));
  await exec(lock, 'PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE');
  const REPORTS = 100;
  const reports = Array.from({ length: REPORTS }, (_, i) => bigReport(i + 2, at + (i + 1) * 10_000));
  const bytes = reports.reduce((n, r) => n + r.logBlocks[0].columns.length, 0);
  let refused = 0;
  for (const r of reports) if (!node.write({ report: r })) refused++;
  // The control plane has read up to where it pauses the stream: two reports waiting (one being
  // written, blocked on the lock, and one more). Waiting for that count, not for a time: a control
  // plane that kept reading would show more here, or its memory below.
  let backlog: number | undefined;
  await eventually(async () => {
    backlog = (await scrapeMetrics(`${cp.adminUrl}/metrics`)).value('tollgate_cp_ingest_backlog_reports');
    return backlog !== undefined && backlog >= 2;
  }, 'the control plane holding two reports it cannot write');
  backlog = (await scrapeMetrics(`${cp.adminUrl}/metrics`)).value('tollgate_cp_ingest_backlog_reports');
  const grown = rssMiB(pid) - rssBefore;
  await exec(lock, 'COMMIT');
  lock.close();

  assert.ok(refused > 0, 'the stream pushed back on the node: its writes were buffered, not read');
  assert.ok(backlog !== undefined && backlog <= 2, `reports read and waiting: ${backlog}`);
  // Read ahead: at most one report and one being parsed, plus HTTP/2 windows (measured: 4.5 MiB; it
  // was 28 MiB while grpc-js read 16 reports ahead of a paused stream).
  assert.ok(grown < bytes / 2 ** 20 / 4, `control-plane RSS grew ${grown.toFixed(0)} MiB while ${(bytes / 2 ** 20).toFixed(0)} MiB were sent`);
  assert.equal(node.streamError(), undefined);

  await eventually(async () => node.reportAcks.length === REPORTS + 1, `all ${REPORTS + 1} reports acknowledged (got ${node.reportAcks.length})`, 60_000);
  assert.deepEqual(node.reportAcks, Array.from({ length: REPORTS + 1 }, (_, i) => i + 1), 'acknowledged once each, in order');
  const stored = await new Promise<number>((resolve, reject) => {
    const db = new sqlite3.Database(logsDbOf(cp.dbPath), sqlite3.OPEN_READONLY, (err) => {
      if (err) return reject(err);
      db.all("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'logblocks_%'", (e, tables: { name: string }[]) => {
        if (e) return reject(e);
        db.get(`SELECT SUM(n) AS n FROM (${tables.map((t) => `SELECT SUM(rows) AS n FROM ${t.name}`).join(' UNION ALL ')})`, (e2, row: { n: number }) => {
          db.close();
          if (e2) reject(e2);
          else resolve(row.n);
        });
      });
    });
  });
  assert.equal(stored, (REPORTS + 1) * 2000, 'every row stored once');
  node.close();
});
