// `npm run bench [-- --quick] [-- --profile DIR] [-- --only json,sse]`: the node against the upstream
// called directly and against a bare uWebSockets.js + undici proxy (bare-proxy.ts), in one run,
// interleaved and repeated (issue 13). A script that prints figures, not a test.
//
// Set-up: the fake upstream (fake-upstream-server.ts, also the tool backend), the bare proxy, a control
// plane and one node with a key whose limits are far away (its tier: 10^12 rpm, no cap), every
// request from its own client address through a trusted proxy (X-Forwarded-For over 16,384 addresses),
// so the edge budgets are in force but never tripped. With taskset and two cores, the proxy under test
// (node or bare proxy) runs on core 0; the upstream, the control plane and the load generator (this
// process) on core 1.
//
// Scenarios: JSON chat (~190-byte request, ~400-byte answer), the same to a model of three deployments
// (json-pool3, issue 36), SSE chat (5 chunks), a tool GET, a tool
// POST of 1 MiB, GET /v1/models. For each: requests/s, p50/p99, CPU µs per request of the proxy under
// test (and of the control plane, for the node), peak RSS, and the ratios node/bare and bare/direct.
// Then a constant-rate run at half the node's JSON saturation rate: p99 over direct. Results go to
// test/bench/out/bench-<time>.json.
import { spawnSync } from 'node:child_process';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startProcess, stopAll, ROOT } from '../helpers/processes.js';
import { hasWrk, paced, saturate, type PacedResult, type SaturationResult, type Target } from './load.js';
import { canPin, cpuMicros, pin, watchRss } from './procstat.js';
import { CONNECTIONS, pickScenarios, startTargets, waitForKey } from './targets.js';
import { NODE_HEAP_FLAGS, NODE_MEMORY_ENV } from '../../data-plane/heap-flags.js';

const { values: opts } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    profile: { type: 'string' },
    only: { type: 'string' },
    rounds: { type: 'string' },
    seconds: { type: 'string' },
    baseline: { type: 'string' },
    'baseline-flags': { type: 'string' },
    'baseline-env': { type: 'string' },
  },
});
const QUICK = opts.quick!;
const ROUNDS = Number(opts.rounds ?? (QUICK ? 1 : 3));
const SECONDS = Number(opts.seconds ?? (QUICK ? 2 : 5));
const PROXY_CORE = 0;
const LOAD_CORE = 1;

