// `npm run bench:tenants [-- --keys 5000 --orgs 500 --rate 400 --zipf 1.0 --duration 30]`: many
// customers through one control plane (issue 19). A script that prints figures, not a test.
//
// Set-up: a control plane whose tier `bench` has limits far away (10^12 rpm, no cap, a large grant)
// and the demo provider; one key in its own organisation (the control), then K keys in O organisations
// seeded straight into its SQLite database (real key values, hashed with the run's pepper, so they
// authenticate), and the control plane restarted so it loads them. Then, for 1 node and then for 3
// nodes (fresh processes): the one key, then the K keys, each at the same constant rate (an open-loop
// generator: a request that is due goes out whatever the latency of the others), each request sent to
// a node picked at random, the K keys' requests picking a key by a Zipf law (rank r with probability
// ∝ 1/r^s; key r belongs to organisation r mod O, so hot keys are spread over organisations).
//
// Each run covers a minute boundary: with --duration under 60 s the run starts so that the top of a
// clock minute falls in its middle (the wait before it is the idle measurement); --no-align skips
// that (quick runs while developing). Before the load the control plane's and the nodes' CPU is read
// over an idle window; the idle rate times the run's length is subtracted from what they used during
// the run (plus a 2 s tail for the last reports), divided by the requests sent.
//
// Printed per run: control-plane and nodes' CPU per request (µs), latency p50/p90/p99/max of every
// answer, the share of requests that waited for the control plane (a key lease or a money slice: the
// nodes' GET /stats/lease-waits) and how long, and refusals by status. Results go to
// test/bench/out/tenants-<time>.json.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import { Db } from '../../control-plane/store/db.js';
import { hashKey } from '../../proto/lib/keys.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { configYaml } from '../helpers/config.js';
import { startControlPlane, startDataPlane, stopAll, ROOT, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { startFakeNode, type FakeNode } from '../helpers/fake-node.js';
import { LogBlocksBuilder } from '../../proto/lib/log-columns.js';
import type { KeyLeaseWant, LeaseRequest, LogBlock, SlotWant, UsageTotal } from '../../proto/gen/tollgate/v1/sync.js';
import { nextIp } from './load.js';
import { cpuMicros, mainThreadCpuMicros, rssBytes, threadCpuMicros, watchRss } from './procstat.js';

const { values: opts } = parseArgs({
  options: {
    keys: { type: 'string', default: '5000' },
    orgs: { type: 'string', default: '500' },
    rate: { type: 'string', default: '400' },
    zipf: { type: 'string', default: '1.0' },
    duration: { type: 'string', default: '30' },
    nodes: { type: 'string', default: '1,3' },
    idle: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '0' },
    'no-align': { type: 'boolean', default: false },
    'no-control': { type: 'boolean', default: false },
    'cpu-prof': { type: 'string' },
    'fake-nodes': { type: 'boolean', default: false },
    'fake-leases': { type: 'string', default: 'per-minute' },
    'no-fake-logs': { type: 'boolean', default: false },
  },
});
const FAKE = opts['fake-nodes']!;
// Cluster scale (target 3) unless told otherwise: 10 simulated nodes, 100,000 req/s, 100,000 keys in 10,000 organisations.
if (FAKE) {
  opts.keys = process.argv.includes('--keys') ? opts.keys : '100000';
  opts.orgs = process.argv.includes('--orgs') ? opts.orgs : '10000';
  opts.rate = process.argv.includes('--rate') ? opts.rate : '100000';
  opts.nodes = process.argv.includes('--nodes') ? opts.nodes : '10';
}
const KEYS = positive('keys');
const ORGS = Math.min(positive('orgs'), KEYS);
const RATE = positive('rate');
const ZIPF = Number(opts.zipf);
const DURATION_SEC = positive('duration');
const NODE_COUNTS = opts.nodes!.split(',').map(Number);
const IDLE_SEC = Number(opts.idle);
/** Seconds of the K keys' load sent to the same nodes before the measured run (0: none): steady state, without the nodes' first minute. */
const WARMUP_SEC = Number(opts.warmup);
const ALIGN = !opts['no-align'] && DURATION_SEC < 60;
const TAIL_MS = 2000;
const MB = 1024 * 1024;

