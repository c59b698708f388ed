// `npm run bench:where [-- --only json,sse] [-- --seconds S] [-- --keep DIR]`: where a proxied
// request's CPU time goes, in the node and in the bare proxy, measured in one run (issue 13: "show with
// profiles exactly where the remaining time goes"). A script that prints figures, not a test.
//
// Each target is saturated as in `npm run bench` (same scenarios, same set-up, pinned the same way)
// while `perf record` samples every thread of the process under test (cpu-clock, with call stacks;
// node runs with --perf-basic-prof so JavaScript frames have names). Each sample is charged to one
// component, by walking its stack from the leaf to the root:
// - kernel code: "kernel: sockets, syscalls";
// - V8's garbage collector (on the main thread or its helpers): "V8 garbage collection";
// - V8's other background threads (the optimising compiler): "V8 compiler threads";
// - uWebSockets.js's native code: "uWebSockets.js (native)";
// - a JavaScript function of a known file: that file's component (the table below); builtins,
//   runtime functions, node's own JavaScript and native code (OpenSSL's HMAC, Buffer, string
//   conversions) are charged to the nearest such caller, or to "node core" / "V8 runtime" when none.
// Then µs per request = samples × sampling period ÷ requests answered. Needs Linux `perf`; without it
// the script says so and exits.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { stopAll, ROOT } from '../helpers/processes.js';
import { hasWrk, saturate, type Target } from './load.js';
import { canPin, cpuMicros, pin } from './procstat.js';
import { pickScenarios, startTargets } from './targets.js';

const { values: opts } = parseArgs({
  options: {
    only: { type: 'string', default: 'json,sse' },
    seconds: { type: 'string', default: '5' },
    keep: { type: 'string' },
    detail: { type: 'string', default: '0' },
  },
});
const SECONDS = Number(opts.seconds);
const FREQ = 4000;
const WARMUP_SECONDS = 5;
/** --detail N: the N frames with the most time in each component. */
const DETAIL = Number(opts.detail);
const PROXY_CORE = 0;
const LOAD_CORE = 1;

