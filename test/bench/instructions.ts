// `npm run bench:instructions [-- --baseline REF[,REF…]] [-- --requests N] [-- --rounds R] [-- --warmup W] [-- --keep]`: CPU instructions per request of
// the node (valgrind's callgrind), JSON and SSE chat. Instruction counts move far less than timings
// when other processes load the machine (rounds of one node still spread 15–25% on a loaded one:
// read the lowest of several rounds), so they measure what a hot-path change bought where the
// timings of `npm run bench` are too noisy. Needs valgrind; the node runs ~50× slower under it.
//
// The node runs under callgrind; after a warm-up of W requests per scenario (default 1,500) the counters
// are zeroed, N requests are sent, and the instructions counted are divided by N. With --baseline REF
// the same is measured for a node built from another commit (a temporary git worktree).
// What is counted: the instructions of the node's main thread inside libuv's I/O poll (callgrind
// --toggle-collect=uv__io_poll), that is, everything the node does in answer to a socket event:
// the client's request, the upstream's answer, the sync stream, with the microtasks and the garbage
// collection they trigger on that thread. Not counted: timers (setTimeout/setInterval/setImmediate
// callbacks: flushes, heartbeats, lease renewals) and V8's background threads (concurrent marking,
// compilation). Under valgrind the node runs ~50× slower, so timer work, which follows the clock and
// not the requests, weighed ~50× more per request than in production and swung identical windows by
// 2–3× (the whole process counted: 419k to 1,259k per JSON request for the same code in one run).
// With --rounds R (default 3) the scenarios are measured R times, alternating, and the lowest count
// of each is reported, with every round's figure printed. A request refused with 502 because the
// upstream closed an idle connection as it was sent (a valgrind-slow node) is sent again.
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, rmSync, symlinkSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import { startProcess, stopAll, ROOT } from '../helpers/processes.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { nextIp } from './load.js';
import { chatBody, startBenchControlPlane } from './targets.js';

const { values: opts } = parseArgs({ options: { baseline: { type: 'string' }, requests: { type: 'string' }, rounds: { type: 'string' }, warmup: { type: 'string' }, keep: { type: 'boolean' } } });
const N = Number(opts.requests ?? 400);
const ROUNDS = Math.max(1, Number(opts.rounds ?? 3));
const WARMUP = Math.max(0, Number(opts.warmup ?? 1500));

async function main(): Promise<void> {
  if (spawnSync('valgrind', ['--version']).status !== 0) throw new Error('valgrind is not on PATH');
  const upstream = startProcess(['test/bench/fake-upstream-server.ts']);
  const upstreamUrl = `http://127.0.0.1:${(await upstream.waitFor(/upstream listening on (\d+)/))[1]}`;
  // Under valgrind the node runs ~50× slower: an answer may take longer than a model's usual timeout.
  const cp = await startBenchControlPlane(upstreamUrl, { modelTimeoutMs: 600_000 });
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const { key } = await createKey(admin, { tier: 'bench' });
  admin.close();

  const out: Record<string, Record<string, number>> = {};
  out.node = await measureNode(ROOT, cp, key, 'node');
  // --baseline A,B,…: each commit's node in turn, in the same run (what each step bought).
  const baselines = opts.baseline ? opts.baseline.split(',').filter(Boolean) : [];
  for (const [i, ref] of baselines.entries()) {
    const dir = join(tmpdir(), `tollgate-baseline-${process.pid}-${i}`);
    const add = spawnSync('git', ['worktree', 'add', '--detach', dir, ref], { cwd: ROOT, encoding: 'utf8' });
    if (add.status !== 0) throw new Error(`git worktree add: ${add.stderr}`);
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
    try {
      out[ref] = await measureNode(dir, cp, key, ref);
    } finally {
      spawnSync('git', ['worktree', 'remove', '--force', dir], { cwd: ROOT });
    }
  }
  console.log(`\ninstructions per request (callgrind, lowest of ${ROUNDS} round(s) of ${N} requests after ${WARMUP} per scenario):`);
  for (const scenario of Object.keys(out.node)) {
    const line = [`  ${scenario.padEnd(5)} node ${fmt(out.node[scenario])}`];
    for (const ref of baselines) line.push(`${ref} ${fmt(out[ref][scenario])}  node/${ref} ${(out.node[scenario] / out[ref][scenario]).toFixed(3)}`);
    console.log(line.join('   '));
  }
  await stopAll();
}