function positive(name: 'keys' | 'orgs' | 'rate' | 'duration'): number {
  const n = Number(opts[name]);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${name} must be a positive number, got ${JSON.stringify(opts[name])}`);
  return n;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const BODY = JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello there! In one sentence, what is an API gateway for?' }] });

function benchConfig(): string {
  return configYaml((cfg) => {
    cfg.trusted_proxies = ['127.0.0.1'];
    cfg.tiers.bench = { rpm: 1_000_000_000_000, tpm: 1_000_000_000_000_000, max_parallel_requests: 1_000_000, monthly_cap_usd: null, free_grant_usd: '1000000000', models: ['demo-chat'] };
  });
}

/** The value of tenant key i: fixed characters, so the run can present it and hash it. */
const tenantKey = (i: number) => `sk-tollgate-bench${String(i).padStart(38, '0')}`;

/**
 * Seeds `keys` keys in `orgs` organisations (one project each) into a stopped control plane's
 * database, multi-row inserts in one transaction. Key i belongs to organisation i mod orgs.
 */
async function seedTenants(dbPath: string, pepper: string, keys: number, orgs: number): Promise<void> {
  const db = await Db.open(dbPath);
  const now = new Date().toISOString();
  const pep = Buffer.from(pepper, 'utf8');
  const orgId = (j: number) => `org_t${String(j).padStart(7, '0')}`;
  const projectId = (j: number) => `proj_t${String(j).padStart(7, '0')}`;
  const keyId = (i: number) => `key_t${String(i).padStart(8, '0')}`;
  const insert = async (sql: string, width: number, n: number, row: (i: number) => (string | number)[]) => {
    const chunk = Math.floor(900 / width);
    for (let i = 0; i < n; i += chunk) {
      const m = Math.min(chunk, n - i);
      const params: (string | number)[] = [];
      for (let j = i; j < i + m; j++) params.push(...row(j));
      await db.run(`${sql} VALUES ${Array.from({ length: m }, () => `(${Array(width).fill('?').join(', ')})`).join(', ')}`, params);
    }
  };
  await db.exec('BEGIN');
  await insert('INSERT INTO orgs (id, name, tier, created_at)', 4, orgs, (j) => [orgId(j), `tenant ${j}`, 'bench', now]);
  await insert('INSERT INTO projects (id, org_id, name, created_at)', 4, orgs, (j) => [projectId(j), orgId(j), 'project', now]);
  await insert(
    "INSERT INTO api_keys (id, project_id, org_id, name, key_prefix, allowed_models, status, rpm_limit, tpm_limit, max_parallel_requests, created_at)",
    11,
    keys,
    (i) => [keyId(i), projectId(i % orgs), orgId(i % orgs), 'tenant', `${tenantKey(i).slice(0, 12)}...${tenantKey(i).slice(-4)}`, '[]', 'active', 1_000_000_000_000, 1_000_000_000_000_000, 1_000_000, now],
  );
  await insert('INSERT INTO credentials (key_hash, key_id)', 2, keys, (i) => [hashKey(pep, tenantKey(i)), keyId(i)]);
  await db.exec('COMMIT');
  await db.close();
}

/** Zipf sampler over ranks 0..n-1 (rank r has weight 1/(r+1)^s): a cumulative table and a binary search. */
function zipfSampler(n: number, s: number): () => number {
  const cdf = new Float64Array(n);
  let sum = 0;
  for (let r = 0; r < n; r++) {
    sum += 1 / Math.pow(r + 1, s);
    cdf[r] = sum;
  }
  return () => {
    const u = Math.random() * sum;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] < u) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
}

interface WaitStatsJson {
  waited: number;
  admitted: number;
  mean_ms: number;
  p50_ms: number;
  p99_ms: number;
  max_ms: number;
}

/** Counters of the control plane's /metrics this run reads (summed over their labels, by name and label text). */
async function cpCounters(adminUrl: string | undefined): Promise<Record<string, number>> {
  if (!adminUrl) return {};
  const text = await (await fetch(`${adminUrl}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const m = /^(tollgate_cp_(?:lease_answers_total|sync_messages_total|ingest_reports_total|db_transaction_seconds_count|db_transaction_seconds_sum|ingest_backlog_reports))(\{[^}]*\})? (\S+)$/.exec(line);
    if (m) out[`${m[1]}${m[2] ?? ''}`] = (out[`${m[1]}${m[2] ?? ''}`] ?? 0) + Number(m[3]);
  }
  return out;
}

async function leaseWaits(adminUrl: string, reset = false): Promise<WaitStatsJson> {
  return (await (await fetch(`${adminUrl}/stats/lease-waits${reset ? '?reset=1' : ''}`)).json()) as WaitStatsJson;
}

interface RunResult {
  run: string;
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
  nodesUsPerRequest: number | null;
  cpIdleUsPerSec: number | null;
  nodesIdleUsPerSec: number | null;
  latencyMs: { p50: number; p90: number; p99: number; max: number };
  waited: number;
  waitedShare: number;
  waitMs: { mean: number; p99max: number; max: number };
  cpRssBytes: number | null;
  /** What the control plane did during the run (its /metrics counters: reports, lease answers, transactions). */
  cpWork: Record<string, number>;
}