/** Components of the product (and of the bare proxy), by source file. First match wins. */
const FILE_COMPONENTS: [RegExp, string][] = [
  [/test\/bench\/bare-proxy\.ts/, "bare proxy's handler"],
  [/data-plane\/http\/validate-request\.ts|data-plane\/proxy\/tokens\.ts/, 'request validation, token estimate'],
  [/data-plane\/auth\//, 'authentication (HMAC, key table)'],
  [/data-plane\/limits\/|data-plane\/http\/admission\.ts/, 'limits (edge, key budgets, leases, admission)'],
  [/data-plane\/proxy\//, 'upstream exchange (proxy, splice, usage read)'],
  [/data-plane\/sync\/|data-plane\/http\/request-log\.ts|proto\/lib\/|proto\/gen\//, 'usage totals, request logs, journal, sync'],
  [/data-plane\/metrics\.ts|data-plane\/log\.ts/, 'metrics'],
  [/data-plane\/http\/|data-plane\/routing\/|data-plane\/errors\.ts|data-plane\/drain\.ts/, 'request handling (routes, body, reply, context)'],
  [/data-plane\//, 'other node code'],
  [/node_modules\/undici\//, 'undici (upstream HTTP/1.1 client)'],
  [/node_modules\/@grpc\/|node_modules\/@bufbuild\/|node_modules\/protobufjs/, 'gRPC, protobuf'],
  [/node_modules\/uWebSockets\.js\//, 'uWebSockets.js (native)'],
  [/node_modules\/(pino|prom-client|thread-stream|sonic-boom)\//, 'metrics'],
  [/node_modules\//, 'other packages'],
];

const GC = /Heap::|Scavenge|MarkCompact|Sweeper|GCTracer|Marking|Evacuat|MinorMC|CppHeap|IncrementalMarking|MemoryAllocator|MemoryReducer|ConcurrentMarking|Heap\b|PagedSpace|NewSpace|SemiSpace|LargeObjectSpace|Compactor|RememberedSet|SlotSet|TypedSlot|WeakObjects|RecordWrite|ObjectVisitor|MainMarkingVisitor|YoungGeneration|PointersUpdating|ParallelMove|GlobalHandles::Process|FreeList/;

interface Frame {
  sym: string;
  dso: string;
}

/** A frame's name for the detail listing: the function and its file, without the directories. */
function short(sym: string): string {
  return sym.replace(/^(JS|Builtin|Stub|BytecodeHandler|RegExp):[*~^+-]?/, '').replace(/(file:\/\/)?\/\S*\/(node_modules\/[^/]+\/)?/, '$2').replace(/:\d+:\d+$/, '').replace(/\(.*\)$/, '').slice(0, 90);
}

/** The component a sample's time is charged to (frames leaf first), and the frame that decided it. */
export function componentOf(thread: string, frames: Frame[]): [string, string] {
  const leaf = frames[0] ? short(frames[0].sym) : '?';
  if (/DefaultWorke|V8 Worker/.test(thread)) {
    return [frames.some((f) => GC.test(f.sym)) ? 'V8 garbage collection' : 'V8 compiler threads', leaf];
  }
  let fallback = '';
  for (const f of frames) {
    if (f.dso.includes('kernel')) return ['kernel: sockets, syscalls', short(f.sym)];
    if (GC.test(f.sym)) return ['V8 garbage collection', short(f.sym)];
    if (f.dso.includes('uws_linux')) return ['uWebSockets.js (native)', short(f.sym)];
    const url = f.sym.match(/(file:\/\/\S+|node:\S+|\/\S+\.[cm]?[jt]s\b\S*)/)?.[1];
    if (url) {
      if (url.startsWith('node:')) {
        fallback ||= 'node core (streams, buffers, timers)';
        continue;
      }
      for (const [re, name] of FILE_COMPONENTS) if (re.test(url)) return [name, f === frames[0] ? short(f.sym) : `${short(f.sym)} < ${leaf}`];
      fallback ||= 'other JavaScript';
      continue;
    }
    if (/^(Builtin|Stub|BytecodeHandler|RegExp|Bytecodes?):/.test(f.sym) || f.dso.includes('perf-')) {
      fallback ||= 'V8 builtins, regexps';
      continue;
    }
    if (/libuv|uv_|uv__/.test(f.sym)) {
      fallback ||= 'libuv event loop';
      continue;
    }
    fallback ||= /libc|ld-linux/.test(f.dso) ? 'libc (malloc, memcpy)' : 'V8 runtime, node native';
  }
  return [fallback || 'unknown', leaf];
}

interface Profile {
  samples: number;
  byComponent: Map<string, number>;
  /** component → deciding frame → samples. */
  detail: Map<string, Map<string, number>>;
}

/**
 * Symbols of a --perf-basic-prof map file, where the last entry covering an address wins: V8 reuses
 * the addresses of code it freed, so a map holds several entries per address and perf's own pick can
 * be code that was gone long before the samples were taken.
 */
class PerfMap {
  private readonly start: Float64Array;
  private readonly end: Float64Array;
  private readonly names: string[];
  private readonly cache = new Map<string, string | null>();

  constructor(text: string) {
    const lines = text.split('\n').filter((l) => l.length > 0);
    this.start = new Float64Array(lines.length);
    this.end = new Float64Array(lines.length);
    this.names = [];
    lines.forEach((l, i) => {
      const [a, size, ...name] = l.split(' ');
      this.start[i] = parseInt(a, 16);
      this.end[i] = this.start[i] + parseInt(size, 16);
      this.names.push(name.join(' '));
    });
  }

  resolve(ipHex: string): string | null {
    let hit = this.cache.get(ipHex);
    if (hit !== undefined) return hit;
    const ip = parseInt(ipHex, 16);
    hit = null;
    for (let i = this.start.length - 1; i >= 0; i--) {
      if (ip >= this.start[i] && ip < this.end[i]) {
        hit = this.names[i];
        break;
      }
    }
    this.cache.set(ipHex, hit);
    return hit;
  }
}

function parsePerfScript(text: string, map: PerfMap | null): Profile {
  const byComponent = new Map<string, number>();
  const detail = new Map<string, Map<string, number>>();
  let samples = 0;
  for (const block of text.split(/\n\s*\n/)) {
    const lines = block.split('\n').filter((l) => l.length > 0);
    if (lines.length === 0) continue;
    // "node 1234 [000] 123.456: 250000 cpu-clock:" then one frame per line: "\t addr sym+off (dso)".
    const head = lines[0];
    if (/^\s/.test(head)) continue;
    const thread = head.trim().replace(/\s+\d+(\/\d+)?\s+(\[\d+\]\s+)?[\d.]+:.*$/, '');
    const frames: Frame[] = [];
    for (const l of lines.slice(1)) {
      const m = l.match(/^\s*([0-9a-f]+)\s+(.*?)\s+\(([^)]*)\)\s*$/);
      if (!m) continue;
      const jit = m[3].includes('perf-') && map ? map.resolve(m[1]) : null;
      frames.push({ sym: jit ?? m[2].replace(/\+0x[0-9a-f]+$/, ''), dso: m[3] });
    }
    samples++;
    const [c, where] = componentOf(thread, frames);
    byComponent.set(c, (byComponent.get(c) ?? 0) + 1);
    let d = detail.get(c);
    if (!d) detail.set(c, (d = new Map()));
    d.set(where, (d.get(where) ?? 0) + 1);
  }
  return { samples, byComponent, detail };
}

interface Row {
  rps: number;
  requests: number;
  cpuUsPerRequest: number;
  perComponentUs: Map<string, number>;
  /** component → its frames with the most time, µs per request. */
  detailUs: Map<string, [string, number][]>;
}

async function profileTarget(url: string, t: Target, connections: number, pid: number, dir: string, label: string): Promise<Row> {
  await saturate(url, t, connections, WARMUP_SECONDS);
  const data = join(dir, `${label}.perf.data`);
  const perf = spawn('perf', ['record', '-q', '-e', 'cpu-clock', '-F', String(FREQ), '-g', '-p', String(pid), '-o', data, '--', 'sleep', String(SECONDS)], { stdio: 'ignore' });
  const perfDone = new Promise((res) => perf.on('exit', res));
  const cpu0 = cpuMicros(pid)!;
  const r = await saturate(url, t, connections, SECONDS);
  const cpu1 = cpuMicros(pid)!;
  await perfDone;
  const script = spawnSync('perf', ['script', '-i', data, '-F', 'comm,tid,time,event,ip,sym,dso'], { encoding: 'utf8', maxBuffer: 1 << 30 });
  // The map as it stood when sampling ended (the process keeps appending to it).
  const mapFile = `/tmp/perf-${pid}.map`;
  const prof = parsePerfScript(script.stdout, existsSync(mapFile) ? new PerfMap(readFileSync(mapFile, 'utf8')) : null);
  const usPerSample = 1e6 / FREQ;
  const perComponentUs = new Map([...prof.byComponent].map(([k, n]) => [k, (n * usPerSample) / r.requests]));
  const detailUs = new Map(
    [...prof.detail].map(([c, d]) => [c, [...d].sort((a, b) => b[1] - a[1]).slice(0, DETAIL).map(([w, n]) => [w, (n * usPerSample) / r.requests] as [string, number])]),
  );
  return { rps: r.rps, requests: r.requests, cpuUsPerRequest: (cpu1 - cpu0) / r.requests, perComponentUs, detailUs };
}

async function main(): Promise<void> {
  if (spawnSync('perf', ['--version']).error) {
    console.log('bench:where needs Linux perf on PATH; none here.');
    return;
  }
  const scenarios = pickScenarios(opts.only);
  pin(process.pid, LOAD_CORE);
  const perfArgs = ['--perf-basic-prof', '--interpreted-frames-native-stack'];
  const { upstream, bare, cp, node, bareUrl, auth } = await startTargets({ nodeArgs: perfArgs, bareArgs: perfArgs });
  const pinned = canPin && [pin(node.proc.child.pid!, PROXY_CORE), pin(bare.child.pid!, PROXY_CORE), pin(upstream.child.pid!, LOAD_CORE), pin(cp.proc.child.pid!, LOAD_CORE)].every(Boolean);
  const dir = opts.keep ?? mkdtempSync(join(tmpdir(), 'tollgate-where-'));
  mkdirSync(dir, { recursive: true });
  console.log(`tollgate bench:where: perf cpu-clock at ${FREQ} Hz, ${SECONDS} s per target, ${hasWrk ? 'wrk' : 'autocannon'}, ${pinned ? 'pinned as in npm run bench' : 'not pinned'}`);

  const out: Record<string, Record<string, { requests: number; cpuUsPerRequest: number; components: Record<string, number>; detail: Record<string, [string, number][]> }>> = {};
  for (const s of scenarios) {
    const t = s.request(auth);
    const bareRow = await profileTarget(bareUrl, t, s.connections, bare.child.pid!, dir, `${s.name}-bare`);
    const nodeRow = await profileTarget(node.url, t, s.connections, node.proc.child.pid!, dir, `${s.name}-node`);
    out[s.name] = {
      bare: { requests: bareRow.requests, cpuUsPerRequest: bareRow.cpuUsPerRequest, components: Object.fromEntries(bareRow.perComponentUs), detail: Object.fromEntries(bareRow.detailUs) },
      node: { requests: nodeRow.requests, cpuUsPerRequest: nodeRow.cpuUsPerRequest, components: Object.fromEntries(nodeRow.perComponentUs), detail: Object.fromEntries(nodeRow.detailUs) },
    };
    printScenario(s.name, bareRow, nodeRow);
  }

  const outDir = join(ROOT, 'test', 'bench', 'out');
  mkdirSync(outDir, { recursive: true });
  const file = join(outDir, `where-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, JSON.stringify({ at: new Date().toISOString(), seconds: SECONDS, freq: FREQ, pinned, scenarios: out }, null, 2));
  console.log(`\nwritten to ${file}`);
  if (!opts.keep) rmSync(dir, { recursive: true, force: true });
  const pids = [node.proc.child.pid!, bare.child.pid!];
  await stopAll();
  // --perf-basic-prof also makes V8 write a code log per isolate (main thread, tsx's loader thread) in
  // the working directory.
  for (const pid of pids) {
    rmSync(`/tmp/perf-${pid}.map`, { force: true });
    for (const f of readdirSync(ROOT)) if (f.startsWith('isolate-') && f.endsWith(`-${pid}-v8.log`)) rmSync(join(ROOT, f), { force: true });
  }
}

function printScenario(name: string, bare: Row, node: Row): void {
  const names = new Set([...bare.perComponentUs.keys(), ...node.perComponentUs.keys()]);
  const rows = [...names].map((c) => ({ c, b: bare.perComponentUs.get(c) ?? 0, n: node.perComponentUs.get(c) ?? 0 })).sort((x, y) => y.n - x.n || y.b - x.b);
  const sum = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
  const f = (x: number) => x.toFixed(1).padStart(7);
  console.log(`\n${name}: CPU µs per request by component (perf samples; /proc total in brackets)`);
  console.log(`  ${'component'.padEnd(48)}    bare     node   node − bare`);
  for (const r of rows) {
    if (r.b < 0.05 && r.n < 0.05) continue;
    console.log(`  ${r.c.padEnd(48)} ${f(r.b)}  ${f(r.n)}  ${f(r.n - r.b)}`);
    for (const [label, row] of [['bare', bare], ['node', node]] as const) {
      for (const [w, us] of row.detailUs.get(r.c) ?? []) if (us >= 0.1) console.log(`      ${label} ${us.toFixed(1).padStart(5)}  ${w}`);
    }
  }
  console.log(`  ${'total sampled'.padEnd(48)} ${f(sum(bare.perComponentUs))}  ${f(sum(node.perComponentUs))}  ${f(sum(node.perComponentUs) - sum(bare.perComponentUs))}`);
  console.log(`  ${'(/proc utime + stime)'.padEnd(48)} ${f(bare.cpuUsPerRequest)}  ${f(node.cpuUsPerRequest)}   node/bare ${(node.cpuUsPerRequest / bare.cpuUsPerRequest).toFixed(2)}×`);
  console.log(`  ${'requests/s (under perf)'.padEnd(48)} ${bare.rps.toFixed(0).padStart(7)}  ${node.rps.toFixed(0).padStart(7)}   node/bare ${(node.rps / bare.rps).toFixed(2)}×`);
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