type TargetName = 'direct' | 'bare' | 'node' | 'baseline';
// --baseline REF: a second node built from another commit (a git worktree under the system's temp
// folder), on the same control plane and core, measured in the same run: what a change bought.
// --baseline-flags="FLAGS" (with the =, as FLAGS start with a dash): the baseline node runs with these node/V8 flags after the node's own heap flags (without --baseline: this
// checkout's node, so the run measures what the flags change).
const BASELINE_FLAGS = opts['baseline-flags']?.split(/\s+/).filter(Boolean) ?? [];
// --baseline-env="K=V …": environment the baseline node starts with (e.g. MALLOC_ARENA_MAX=2).
const BASELINE_ENV = Object.fromEntries((opts['baseline-env']?.split(/\s+/).filter(Boolean) ?? []).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
const WITH_BASELINE = opts.baseline !== undefined || BASELINE_FLAGS.length > 0 || Object.keys(BASELINE_ENV).length > 0;
const TARGETS: TargetName[] = WITH_BASELINE ? ['direct', 'bare', 'node', 'baseline'] : ['direct', 'bare', 'node'];

interface Measurement extends SaturationResult {
  cpuUsPerRequest: number | null;
  controlPlaneCpuUsPerRequest: number | null;
  peakRssBytes: number | null;
  /** The share of its core the proxy under test was busy (its CPU time over the run's wall time). */
  busyShare: number | null;
}

/** Under this busy share a proxy's figure measures the machine, not the proxy (issue 37, target 1). */
const MIN_BUSY_SHARE = 0.95;

async function main(): Promise<void> {
  const scenarios = pickScenarios(opts.only);
  // The load generator (this process) shares its core with the upstream and the control plane.
  pin(process.pid, LOAD_CORE);

  const { upstream, upstreamUrl, bare, bareUrl, cp, node, auth } = await startTargets({
    nodeArgs: ['--import', join(ROOT, 'test', 'bench', 'loop-delay.mjs'), ...(opts.profile ? ['--cpu-prof', `--cpu-prof-dir=${opts.profile}`] : [])],
  });
  const baseline = WITH_BASELINE ? await startBaselineNode(opts.baseline, BASELINE_FLAGS, cp) : null;
  const pids: Record<TargetName | 'cp', number> = { direct: upstream.child.pid!, bare: bare.child.pid!, node: node.proc.child.pid!, baseline: baseline?.proc.child.pid ?? 0, cp: cp.proc.child.pid! };
  const pinned = canPin && [pin(pids.node, PROXY_CORE), pin(pids.bare, PROXY_CORE), pin(pids.direct, LOAD_CORE), pin(pids.cp, LOAD_CORE), !baseline || pin(pids.baseline, PROXY_CORE)].every(Boolean);

  const urls: Record<TargetName, string> = { direct: upstreamUrl, bare: bareUrl, node: node.url, baseline: baseline?.url ?? '' };
  if (baseline) await waitForKey(baseline.url, auth);

  console.log(
    `tollgate bench: ${hasWrk ? 'wrk' : 'autocannon'}, ${ROUNDS} round(s) × ${SECONDS} s per target and scenario, ${pinned ? `pinned (proxy under test on core ${PROXY_CORE}; upstream, control plane and load on core ${LOAD_CORE})` : 'not pinned (no taskset or one core)'}`,
  );

  // Warm-up: JIT and connection pools of every process, every path.
  for (const s of scenarios) for (const t of TARGETS) await saturate(urls[t], s.request(auth), s.connections, 1);

  const results: Record<string, Record<TargetName, Measurement[]>> = {};
  for (let round = 0; round < ROUNDS; round++) {
    for (const s of scenarios) {
      results[s.name] ??= { direct: [], bare: [], node: [], baseline: [] };
      // Interleaved, and in a rotating order, so drift on a shared machine hits every target alike.
      const order = TARGETS.map((_, i) => TARGETS[(i + round) % TARGETS.length]);
      for (const t of order) results[s.name][t].push(await measure(urls[t], s.request(auth), s.connections, pids[t], t === 'node' || t === 'baseline' ? pids.cp : null));
    }
  }

  const summary: Record<string, Record<TargetName, Measurement>> = {};
  for (const s of scenarios) {
    const r = results[s.name];
    summary[s.name] = { direct: median(r.direct), bare: median(r.bare), node: median(r.node), baseline: baseline ? median(r.baseline) : (undefined as unknown as Measurement) };
  }
  printTable(summary);

  // Constant rate at half the node's JSON saturation: the latency the node adds when it is not saturated.
  let constantRate: Record<string, unknown> | null = null;
  const json = scenarios.find((s) => s.name === 'json');
  if (json) {
    const rate = Math.max(100, Math.round(summary.json.node.rps / 2));
    const secs = QUICK ? 3 : 10;
    const runs: Record<TargetName, PacedResult[]> = { direct: [], bare: [], node: [], baseline: [] };
    const loopDelays: LoopDelay[] = [];
    // CPU per request at the same offered rate: the saturation figures charge each target the cost
    // of waking the load generator and the upstream (loopback sends wake an idle peer), and a slower
    // target leaves them idle more often, so there it pays more per request than its own work.
    const paceCpu: Record<TargetName, { micros: number; ok: number }> = { direct: { micros: 0, ok: 0 }, bare: { micros: 0, ok: 0 }, node: { micros: 0, ok: 0 }, baseline: { micros: 0, ok: 0 } };
    for (let round = 0; round < (QUICK ? 1 : 2); round++) {
      for (const t of TARGETS) {
        // Unmeasured, at the same rate first: the first seconds of a paced run after the saturation
        // runs or an idle spell are a transient for every target (new connections, collections after
        // the load; the bare proxy's p99 54 ms in them against 3.6 ms after), which best-of-2 did not
        // always leave out.
        await paced(urls[t], json.request(auth), rate, QUICK ? 1 : 3);
        if (t === 'node') node.proc.child.kill('SIGUSR2');
        const before = cpuMicros(pids[t]);
        const run = await paced(urls[t], json.request(auth), rate, secs);
        const after = cpuMicros(pids[t]);
        if (before !== null && after !== null) {
          paceCpu[t].micros += after - before;
          paceCpu[t].ok += run.ok;
        }
        runs[t].push(run);
        if (t === 'node') loopDelays.push(await loopDelay(node.proc));
      }
    }
    const cpuAtRate = Object.fromEntries(TARGETS.map((t) => [t, paceCpu[t].ok > 0 ? paceCpu[t].micros / paceCpu[t].ok : null])) as Record<TargetName, number | null>;
    const best = (xs: PacedResult[]) => xs.reduce((a, b) => (b.p99Us < a.p99Us ? b : a));
    const r = { direct: best(runs.direct), bare: best(runs.bare), node: best(runs.node), baseline: baseline ? best(runs.baseline) : (undefined as unknown as PacedResult) };
    const nodeLoop = loopDelays[runs.node.indexOf(r.node)];
    constantRate = { rate, seconds: secs, ...r, nodeP99AddedUs: r.node.p99Us - r.direct.p99Us, bareP99AddedUs: r.bare.p99Us - r.direct.p99Us, nodeLoopDelay: nodeLoop, cpuMicrosPerRequest: cpuAtRate };
    console.log(`\nconstant rate, JSON, ${rate} req/s for ${secs} s (half the node's saturation), latency in µs (best of ${runs.node.length}):`);
    for (const t of TARGETS) console.log(`  ${t.padEnd(7)} p50 ${r[t].p50Us.toFixed(0).padStart(6)}  p99 ${r[t].p99Us.toFixed(0).padStart(6)}  max ${r[t].maxUs.toFixed(0).padStart(7)}  (${r[t].ok} ok, ${r[t].errors} errors)`);
    console.log(`  p99 added over direct: node ${(r.node.p99Us - r.direct.p99Us).toFixed(0)} µs (target < 1000), bare ${(r.bare.p99Us - r.direct.p99Us).toFixed(0)} µs`);
    const cpuText = TARGETS.map((t) => `${t} ${cpuAtRate[t]?.toFixed(1) ?? '?'}`).join(', ');
    const cpuRatio = cpuAtRate.node !== null && cpuAtRate.bare ? ` (node/bare ${(cpuAtRate.node / cpuAtRate.bare).toFixed(2)}×)` : '';
    console.log(`  CPU µs per request at this rate, the same for every target: ${cpuText}${cpuRatio}`);
    const gcText = Object.entries(nodeLoop.gc)
      .map(([k, g]) => `${g.count} ${k} (${g.totalMs.toFixed(0)} ms, longest ${g.maxMs.toFixed(1)} ms)`)
      .join(', ');
    console.log(`  the node's event loop in that run: late by p50 ${nodeLoop.p50Ms} ms, p99 ${nodeLoop.p99Ms} ms, max ${nodeLoop.maxMs} ms; GC pauses: ${gcText || 'none'}`);
  }

  const outDir = join(ROOT, 'test', 'bench', 'out');
  mkdirSync(outDir, { recursive: true });
  const file = join(outDir, `bench-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(
    file,
    JSON.stringify({ at: new Date().toISOString(), tool: hasWrk ? 'wrk' : 'autocannon', pinned, rounds: ROUNDS, seconds: SECONDS, connections: CONNECTIONS, summary, rounds_detail: results, constantRate }, null, 2),
  );
  console.log(`\nwritten to ${file}`);
  // SIGTERM lets the node write its CPU profile (--profile).
  await node.proc.kill('SIGTERM');
  await stopAll();
  if (baseline && baseline.dir !== ROOT) spawnSync('git', ['worktree', 'remove', '--force', baseline.dir], { cwd: ROOT });
}

/** A node from commit `ref`, in a temporary git worktree sharing this checkout's node_modules. */
async function startBaselineNode(ref: string | undefined, flags: string[], cp: { address: string; secrets: { pepper: string; nodeToken: string } }): Promise<{ proc: ReturnType<typeof startProcess>; url: string; dir: string }> {
  let dir = ROOT;
  if (ref !== undefined) {
    dir = join(tmpdir(), `tollgate-baseline-${process.pid}`);
    const add = spawnSync('git', ['worktree', 'add', '--detach', dir, ref], { cwd: ROOT, encoding: 'utf8' });
    if (add.status !== 0) throw new Error(`git worktree add ${ref}: ${add.stderr}`);
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  }
  const proc = startProcess(['data-plane/main.ts', '--control-plane', cp.address, '--listen', '127.0.0.1:0'], { TOLLGATE_PEPPER: cp.secrets.pepper, TOLLGATE_NODE_TOKEN: cp.secrets.nodeToken, ...NODE_MEMORY_ENV, ...BASELINE_ENV }, { cwd: dir, nodeArgs: [...NODE_HEAP_FLAGS, ...flags] });
  const m = await proc.waitFor(/data plane listening on (\S+)/);
  await proc.waitFor(/data plane ready/);
  return { proc, url: `http://${m[1]}`, dir };
}

async function measure(url: string, t: Target, connections: number, pid: number, cpPid: number | null): Promise<Measurement> {
  const cpu0 = cpuMicros(pid);
  const cp0 = cpPid !== null ? cpuMicros(cpPid) : null;
  const stopRss = watchRss(pid);
  const r = await saturate(url, t, connections, SECONDS);
  const peak = stopRss();
  const cpu1 = cpuMicros(pid);
  const cp1 = cpPid !== null ? cpuMicros(cpPid) : null;
  if (r.errors > 0) console.log(`  (${r.errors} non-2xx answers or errors from ${url}${t.path})`);
  const per = (a: number | null, b: number | null) => (a !== null && b !== null && r.requests > 0 ? (b - a) / r.requests : null);
  const busy = cpu0 !== null && cpu1 !== null && r.durationSec > 0 ? (cpu1 - cpu0) / (r.durationSec * 1e6) : null;
  return { ...r, cpuUsPerRequest: per(cpu0, cpu1), controlPlaneCpuUsPerRequest: per(cp0, cp1), peakRssBytes: peak, busyShare: busy };
}

interface LoopDelay {
  seconds: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  gc: Record<string, { count: number; totalMs: number; maxMs: number }>;
}

/** What loop-delay.mjs saw in the node since the SIGUSR2 that started it watching. */
async function loopDelay(proc: ReturnType<typeof startProcess>): Promise<LoopDelay> {
  const from = proc.output().length;
  proc.child.kill('SIGUSR2');
  for (let i = 0; i < 200; i++) {
    const m = proc.output().slice(from).match(/loop-delay (\{.*\})/);
    if (m) return JSON.parse(m[1]) as LoopDelay;
    await new Promise((res) => setTimeout(res, 10));
  }
  throw new Error('the node did not report its loop delay');
}

/** The round with the median requests/s (its other figures come with it). */
function median(xs: Measurement[]): Measurement {
  const sorted = [...xs].sort((a, b) => a.rps - b.rps);
  return sorted[Math.floor(sorted.length / 2)];
}

function printTable(summary: Record<string, Record<TargetName, Measurement>>): void {
  const f = (n: number | null, d = 0) => (n === null ? '-' : n.toFixed(d));
  const mb = (n: number | null) => (n === null ? '-' : `${(n / 1048576).toFixed(0)} MB`);
  console.log('\nscenario        target    req/s   p50 ms  p99 ms  CPU µs/req  (+CP µs/req)  peak RSS  busy   ratio');
  const noisy: string[] = [];
  for (const [name, row] of Object.entries(summary)) {
    for (const t of TARGETS) {
      const m = row[t];
      const ratio =
        t === 'node'
          ? `${(m.rps / row.bare.rps).toFixed(2)}× bare req/s, ${m.cpuUsPerRequest && row.bare.cpuUsPerRequest ? (m.cpuUsPerRequest / row.bare.cpuUsPerRequest).toFixed(2) : '-'}× bare CPU`
          : t === 'bare'
            ? `${(m.rps / row.direct.rps).toFixed(2)}× direct req/s`
            : t === 'baseline'
              ? `${(m.rps / row.bare.rps).toFixed(2)}× bare req/s, ${m.cpuUsPerRequest && row.bare.cpuUsPerRequest ? (m.cpuUsPerRequest / row.bare.cpuUsPerRequest).toFixed(2) : '-'}× bare CPU (node/baseline: ${(row.node.rps / m.rps).toFixed(2)}× req/s, ${row.node.cpuUsPerRequest && m.cpuUsPerRequest ? (row.node.cpuUsPerRequest / m.cpuUsPerRequest).toFixed(2) : '-'}× CPU)`
              : '';
      const busy = m.busyShare === null ? '-' : `${Math.round(m.busyShare * 100)}%`;
      // A proxy under test that did not keep its core busy was waiting for the machine: noise, not a figure.
      if (t !== 'direct' && m.busyShare !== null && m.busyShare < MIN_BUSY_SHARE) noisy.push(`${name} ${t} (${busy})`);
      console.log(
        `${(t === 'direct' ? name : '').padEnd(15)} ${t.padEnd(7)} ${f(m.rps).padStart(7)} ${f(m.p50Ms, 1).padStart(8)} ${f(m.p99Ms, 1).padStart(7)} ${f(m.cpuUsPerRequest, 1).padStart(11)} ${(t === 'node' || t === 'baseline' ? f(m.controlPlaneCpuUsPerRequest, 1) : '').padStart(13)} ${mb(m.peakRssBytes).padStart(9)} ${busy.padStart(5)}   ${ratio}`,
      );
    }
  }
  console.log('targets (issue 37): node CPU ≤ 1.5× bare in json and sse, ≤ 1.2× in the tool scenarios; tool-post-1mib node req/s ≥ 0.9× bare; node RSS < 150 MB');
  const one = summary.json?.node;
  const pool = summary['json-pool3']?.node;
  if (one && pool) {
    const cpu = one.cpuUsPerRequest && pool.cpuUsPerRequest ? (pool.cpuUsPerRequest / one.cpuUsPerRequest).toFixed(2) : '-';
    console.log(`pooled model (3 deployments) over one deployment, JSON, the node: ${cpu}× CPU µs/req, ${(pool.rps / one.rps).toFixed(2)}× req/s (issue 36's target: 1.00× within the noise)`);
  }
  if (noisy.length > 0) console.log(`NOISE, not figures: the proxy under test was busy under ${MIN_BUSY_SHARE * 100}% of its core in ${noisy.join(', ')}; run again on a quiet machine`);
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