const fmt = (n: number) => `${(n / 1000).toFixed(0)}k`.padStart(7);

async function measureNode(dir: string, cp: { address: string; secrets: { pepper: string; nodeToken: string } }, key: string, label: string): Promise<Record<string, number>> {
  const outDir = mkdtempSync(join(tmpdir(), 'tollgate-callgrind-'));
  const loader = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  const child = spawn(
    'valgrind',
    ['--tool=callgrind', '--smc-check=all-non-file', '--toggle-collect=uv__io_poll', `--callgrind-out-file=${join(outDir, 'cg.%p')}`, process.execPath, '--import', loader, 'data-plane/main.ts', '--control-plane', cp.address, '--listen', '127.0.0.1:0'],
    { cwd: dir, env: { ...process.env, TOLLGATE_PEPPER: cp.secrets.pepper, TOLLGATE_NODE_TOKEN: cp.secrets.nodeToken }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let text = '';
  child.stdout.on('data', (c) => (text += c));
  child.stderr.on('data', (c) => (text += c));
  try {
    return await measureRunning(child, outDir, label, key, () => text);
  } finally {
    // However the measurement ends (a refused request too), the node under valgrind goes with it.
    child.kill('SIGKILL');
    if (opts.keep) console.log(`  ${label}: callgrind dumps kept in ${outDir} (callgrind_annotate FILE)`);
    else rmSync(outDir, { recursive: true, force: true });
  }
}

async function measureRunning(child: ReturnType<typeof spawn>, outDir: string, label: string, key: string, output: () => string): Promise<Record<string, number>> {
  const deadline = Date.now() + 600_000;
  while (!/data plane ready/.test(output())) {
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`node under valgrind did not start:\n${output().slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const url = `http://${output().match(/data plane listening on (\S+)/)![1]}`;
  const pool = new Pool(url, { connections: 4 });
  let retried = 0;
  const send = async (body: string, count: number) => {
    let done = 0;
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        while (done < count) {
          done++;
          const r = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-forwarded-for': nextIp() }, body });
          const text = await r.body.text();
          if (r.statusCode === 502 && text.includes('closed the connection') && retried < 20) {
            retried++;
            done--;
            continue;
          }
          if (r.statusCode !== 200) throw new Error(`status ${r.statusCode}: ${text.slice(0, 300)}`);
        }
      }),
    );
  };
  const result: Record<string, number> = {};
  let part = 0;
  const scenarios = [['json', chatBody(false)], ['sse', chatBody(true)]] as const;
  // Counts fall for the first thousand or so requests of each scenario (tiering, heap growth): warmed up longer.
  for (const [, body] of scenarios) await send(body, WARMUP);
  for (let round = 1; round <= ROUNDS; round++) {
    for (const [name, body] of scenarios) {
      await send(body, 50);
      callgrind(child.pid!, ['--zero']);
      await send(body, N);
      callgrind(child.pid!, [`--dump=${name}`]);
      const perRequest = (await dumpIr(outDir, child.pid!, ++part)) / N;
      result[name] = Math.min(result[name] ?? Infinity, perRequest);
      console.log(`  ${label} ${name} round ${round}: ${fmt(perRequest)} instructions per request`);
    }
  }
  await pool.close();
  if (retried > 0) console.log(`  ${label}: ${retried} request(s) sent again after the upstream closed an idle connection`);
  return result;
}

function callgrind(pid: number, args: string[]): void {
  const r = spawnSync('callgrind_control', [...args, String(pid)], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`callgrind_control ${args.join(' ')}: ${r.stderr}${r.stdout}`);
}

/** The Ir total of dump number `part` (callgrind writes it after callgrind_control returns). */
async function dumpIr(dir: string, pid: number, part: number): Promise<number> {
  const file = join(dir, `cg.${pid}.${part}`);
  for (let i = 0; i < 600; i++) {
    try {
      const m = readFileSync(file, 'utf8').match(/^totals: (\d+)/m);
      if (m) return Number(m[1]);
    } catch {
      // not written yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`no totals in ${file}`);
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