/** CPU of a set of processes, summed, in µs (null if /proc is not there). */
function cpuOf(pids: number[]): number | null {
  let sum = 0;
  for (const p of pids) {
    const c = cpuMicros(p);
    if (c === null) return null;
    sum += c;
  }
  return sum;
}

async function runLoad(label: string, cp: ControlPlane, nodes: DataPlane[], pickKey: () => string, keys: number, orgs: number, durationSec = DURATION_SEC, align = ALIGN): Promise<RunResult> {
  const cpPid = cp.proc.child.pid!;
  const nodePids = nodes.map((n) => n.proc.child.pid!);
  const durationMs = durationSec * 1000;
  // Idle window: at least IDLE_SEC; when aligning, until the run's middle is the top of a minute.
  const idleStart = performance.now();
  const idleCp0 = cpuOf([cpPid]);
  const idleMain0 = mainThreadCpuMicros(cpPid);
  const idleNodes0 = cpuOf(nodePids);
  let waitMs = IDLE_SEC * 1000;
  if (align) {
    const now = Date.now();
    let top = Math.ceil(now / 60_000) * 60_000;
    while (top - durationMs / 2 - now < IDLE_SEC * 1000) top += 60_000;
    waitMs = top - durationMs / 2 - now;
    console.log(`  waiting ${(waitMs / 1000).toFixed(0)} s (idle measurement) so that the run crosses ${new Date(top).toISOString().slice(11, 19)} UTC`);
  }
  await sleep(waitMs);
  const idleSec = (performance.now() - idleStart) / 1000;
  const idleCp = idleCp0 === null ? null : (cpuOf([cpPid])! - idleCp0) / idleSec;
  const idleMain = idleMain0 === null ? null : (mainThreadCpuMicros(cpPid)! - idleMain0) / idleSec;
  const idleNodes = idleNodes0 === null ? null : (cpuOf(nodePids)! - idleNodes0) / idleSec;

  for (const n of nodes) await leaseWaits(n.adminUrl!, true);
  const counters0 = await cpCounters(cp.adminUrl);
  const pools = nodes.map((n) => new Pool(n.url, { connections: 64, pipelining: 1 }));
  const latencies: number[] = [];
  const refusals: Record<string, number> = {};
  let firstRefusal = '';
  let ok = 0;
  let sent = 0;
  const total = Math.round(RATE * durationSec);
  const cp0 = cpuOf([cpPid]);
  const main0 = mainThreadCpuMicros(cpPid);
  const threads0 = threadCpuMicros(cpPid);
  const nodes0 = cpuOf(nodePids);
  const wall0 = Date.now();
  const t0 = performance.now();
  const inFlight = new Set<Promise<void>>();
  const one = async () => {
    const pool = pools[Math.floor(Math.random() * pools.length)];
    const start = performance.now();
    try {
      const res = await pool.request({
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { authorization: `Bearer ${pickKey()}`, 'content-type': 'application/json', 'x-forwarded-for': nextIp() },
        body: BODY,
      });
      const text = res.statusCode === 200 ? (await res.body.dump(), '') : await res.body.text();
      latencies.push(performance.now() - start);
      if (res.statusCode === 200) ok++;
      else {
        refusals[res.statusCode] = (refusals[res.statusCode] ?? 0) + 1;
        firstRefusal ||= `${res.statusCode} ${text.slice(0, 300)}`;
      }
    } catch (err) {
      refusals.error = (refusals.error ?? 0) + 1;
      firstRefusal ||= String(err);
    }
  };
  while (sent < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * RATE) + 1);
    while (sent < due && inFlight.size < 4096) {
      sent++;
      const p = one().finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
    const nextAt = t0 + (sent / RATE) * 1000;
    await sleep(Math.max(0, nextAt - performance.now()));
  }
  await Promise.all(inFlight);
  const wall1 = Date.now();
  const loadSec = (performance.now() - t0) / 1000;
  await sleep(TAIL_MS);
  const measuredSec = loadSec + TAIL_MS / 1000;
  const cp1 = cpuOf([cpPid]);
  const main1 = mainThreadCpuMicros(cpPid);
  const threads1 = threadCpuMicros(cpPid);
  const nodes1 = cpuOf(nodePids);
  await Promise.all(pools.map((p) => p.close()));
  const waits = await Promise.all(nodes.map((n) => leaseWaits(n.adminUrl!)));
  const counters1 = await cpCounters(cp.adminUrl);
  const cpWork: Record<string, number> = {};
  for (const [k, v] of Object.entries(counters1)) if (v - (counters0[k] ?? 0) > 0) cpWork[k.replace('tollgate_cp_', '')] = v - (counters0[k] ?? 0);

  latencies.sort((a, b) => a - b);
  const at = (q: number) => (latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]);
  const perReq = (c0: number | null, c1: number | null, idle: number | null) => (c0 === null || c1 === null || idle === null ? null : Math.max(0, c1 - c0 - idle * measuredSec) / sent);
  const waited = waits.reduce((s, w) => s + w.waited, 0);
  const r: RunResult = {
    run: label,
    nodes: nodes.length,
    keys,
    orgs,
    rate: RATE,
    durationSec: loadSec,
    sent,
    ok,
    refusals,
    firstRefusal,
    crossedMinute: Math.floor(wall0 / 60_000) !== Math.floor(wall1 / 60_000),
    cpUsPerRequest: perReq(cp0, cp1, idleCp),
    cpMainThreadUsPerRequest: perReq(main0, main1, idleMain),
    nodesUsPerRequest: perReq(nodes0, nodes1, idleNodes),
    cpIdleUsPerSec: idleCp,
    nodesIdleUsPerSec: idleNodes,
    latencyMs: { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: latencies[latencies.length - 1] ?? 0 },
    waited,
    waitedShare: waited / Math.max(1, sent),
    waitMs: {
      mean: waited === 0 ? 0 : waits.reduce((s, w) => s + w.mean_ms * w.waited, 0) / waited,
      p99max: Math.max(0, ...waits.map((w) => w.p99_ms)),
      max: Math.max(0, ...waits.map((w) => w.max_ms)),
    },
    cpRssBytes: rssBytes(cpPid),
    cpWork,
  };
  const f = (n: number | null, d = 0) => (n === null ? 'n/a' : n.toFixed(d));
  const refused = Object.entries(refusals).map(([k, v]) => `${v}×${k}`).join(', ') || 'none';
  console.log(
    `  ${label}: ${sent} requests in ${loadSec.toFixed(1)} s (${(sent / loadSec).toFixed(0)}/s${r.crossedMinute ? ', crossed a minute' : ', NO minute crossed'}); ` +
      `CPU per request: control plane ${f(r.cpUsPerRequest)} µs (main thread ${f(r.cpMainThreadUsPerRequest)}), nodes ${f(r.nodesUsPerRequest)} µs (sum); ` +
      `latency p50 ${r.latencyMs.p50.toFixed(2)} / p90 ${r.latencyMs.p90.toFixed(2)} / p99 ${r.latencyMs.p99.toFixed(2)} / max ${r.latencyMs.max.toFixed(1)} ms; ` +
      `waited for the control plane: ${waited} (${(r.waitedShare * 100).toFixed(2)}%, mean ${r.waitMs.mean.toFixed(1)} ms, p99 ≤ ${r.waitMs.p99max.toFixed(1)} ms, max ${r.waitMs.max.toFixed(1)} ms); refused: ${refused}` +
      `; control-plane RSS ${f(r.cpRssBytes === null ? null : r.cpRssBytes / MB)} MB`,
  );
  // The control plane's threads by CPU in the run (tid order is creation order: the main thread, V8's
  // workers, then libuv's pool, where SQLite runs).
  const tids = [...threads1.keys()].sort((a, b) => a - b);
  const threadUse = tids
    .map((t, i) => ({ i, us: (threads1.get(t)?.total ?? 0) - (threads0.get(t)?.total ?? 0), sys: (threads1.get(t)?.sys ?? 0) - (threads0.get(t)?.sys ?? 0) }))
    .filter((x) => x.us > 0);
  console.log(`    control plane's threads (creation order #: µs per request, of which in the kernel): ${threadUse.map((x) => `#${x.i} ${(x.us / sent).toFixed(1)} (${(x.sys / sent).toFixed(1)})`).join(', ')}`);
  console.log(`    control plane's work: ${Object.entries(cpWork).map(([k, v]) => `${k} ${v}`).join(', ') || 'none'}`);
  if (firstRefusal) console.log(`    first refusal: ${firstRefusal}`);
  return r;
}

