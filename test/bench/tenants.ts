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
import { nextIp } from './load.js';
import { cpuMicros, rssBytes } from './procstat.js';

const { values: opts } = parseArgs({
  options: {
    keys: { type: 'string', default: '5000' },
    orgs: { type: 'string', default: '500' },
    rate: { type: 'string', default: '400' },
    zipf: { type: 'string', default: '1.0' },
    duration: { type: 'string', default: '30' },
    nodes: { type: 'string', default: '1,3' },
    idle: { type: 'string', default: '3' },
    'no-align': { type: 'boolean', default: false },
    'no-control': { type: 'boolean', default: false },
    'cpu-prof': { type: 'string' },
  },
});
const KEYS = positive('keys');
const ORGS = Math.min(positive('orgs'), KEYS);
const RATE = positive('rate');
const ZIPF = Number(opts.zipf);
const DURATION_SEC = positive('duration');
const NODE_COUNTS = opts.nodes!.split(',').map(Number);
const IDLE_SEC = Number(opts.idle);
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
  nodesUsPerRequest: number | null;
  cpIdleUsPerSec: number | null;
  nodesIdleUsPerSec: number | null;
  latencyMs: { p50: number; p90: number; p99: number; max: number };
  waited: number;
  waitedShare: number;
  waitMs: { mean: number; p99max: number; max: number };
  cpRssBytes: number | null;
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

async function runLoad(label: string, cp: ControlPlane, nodes: DataPlane[], pickKey: () => string, keys: number, orgs: number): Promise<RunResult> {
  const cpPid = cp.proc.child.pid!;
  const nodePids = nodes.map((n) => n.proc.child.pid!);
  const durationMs = DURATION_SEC * 1000;
  // Idle window: at least IDLE_SEC; when aligning, until the run's middle is the top of a minute.
  const idleStart = performance.now();
  const idleCp0 = cpuOf([cpPid]);
  const idleNodes0 = cpuOf(nodePids);
  let waitMs = IDLE_SEC * 1000;
  if (ALIGN) {
    const now = Date.now();
    let top = Math.ceil(now / 60_000) * 60_000;
    while (top - durationMs / 2 - now < IDLE_SEC * 1000) top += 60_000;
    waitMs = top - durationMs / 2 - now;
    console.log(`  waiting ${(waitMs / 1000).toFixed(0)} s (idle measurement) so that the run crosses ${new Date(top).toISOString().slice(11, 19)} UTC`);
  }
  await sleep(waitMs);
  const idleSec = (performance.now() - idleStart) / 1000;
  const idleCp = idleCp0 === null ? null : (cpuOf([cpPid])! - idleCp0) / idleSec;
  const idleNodes = idleNodes0 === null ? null : (cpuOf(nodePids)! - idleNodes0) / idleSec;

  for (const n of nodes) await leaseWaits(n.adminUrl!, true);
  const pools = nodes.map((n) => new Pool(n.url, { connections: 64, pipelining: 1 }));
  const latencies: number[] = [];
  const refusals: Record<string, number> = {};
  let firstRefusal = '';
  let ok = 0;
  let sent = 0;
  const total = Math.round(RATE * DURATION_SEC);
  const cp0 = cpuOf([cpPid]);
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
  const nodes1 = cpuOf(nodePids);
  await Promise.all(pools.map((p) => p.close()));
  const waits = await Promise.all(nodes.map((n) => leaseWaits(n.adminUrl!)));

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
  };
  const f = (n: number | null, d = 0) => (n === null ? 'n/a' : n.toFixed(d));
  const refused = Object.entries(refusals).map(([k, v]) => `${v}×${k}`).join(', ') || 'none';
  console.log(
    `  ${label}: ${sent} requests in ${loadSec.toFixed(1)} s (${(sent / loadSec).toFixed(0)}/s${r.crossedMinute ? ', crossed a minute' : ', NO minute crossed'}); ` +
      `CPU per request: control plane ${f(r.cpUsPerRequest)} µs, nodes ${f(r.nodesUsPerRequest)} µs (sum); ` +
      `latency p50 ${r.latencyMs.p50.toFixed(2)} / p90 ${r.latencyMs.p90.toFixed(2)} / p99 ${r.latencyMs.p99.toFixed(2)} / max ${r.latencyMs.max.toFixed(1)} ms; ` +
      `waited for the control plane: ${waited} (${(r.waitedShare * 100).toFixed(2)}%, mean ${r.waitMs.mean.toFixed(1)} ms, p99 ≤ ${r.waitMs.p99max.toFixed(1)} ms, max ${r.waitMs.max.toFixed(1)} ms); refused: ${refused}` +
      `; control-plane RSS ${f(r.cpRssBytes === null ? null : r.cpRssBytes / MB)} MB`,
  );
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

async function main(): Promise<void> {
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
  const cp = await startControlPlane({ dir: first.dir, secrets: first.secrets, configPath: first.configPath, nodeArgs: profArgs });

  const zipf = zipfSampler(KEYS, ZIPF);
  const tenantKeys = Array.from({ length: KEYS }, (_, i) => tenantKey(i));
  const results: RunResult[] = [];
  for (const n of NODE_COUNTS) {
    const nodes: DataPlane[] = [];
    for (let i = 0; i < n; i++) nodes.push(await startDataPlane(cp, { adminListen: true, nodeId: `bench-${n}-${i}`, nodeArgs: profArgs }));
    for (const node of nodes) await waitForKeys(node, [control.key, tenantKeys[0], tenantKeys[KEYS - 1]]);
    console.log(`\n${n} node${n > 1 ? 's' : ''}:`);
    if (!opts['no-control']) results.push(await runLoad(`${n} node${n > 1 ? 's' : ''}, one key`, cp, nodes, () => control.key, 1, 1));
    results.push(await runLoad(`${n} node${n > 1 ? 's' : ''}, ${KEYS.toLocaleString('en')} keys / ${ORGS.toLocaleString('en')} orgs`, cp, nodes, () => tenantKeys[zipf()], KEYS, ORGS));
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
