// `npm run bench:limits`: what rate limiting and spend accounting cost on the hot path, and how exact
// they stay across nodes. A script that prints figures, not a test.
//
// 1. One node, the demo provider, two keys in the same run: one with rpm/tpm/parallel limits, a
//    monthly cap and spend accounting in force (set high enough not to trip during the run), one
//    whose limits are far away (10^12 rpm, no cap). Requests per second for each and the ratio.
// 2. Three nodes, one key with 300 rpm, a burst of requests spread over the nodes within one clock
//    minute (injected clock): admitted vs. the limit (over-admission must be ≤ 0).
// Client IPs are spread with X-Forwarded-For from a trusted proxy so the per-IP edge budgets do not
// cap the measurement.
import { startControlPlane, startDataPlane, stopAll } from '../helpers/processes.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { configYaml } from '../helpers/config.js';
import { minuteStart, setClock } from '../helpers/http.js';
import { load, type LoadResult } from './load.js';

const DURATION_MS = Number(process.env.BENCH_DURATION_MS ?? 5000);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const body = JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello there, how are you?' }] });

function loadKey(url: string, key: string, durationMs: number, connections: number): Promise<LoadResult> {
  return load(url, { authorization: `Bearer ${key}` }, body, durationMs, connections);
}

async function main(): Promise<void> {
  const yaml = configYaml((cfg) => {
    cfg.trusted_proxies = ['127.0.0.1'];
    cfg.tiers.limited = { rpm: 100_000_000, tpm: 100_000_000_000, max_parallel_requests: 100_000, monthly_cap_usd: '1000000', free_grant_usd: '1000000', models: ['demo-chat'] };
    cfg.tiers.unlimited = { rpm: 1_000_000_000_000, tpm: 1_000_000_000_000_000, max_parallel_requests: 1_000_000_000, monthly_cap_usd: null, free_grant_usd: '1000000000', models: ['demo-chat'] };
  });
  const cp = await startControlPlane({ configYaml: yaml });
  const node = await startDataPlane(cp);
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const limited = await createKey(admin, { tier: 'limited' });
  const unlimited = await createKey(admin, { tier: 'unlimited' });

  // Warm up both paths, then alternate measurements so drift affects both alike.
  await loadKey(node.url, limited.key, 1000, CONNECTIONS);
  await loadKey(node.url, unlimited.key, 1000, CONNECTIONS);
  const on: number[] = [];
  const off: number[] = [];
  for (let round = 0; round < 2; round++) {
    const a = await loadKey(node.url, limited.key, DURATION_MS, CONNECTIONS);
    const b = await loadKey(node.url, unlimited.key, DURATION_MS, CONNECTIONS);
    if (a.other > 0 || b.other > 0) console.log(`  (non-200 answers: limited ${a.other}, unlimited ${b.other})`);
    on.push(a.rps);
    off.push(b.rps);
  }
  const avg = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
  console.log(`one node, ${CONNECTIONS} connections, ${DURATION_MS} ms × 2 rounds each:`);
  console.log(`  limits and spend accounting on: ${avg(on).toFixed(0)} req/s`);
  console.log(`  limits far away:                ${avg(off).toFixed(0)} req/s`);
  console.log(`  ratio on/off:                   ${(avg(on) / avg(off)).toFixed(3)}`);

  // Over-admission across three nodes within one injected clock minute.
  await node.proc.kill();
  const clustered = [];
  for (let i = 0; i < 3; i++) clustered.push(await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } }));
  const t = minuteStart() + 1000;
  for (const n of clustered) await setClock(n.adminUrl!, { now_ms: t });
  const paid = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: paid.orgId, amountMicros: 1_000_000_000, note: 'bench' });
  const results = await Promise.all(clustered.map((n) => loadKey(n.url, paid.key, 1500, 16)));
  const admitted = results.reduce((s, r) => s + r.ok, 0);
  const refused = results.reduce((s, r) => s + r.other, 0);
  console.log(`three nodes, one 300 rpm key, ${admitted + refused} requests in one clock minute:`);
  console.log(`  admitted ${admitted} of 300 (over-admission ${admitted - 300}, per node ${results.map((r) => r.ok).join('/')})`);
  admin.close();
  await stopAll();
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