async function waitForKeys(node: DataPlane, keys: string[]): Promise<void> {
  for (const key of keys) {
    for (let i = 0; ; i++) {
      const r = await fetch(`${node.url}/v1/models`, { headers: { authorization: `Bearer ${key}`, 'x-forwarded-for': '10.0.0.1' } });
      await r.arrayBuffer();
      if (r.status === 200) break;
      if (i > 800) throw new Error(`node ${node.url} never learnt key ${key.slice(0, 20)}…`);
      await sleep(25);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// --fake-nodes: the control plane alone at cluster scale (target 3). Simulated nodes (fake-node.ts)
// connect over the sync protocol and send what real nodes serving RATE req/s in all would send: a
// report a second each (usage summed per key and minute, last-used times, the request logs as one
// block), and with --fake-leases per-minute (the default) the lease traffic of today's protocol: a
// key lease on a key's first request in each minute on that node, a slot want on its first request
// ever, a money want when the organisation's slice is low, and what was used of each key minute every
// 100 ms; --fake-leases none sends reports only. Prints the control plane's share of one core, its
// CPU per simulated request, its RSS, and whether its acknowledgements kept up.

const DEMO_PROMPT_TOKENS = 20;
const DEMO_COMPLETION_TOKENS = 30;
// demo-chat: 0.50 and 1.50 USD per million tokens.
const DEMO_COST_MICROS = Math.round(DEMO_PROMPT_TOKENS * 0.5 + DEMO_COMPLETION_TOKENS * 1.5);

interface FakeSim {
  node: FakeNode;
  seq: number;
  usedSeq: number;
  sentReports: number;
  /** Requests summed in each report sent, by seq (to count what the control plane acknowledged). */
  requestsInReport: Map<number, number>;
  usage: Map<string, UsageTotal>;
  lastUsed: Map<number, number>;
  /** A second's request logs of this node, built once and sent with every report (building 100,000 rows a second would cost this process more than the control plane). */
  logBlocks: LogBlock[];
  minute: number;
  seenThisMinute: Set<number>;
  usedThisMinute: Map<number, number>;
  usedThisTick: Set<number>;
  slotted: Set<number>;
  money: Map<number, number>;
  moneyAsked: Set<number>;
  keyWants: KeyLeaseWant[];
  slotWants: SlotWant[];
  orgWants: number[];
}

async function fakeNodesBench(): Promise<void> {
  const nodesCount = NODE_COUNTS[0];
  const leases = opts['fake-leases'] === 'none' ? 'none' : 'per-minute';
  const withLogs = !opts['no-fake-logs'];
  console.log(
    `tollgate bench:tenants --fake-nodes: ${nodesCount} simulated nodes, ${RATE.toLocaleString('en')} req/s in all, ${KEYS.toLocaleString('en')} keys in ${ORGS.toLocaleString('en')} organisations, Zipf s = ${ZIPF}, ${DURATION_SEC} s; leases: ${leases}; request logs: ${withLogs ? 'yes' : 'no'}`,
  );
  const first = await startControlPlane({ configYaml: benchConfig() });
  await first.proc.kill('SIGTERM');
  const seed0 = performance.now();
  await seedTenants(first.dbPath, first.secrets.pepper, KEYS, ORGS);
  console.log(`  seeded in ${((performance.now() - seed0) / 1000).toFixed(1)} s`);
  const profArgs = opts['cpu-prof'] ? ['--cpu-prof', `--cpu-prof-dir=${opts['cpu-prof']}`] : [];
  const cp = await startControlPlane({ dir: first.dir, secrets: first.secrets, configPath: first.configPath, adminListen: true, nodeArgs: profArgs });
  const cpPid = cp.proc.child.pid!;
  const orgIdOf = (r: number) => `org_t${String(r % ORGS).padStart(7, '0')}`;
  const projectIdOf = (r: number) => `proj_t${String(r % ORGS).padStart(7, '0')}`;
  const keyIdOf = (r: number) => `key_t${String(r).padStart(8, '0')}`;

  const sims: FakeSim[] = [];
  for (let i = 0; i < nodesCount; i++) {
    const sim = { seq: 0, usedSeq: 0, sentReports: 0, requestsInReport: new Map(), usage: new Map(), lastUsed: new Map(), logBlocks: [], minute: 0, seenThisMinute: new Set(), usedThisMinute: new Map(), usedThisTick: new Set(), slotted: new Set(), money: new Map(), moneyAsked: new Set(), keyWants: [], slotWants: [], orgWants: [] } as unknown as FakeSim;
    sim.node = await startFakeNode(
      cp,
      {
        nodeId: `fake-${i}`,
        holdAcks: false,
        onMessage: (msg) => {
          if (msg.leaseGrant) {
            for (const o of msg.leaseGrant.orgs) {
              const r = Number(o.orgId.slice(5));
              sim.money.set(r, (sim.money.get(r) ?? 0) + o.micros);
              sim.moneyAsked.delete(r);
            }
          }
          // A reclaim is answered at once: a simulated node holds nothing it could give back.
          if (msg.leaseReclaim) sim.node.write({ leaseRequest: leaseRequest({ reclaimId: msg.leaseReclaim.id }) });
        },
      },
      120_000,
    );
    sims.push(sim);
  }
  console.log(`  ${nodesCount} simulated nodes connected and hold the snapshot`);

  const zipf = zipfSampler(KEYS, ZIPF);
  const perNodeTick = RATE / nodesCount / 10;
  if (withLogs) {
    const at = Date.now();
    for (const sim of sims) {
      const b = new LogBlocksBuilder();
      for (let n = 0; n < RATE / nodesCount; n++) {
        const r = zipf();
        b.add({
          requestId: `req_${sim.node.nodeId}_${n}`, atMs: at + Math.floor(n / (RATE / nodesCount / 1000)), keyId: keyIdOf(r), projectId: projectIdOf(r), orgId: orgIdOf(r), clientIp: '10.1.2.3', userAgent: 'bench', method: 'POST',
          path: '/v1/chat/completions', status: 200, latencyUs: 400, bytesIn: 190, bytesOut: 400, model: 'demo-chat', promptTokens: DEMO_PROMPT_TOKENS, completionTokens: DEMO_COMPLETION_TOKENS, costMicros: DEMO_COST_MICROS, reason: '', keyPrefix: 'sk-tollgate-...0000',
        });
      }
      sim.logBlocks = b.blocks();
    }
  }
  const tick = (sim: FakeSim, count: number, nowMs: number) => {
    const minute = Math.floor(nowMs / 60_000);
    if (minute !== sim.minute) {
      sim.minute = minute;
      sim.seenThisMinute.clear();
      sim.usedThisMinute.clear();
    }
    for (let n = 0; n < count; n++) {
      const r = zipf();
      const org = r % ORGS;
      const id = `${r}:${minute}`;
      let t = sim.usage.get(id);
      if (!t) {
        t = { keyId: keyIdOf(r), orgId: orgIdOf(r), projectId: projectIdOf(r), model: 'demo-chat', minute, leaseEpoch: 1, requests: 0, promptTokens: 0, completionTokens: 0, costMicros: 0 };
        sim.usage.set(id, t);
      }
      t.requests++;
      t.promptTokens += DEMO_PROMPT_TOKENS;
      t.completionTokens += DEMO_COMPLETION_TOKENS;
      t.costMicros += DEMO_COST_MICROS;
      sim.lastUsed.set(r, nowMs);
      if (leases === 'none') continue;
      if (!sim.seenThisMinute.has(r)) {
        sim.seenThisMinute.add(r);
        sim.keyWants.push({ keyId: t.keyId, minute, requests: 1000, tokens: 1_000_000, heldRequests: 0, heldTokens: 0, needRequests: 1, needTokens: 0 });
      }
      if (!sim.slotted.has(r)) {
        sim.slotted.add(r);
        sim.slotWants.push({ keyId: t.keyId, held: 0, want: 10, need: 1 });
      }
      const money = (sim.money.get(org) ?? 0) - DEMO_COST_MICROS;
      sim.money.set(org, money);
      if (money < 100_000 && !sim.moneyAsked.has(org)) {
        sim.moneyAsked.add(org);
        sim.orgWants.push(org);
      }
      sim.usedThisMinute.set(r, (sim.usedThisMinute.get(r) ?? 0) + 1);
      sim.usedThisTick.add(r);
    }
    if (leases === 'none') return;
    const used = [...sim.usedThisTick].map((r) => ({ keyId: keyIdOf(r), minute, requests: sim.usedThisMinute.get(r) ?? 0, tokens: (sim.usedThisMinute.get(r) ?? 0) * (DEMO_PROMPT_TOKENS + DEMO_COMPLETION_TOKENS) }));
    sim.usedThisTick.clear();
    const req = leaseRequest({
      keys: sim.keyWants.splice(0),
      orgs: sim.orgWants.splice(0).map((o) => ({ orgId: orgIdOf(o), micros: 100_000 })),
      slotWants: sim.slotWants.splice(0),
      used,
      usedSeq: used.length > 0 ? ++sim.usedSeq : 0,
    });
    if (req.keys.length + req.orgs.length + req.slotWants.length + req.used.length > 0) sim.node.write({ leaseRequest: req });
  };
  const report = (sim: FakeSim) => {
    const usageTotals = [...sim.usage.values()];
    sim.usage.clear();
    const lastUsed = [...sim.lastUsed].map(([r, atMs]) => ({ keyId: keyIdOf(r), atMs }));
    sim.lastUsed.clear();
    const logBlocks = withLogs ? sim.logBlocks : [];
    if (usageTotals.length === 0) return;
    sim.node.write({ reports: { reports: [{ seq: ++sim.seq, usage: [], lastUsed, logs: undefined, instanceId: '', usageTotals, logBlocks }] } });
    sim.sentReports++;
    sim.requestsInReport.set(sim.seq, usageTotals.reduce((n, t) => n + t.requests, 0));
  };

  // Idle, then the load, then a tail for the last reports.
  const idle0 = cpuMicros(cpPid);
  const idleT0 = performance.now();
  await sleep(IDLE_SEC * 1000);
  const idleRate = idle0 === null ? null : (cpuMicros(cpPid)! - idle0) / ((performance.now() - idleT0) / 1000);
  const stopRss = watchRss(cpPid, 200);
  const cpu0 = cpuMicros(cpPid);
  const t0 = performance.now();
  const wall0 = Date.now();
  let simulated = 0;
  let lastReportAt = t0;
  let carry = 0;
  let ticks = 0;
  while (performance.now() - t0 < DURATION_SEC * 1000) {
    ticks++;
    const due = ((performance.now() - t0) / 1000) * RATE;
    const count = Math.max(0, due - simulated);
    const per = (count + carry) / nodesCount;
    const whole = Math.floor(per);
    carry = (per - whole) * nodesCount;
    const now = Date.now();
    for (const sim of sims) tick(sim, whole, now);
    simulated += whole * nodesCount;
    if (performance.now() - lastReportAt >= 1000) {
      lastReportAt = performance.now();
      for (const sim of sims) report(sim);
    }
    await sleep(Math.max(0, t0 + ticks * 100 - performance.now()));
  }
  for (const sim of sims) report(sim);
  const loadSec = (performance.now() - t0) / 1000;
  const wall1 = Date.now();
  // The tail: until every report is acknowledged (the control plane kept up) or 60 s.
  const tail0 = performance.now();
  while (sims.some((x) => x.node.reportAcks.length < x.sentReports) && performance.now() - tail0 < 60_000) await sleep(100);
  const tailSec = (performance.now() - tail0) / 1000;
  const cpu1 = cpuMicros(cpPid);
  const peakRss = stopRss();
  console.log(`  control plane's counters: ${JSON.stringify(await cpCounters(cp.adminUrl))}`);
  const measuredSec = loadSec + tailSec;
  const used = cpu0 === null || cpu1 === null || idleRate === null ? null : cpu1 - cpu0 - idleRate * measuredSec;
  const acked = sims.reduce((s, x) => s + x.node.reportAcks.length, 0);
  // What the control plane wrote and acknowledged (when it could not keep up, less than was sent).
  const ackedRequests = sims.reduce((n, x) => n + x.node.reportAcks.reduce((m, seq) => m + (x.requestsInReport.get(seq) ?? 0), 0), 0);
  const sentReports = sims.reduce((s, x) => s + x.sentReports, 0);
  const result = {
    mode: 'fake-nodes',
    nodes: nodesCount,
    keys: KEYS,
    orgs: ORGS,
    rate: RATE,
    leases,
    logs: withLogs,
    simulatedRequests: simulated,
    simulatedRate: simulated / loadSec,
    loadSec,
    tailSec,
    crossedMinute: Math.floor(wall0 / 60_000) !== Math.floor(wall1 / 60_000),
    coreShare: used === null ? null : used / 1e6 / measuredSec,
    cpUsPerRequest: used === null ? null : used / simulated,
    ackedRequests,
    /** CPU per request the control plane acknowledged: a fair figure also when it fell behind (CPU-starved). */
    cpUsPerAckedRequest: used === null || ackedRequests === 0 ? null : used / ackedRequests,
    cpPeakRssBytes: peakRss,
    reportsSent: sentReports,
    reportsAcked: acked,
    perTickPerNode: perNodeTick,
  };
  console.log(
    `  simulated ${simulated.toLocaleString('en')} requests in ${loadSec.toFixed(1)} s (${result.simulatedRate.toFixed(0)}/s${result.crossedMinute ? ', crossed a minute' : ''}); ` +
      `${acked}/${sentReports} reports acknowledged, the last ${tailSec.toFixed(1)} s after the load; ` +
      `control plane: ${result.coreShare === null ? 'n/a' : `${(result.coreShare * 100).toFixed(1)}% of one core`}, ${result.cpUsPerRequest === null ? 'n/a' : result.cpUsPerRequest.toFixed(2)} µs per simulated request, ` +
      `${result.cpUsPerAckedRequest === null ? 'n/a' : result.cpUsPerAckedRequest.toFixed(2)} µs per acknowledged request (${ackedRequests.toLocaleString('en')}; at ${RATE.toLocaleString('en')} req/s that is ${result.cpUsPerAckedRequest === null ? 'n/a' : ((result.cpUsPerAckedRequest * RATE) / 1e4).toFixed(0)}% of a core), peak RSS ${peakRss === null ? 'n/a' : (peakRss / MB).toFixed(0)} MB`,
  );
  for (const sim of sims) {
    const err = sim.node.streamError();
    if (err) console.log(`  ${sim.node.nodeId}: its stream failed: ${err.message}`);
    sim.node.close();
  }
  if (acked < sentReports) console.log(`  the control plane's last lines:\n${cp.proc.output().split('\n').slice(-8).join('\n')}`);
  await cp.proc.kill('SIGTERM');
  const dir = join(ROOT, 'test', 'bench', 'out');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `tenants-fake-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, JSON.stringify({ at: new Date().toISOString(), zipf: ZIPF, durationSec: DURATION_SEC, result }, null, 2));
  console.log(`\nwritten to ${file}`);
  await stopAll();
}

function leaseRequest(p: Partial<LeaseRequest>): LeaseRequest {
  return { keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: 1, leaving: false, used: [], usedSeq: 0, slotWants: [], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: false, wantOrgSlices: false, ...p };
}

async function main(): Promise<void> {
  if (FAKE) return fakeNodesBench();
  const profArgs = opts['cpu-prof'] ? ['--cpu-prof', `--cpu-prof-dir=${opts['cpu-prof']}`] : [];
  console.log(`tollgate bench:tenants: ${KEYS.toLocaleString('en')} keys in ${ORGS.toLocaleString('en')} organisations, Zipf s = ${ZIPF}, ${RATE} req/s for ${DURATION_SEC} s per run, nodes ${NODE_COUNTS.join(' then ')}`);
  const first = await startControlPlane({ configYaml: benchConfig() });
  const admin = consoleClient(first.address, first.secrets.operatorToken);
  const control = await createKey(admin, { tier: 'bench' });
  admin.close();
  await first.proc.kill('SIGTERM');
  const seed0 = performance.now();
  await seedTenants(first.dbPath, first.secrets.pepper, KEYS, ORGS);
  console.log(`  seeded ${KEYS.toLocaleString('en')} keys in ${ORGS.toLocaleString('en')} organisations in ${((performance.now() - seed0) / 1000).toFixed(1)} s`);
  const cp = await startControlPlane({ dir: first.dir, secrets: first.secrets, configPath: first.configPath, adminListen: true, nodeArgs: profArgs });

  const zipf = zipfSampler(KEYS, ZIPF);
  const tenantKeys = Array.from({ length: KEYS }, (_, i) => tenantKey(i));
  const results: RunResult[] = [];
  for (const n of NODE_COUNTS) {
    const nodes: DataPlane[] = [];
    for (let i = 0; i < n; i++) nodes.push(await startDataPlane(cp, { adminListen: true, nodeId: `bench-${n}-${i}` }));
    for (const node of nodes) await waitForKeys(node, [control.key, tenantKeys[0], tenantKeys[KEYS - 1]]);
    console.log(`\n${n} node${n > 1 ? 's' : ''}:`);
    if (!opts['no-control']) results.push(await runLoad(`${n} node${n > 1 ? 's' : ''}, one key`, cp, nodes, () => control.key, 1, 1));
    if (WARMUP_SEC > 0) await runLoad(`warm-up (not counted), ${WARMUP_SEC} s`, cp, nodes, () => tenantKeys[zipf()], KEYS, ORGS, WARMUP_SEC, false);
    results.push(await runLoad(`${n} node${n > 1 ? 's' : ''}, ${KEYS.toLocaleString('en')} keys / ${ORGS.toLocaleString('en')} orgs${WARMUP_SEC > 0 ? ` after ${WARMUP_SEC} s of warm-up` : ''}`, cp, nodes, () => tenantKeys[zipf()], KEYS, ORGS));
    for (const node of nodes) await node.proc.kill('SIGTERM');
  }
  await cp.proc.kill('SIGTERM');

  console.log('\n| run | control plane CPU per request | nodes\' CPU per request (sum) | p50 / p90 / p99 / max latency | waited for the control plane | refused |');
  console.log('|---|---|---|---|---|---|');
  for (const r of results) {
    const f = (n: number | null) => (n === null ? 'n/a' : `${n.toFixed(0)} µs`);
    const refused = Object.values(r.refusals).reduce((s, v) => s + v, 0);
    console.log(
      `| ${r.run} | ${f(r.cpUsPerRequest)} | ${f(r.nodesUsPerRequest)} | ${r.latencyMs.p50.toFixed(1)} / ${r.latencyMs.p90.toFixed(1)} / ${r.latencyMs.p99.toFixed(1)} / ${r.latencyMs.max.toFixed(0)} ms | ${(r.waitedShare * 100).toFixed(2)}% (max ${r.waitMs.max.toFixed(0)} ms) | ${refused} |`,
    );
  }
  const dir = join(ROOT, 'test', 'bench', 'out');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `tenants-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, JSON.stringify({ at: new Date().toISOString(), keys: KEYS, orgs: ORGS, rate: RATE, zipf: ZIPF, durationSec: DURATION_SEC, results }, null, 2));
  console.log(`\nwritten to ${file}`);
  await stopAll();
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
