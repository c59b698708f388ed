// `tsx test/bench/profile-top.ts FILE.cpuprofile… [N]`: the functions with the most self time in a V8
// CPU profile (as written by `npm run bench -- --profile DIR`), and the share of busy time per file.
import { readFileSync } from 'node:fs';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}

// Several profiles (a node writes one per process, e.g. `DIR/*.cpuprofile`): each is summarised in turn.
// `--from S` counts only the samples S seconds or more after the profile began (the load, not the
// start-up); the busy time per 5 s printed first shows where the load is.
const args = process.argv.slice(2);
const fromAt = args.indexOf('--from');
const fromUs = fromAt >= 0 ? Number(args.splice(fromAt, 2)[1]) * 1e6 : 0;
const n = args.find((a) => /^\d+$/.test(a)) ?? '30';
for (const file of args.filter((a) => !/^\d+$/.test(a))) summarise(file);

function summarise(file: string): void {
  console.log(`\n== ${file}`);
  const prof = JSON.parse(readFileSync(file, 'utf8')) as { nodes: Node[]; samples: number[]; timeDeltas: number[] };
  const byId = new Map(prof.nodes.map((x) => [x.id, x]));
  const self = new Map<number, number>();
  const idle = new Set(prof.nodes.filter((x) => x.callFrame.functionName === '(idle)' || x.callFrame.functionName === '(program)').map((x) => x.id));
  const perFive: number[] = [];
  let at = 0;
  prof.samples.forEach((id, i) => {
    const dt = prof.timeDeltas[i] ?? 0;
    at += dt;
    if (!idle.has(id)) perFive[Math.floor(at / 5e6)] = (perFive[Math.floor(at / 5e6)] ?? 0) + dt;
    if (at >= fromUs) self.set(id, (self.get(id) ?? 0) + dt);
  });
  console.log(`busy ms per 5 s: ${Array.from(perFive, (v) => Math.round((v ?? 0) / 1000)).join(' ')}`);
  const fn = new Map<string, number>();
  const files = new Map<string, number>();
  let busy = 0;
  let total = 0;
  for (const [id, us] of self) {
    const c = byId.get(id)!.callFrame;
    total += us;
    if (c.functionName === '(idle)' || c.functionName === '(program)') continue;
    busy += us;
    const where = c.url.replace(/^.*\/(node_modules\/[^/]+|data-plane|proto|control-plane)\//, '$1/');
    const name = `${c.functionName || '(anonymous)'} ${where}:${c.lineNumber + 1}`;
    fn.set(name, (fn.get(name) ?? 0) + us);
    const f = where.replace(/:.*$/, '') || c.functionName;
    files.set(f, (files.get(f) ?? 0) + us);
  }
  const pct = (us: number) => `${((100 * us) / busy).toFixed(1).padStart(5)}%`;
  console.log(`busy ${(busy / 1e6).toFixed(2)} s of ${(total / 1e6).toFixed(2)} s sampled`);
  console.log('\nself time by function:');
  for (const [k, v] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, Number(n))) console.log(`${pct(v)}  ${k}`);
  console.log('\nself time by file:');
  for (const [k, v] of [...files].sort((a, b) => b[1] - a[1]).slice(0, 25)) console.log(`${pct(v)}  ${k}`);

  // Inclusive time of Tollgate's own functions (their callees included), counted once per stack.
  const parent = new Map<number, number>();
  for (const x of prof.nodes) for (const c of x.children ?? []) parent.set(c, x.id);
  const incl = new Map<string, number>();
  for (const [id, us] of self) {
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const c = byId.get(cur)!.callFrame;
      if (!/data-plane|control-plane|proto\/lib/.test(c.url)) continue;
      const name = `${c.functionName || '(anonymous)'} ${c.url.replace(/^.*\/(data-plane|control-plane|proto)\//, '$1/')}`;
      if (seen.has(name)) continue;
      seen.add(name);
      incl.set(name, (incl.get(name) ?? 0) + us);
    }
  }
  console.log('\ninclusive time of Tollgate functions:');
  for (const [k, v] of [...incl].sort((a, b) => b[1] - a[1]).slice(0, Number(n))) console.log(`${pct(v)}  ${k}`);
}
