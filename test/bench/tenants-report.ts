// bench:tenants' accounting and printing: CPU of a set of processes (/proc), the control plane's
// /metrics counters and the nodes' lease waits, one run's line, the closing table and the JSON file
// under test/bench/out/.
import { mkdirSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../helpers/processes.js';
import { cpuMicros, type threadCpuMicros } from './procstat.js';
import { MB } from './tenants-options.js';

export interface WaitStatsJson {
  waited: number;
  admitted: number;
  mean_ms: number;
  p50_ms: number;
  p99_ms: number;
  max_ms: number;
}

/** Counters of the control plane's /metrics this run reads (summed over their labels, by name and label text). */
export async function cpCounters(adminUrl: string | undefined): Promise<Record<string, number>> {
  if (!adminUrl) return {};
  const text = await (await fetch(`${adminUrl}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const m = /^(tollgate_cp_(?:lease_answers_total|sync_messages_total|ingest_reports_total|db_transaction_seconds_count|db_transaction_seconds_sum|ingest_backlog_reports))(\{[^}]*\})? (\S+)$/.exec(line);
    if (m) out[`${m[1]}${m[2] ?? ''}`] = (out[`${m[1]}${m[2] ?? ''}`] ?? 0) + Number(m[3]);
  }
  return out;
}

export async function leaseWaits(adminUrl: string, reset = false): Promise<WaitStatsJson> {
  return (await (await fetch(`${adminUrl}/stats/lease-waits${reset ? '?reset=1' : ''}`)).json()) as WaitStatsJson;
}

export interface RunResult {
  run: string;
  /** The control plane's store. */
  store: 'sqlite' | 'postgres';
  nodes: number;
  keys: number;
  orgs: number;
  rate: number;
  durationSec: number;
  sent: number;
  ok: number;
  refusals: Record<string, number>;
  firstRefusal: string;
  crossedMinute: boolean;
  cpUsPerRequest: number | null;
  /** Of which its main thread (the event loop; the rest is SQLite's worker threads, GC and the compiler). */
  cpMainThreadUsPerRequest: number | null;
  /** The database server's processes (PostgreSQL); null for SQLite, which runs inside the control plane. */
  dbUsPerRequest: number | null;
  nodesUsPerRequest: number | null;
  cpIdleUsPerSec: number | null;
  cpMainIdleUsPerSec: number | null;
  dbIdleUsPerSec: number | null;
  nodesIdleUsPerSec: number | null;
  latencyMs: { p50: number; p90: number; p99: number; max: number };
  waited: number;
  waitedShare: number;
  waitMs: { mean: number; p99max: number; max: number };
  cpRssBytes: number | null;
  /** What the control plane did during the run (its /metrics counters: reports, lease answers, transactions). */
  cpWork: Record<string, number>;
  /** The machine's load average (1, 5, 15 min) at the run's end. */
  loadAverage: number[];
}

/** CPU of a set of processes, summed, in µs (null if /proc is not there). */
export function cpuOf(pids: number[]): number | null {
  let sum = 0;
  for (const p of pids) {
    const c = cpuMicros(p);
    if (c === null) return null;
    sum += c;
  }
  return sum;
}

/** Prints one run: its figures, the control plane's threads by CPU, its work and the first refusal. */
export function printRun(r: RunResult, threads0: ReturnType<typeof threadCpuMicros>, threads1: ReturnType<typeof threadCpuMicros>): void {
  const { run: label, sent, durationSec: loadSec, refusals, waited, cpWork, firstRefusal } = r;
  const f = (n: number | null, d = 0) => (n === null ? 'n/a' : n.toFixed(d));
  const refused = Object.entries(refusals).map(([k, v]) => `${v}×${k}`).join(', ') || 'none';
  const db = r.store === 'sqlite' ? 'in process' : `${f(r.dbUsPerRequest)} µs`;
  console.log(
    `  [${r.store}] ${label}: ${sent} requests in ${loadSec.toFixed(1)} s (${(sent / loadSec).toFixed(0)}/s${r.crossedMinute ? ', crossed a minute' : ', NO minute crossed'}); ` +
      `CPU per request: control plane ${f(r.cpUsPerRequest)} µs (main thread ${f(r.cpMainThreadUsPerRequest)}), database server ${db}, nodes ${f(r.nodesUsPerRequest)} µs (sum); ` +
      `latency p50 ${r.latencyMs.p50.toFixed(2)} / p90 ${r.latencyMs.p90.toFixed(2)} / p99 ${r.latencyMs.p99.toFixed(2)} / max ${r.latencyMs.max.toFixed(1)} ms; ` +
      `waited for the control plane: ${waited} (${(r.waitedShare * 100).toFixed(2)}%, mean ${r.waitMs.mean.toFixed(1)} ms, p99 ≤ ${r.waitMs.p99max.toFixed(1)} ms, max ${r.waitMs.max.toFixed(1)} ms); refused: ${refused}` +
      `; control-plane RSS ${f(r.cpRssBytes === null ? null : r.cpRssBytes / MB)} MB; load average ${r.loadAverage.join(', ')}`,
  );
  // The control plane's threads by CPU in the run (tid order is creation order: the main thread, V8's
  // workers, then libuv's pool, where SQLite runs).
  const tids = [...threads1.keys()].sort((a, b) => a - b);
  const threadUse = tids
    .map((t, i) => ({ i, us: (threads1.get(t)?.total ?? 0) - (threads0.get(t)?.total ?? 0), sys: (threads1.get(t)?.sys ?? 0) - (threads0.get(t)?.sys ?? 0) }))
    .filter((x) => x.us > 0);
  console.log(`    control plane's threads (creation order #: µs per request, of which in the kernel as clock ticks count it): ${threadUse.map((x) => `#${x.i} ${(x.us / sent).toFixed(1)} (${(x.sys / sent).toFixed(1)})`).join(', ')}`);
  console.log(`    control plane's work: ${Object.entries(cpWork).map(([k, v]) => `${k} ${v}`).join(', ') || 'none'}`);
  if (firstRefusal) console.log(`    first refusal: ${firstRefusal}`);
}

/** The closing table, one line per run, the stores' lines of the same run next to each other. */
export function printTable(results: RunResult[]): void {
  console.log('\n| run | store | control plane CPU per request | database server CPU per request | nodes\' CPU per request (sum) | p50 / p90 / p99 / max latency | waited for the control plane | refused |');
  console.log('|---|---|---|---|---|---|---|---|');
  const order = [...new Set(results.map((r) => r.run))];
  const sorted = [...results].sort((a, b) => order.indexOf(a.run) - order.indexOf(b.run));
  for (const r of sorted) {
    const f = (n: number | null) => (n === null ? 'n/a' : `${n.toFixed(0)} µs`);
    const refused = Object.values(r.refusals).reduce((s, v) => s + v, 0);
    console.log(
      `| ${r.run} | ${r.store} | ${f(r.cpUsPerRequest)} | ${r.store === 'sqlite' ? 'in process' : f(r.dbUsPerRequest)} | ${f(r.nodesUsPerRequest)} | ${r.latencyMs.p50.toFixed(1)} / ${r.latencyMs.p90.toFixed(1)} / ${r.latencyMs.p99.toFixed(1)} / ${r.latencyMs.max.toFixed(0)} ms | ${(r.waitedShare * 100).toFixed(2)}% (max ${r.waitMs.max.toFixed(0)} ms) | ${refused} |`,
    );
  }
}

/** The machine's load average (1, 5, 15 min), printed with the figures: on a shared machine it says how far to trust them. */
export function machineLoad(): number[] {
  return loadavg().map((x) => Math.round(x * 100) / 100);
}

/** Writes a run's results to test/bench/out/<name>-<time>.json and says where. */
export function writeResults(name: string, data: unknown): void {
  const dir = join(ROOT, 'test', 'bench', 'out');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${name}-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, JSON.stringify(data, null, 2));
  console.log(`\nwritten to ${file}`);
}

/** What printFakeTable reads of a --fake-nodes run (tenants-fake-nodes.ts simulate). */
interface FakeRow {
  target: string;
  simulatedRate: number;
  cpUsPerRequest: number | null;
  cpUsPerAckedRequest: number | null;
  coreShare: number | null;
  dbUsPerAckedRequest: number | null;
  dbCoreShare: number | null;
  cpPeakRssBytes: number | null;
  reportsAcked: number;
  reportsSent: number;
  tailSec: number;
}

/** --fake-nodes' closing table: the control plane on each store, then the bare SyncService, of one run. */
export function printFakeTable(results: FakeRow[], bare: FakeRow | null): void {
  const us = (n: number | null) => (n === null ? 'n/a' : `${n.toFixed(2)} µs`);
  const share = (n: number | null) => (n === null ? 'n/a' : `${(n * 100).toFixed(0)}%`);
  console.log('\n| target | simulated req/s | control plane CPU per simulated / acknowledged request (share of a core) | database server CPU per acknowledged request (share of a core) | peak RSS | reports acknowledged (last after the load) |');
  console.log('|---|---|---|---|---|---|');
  for (const r of bare ? [...results, bare] : results) {
    const db = r.target === 'postgres' ? `${us(r.dbUsPerAckedRequest)} (${share(r.dbCoreShare)})` : r.target === 'sqlite' ? 'in process' : '—';
    console.log(
      `| ${r.target === 'bare' ? 'bare SyncService' : `control plane on ${r.target}`} | ${r.simulatedRate.toFixed(0)} | ${us(r.cpUsPerRequest)} / ${us(r.cpUsPerAckedRequest)} (${share(r.coreShare)}) | ${db} | ${r.cpPeakRssBytes === null ? 'n/a' : `${(r.cpPeakRssBytes / MB).toFixed(0)} MB`} | ${r.reportsAcked}/${r.reportsSent} (${r.tailSec.toFixed(1)} s) |`,
    );
  }
}
