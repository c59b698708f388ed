// `npm run bench:limits`: what rate limiting and spend accounting cost on the hot path, and how exact
// they stay across nodes. A script that prints figures, not a test.
//
// 1. One node, the demo provider, two keys in the same run: one with rpm/tpm/parallel limits, a
//    monthly cap and spend accounting in force (set high enough not to trip during the run), one
//    whose limits are far away (10^12 rpm, no cap). Requests per second for each and the ratio.
// 2. Three nodes, one key with 300 rpm, a flood of 13,000 requests spread over the nodes within one
//    clock minute (injected clock): admitted must be exactly 300.
// 3. Three nodes, a fresh 300 rpm key, exactly 300 requests in one clock minute behind a sticky
//    balancer: 90% to one node, 10% to a second, none to the third. Admitted must be ≥ 297 (the
//    design admits all 300), and the latency that waiting for a lease added to the requests that
//    waited (GET /stats/lease-waits on each node's admin listener).
//    The same split again from a steady client paced over 3 s: who waits then.
// BENCH_SKIP_THROUGHPUT=1 skips part 1.
// Client IPs are spread with X-Forwarded-For from a trusted proxy so the per-IP edge budgets do not
// cap the measurement.
import { startControlPlane, startDataPlane, stopAll } from '../helpers/processes.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { configYaml } from '../helpers/config.js';
import { minuteStart, setClock } from '../helpers/http.js';
import { load, sendCount, sendPaced, type LoadResult } from './load.js';

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
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  if (process.env.BENCH_SKIP_THROUGHPUT !== '1') {
    const node = await startDataPlane(cp);
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
    await node.proc.kill();
  }

  const clustered = [];
  for (let i = 0; i < 3; i++) clustered.push(await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } }));
  const t = minuteStart() + 1000;
  for (const n of clustered) await setClock(n.adminUrl!, { now_ms: t });
  const auth = (key: string) => ({ authorization: `Bearer ${key}` });

  // A flood over three nodes within one injected clock minute.
  const paid = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: paid.orgId, amountMicros: 1_000_000_000, note: 'bench' });
  const flood = await Promise.all(clustered.map((n, i) => sendCount(n.url, auth(paid.key), body, [4334, 4333, 4333][i], 16, i * 100_000)));
  const admitted = flood.reduce((s, r) => s + r.ok, 0);
  const refused = flood.reduce((s, r) => s + r.other, 0);
  console.log(`three nodes, one 300 rpm key, a flood of ${admitted + refused} requests in one clock minute:`);
  console.log(`  admitted ${admitted} of 300 (over-admission ${admitted - 300}, per node ${flood.map((r) => r.ok).join('/')})`);
  console.log(`  refusals: ${JSON.stringify(mergeCounts(flood.map((r) => r.statuses)))}, retry-after: ${JSON.stringify(mergeCounts(flood.map((r) => r.retryAfter)))}`);

  // The next minute, a fresh key, exactly 300 requests behind a sticky balancer.
  for (const n of clustered) await setClock(n.adminUrl!, { now_ms: t + 60_000 });
  const sticky = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: sticky.orgId, amountMicros: 1_000_000_000, note: 'bench' });
  const floodWaits = await Promise.all(clustered.map((n) => leaseWaits(n.adminUrl!, true)));
  console.log(`  waited for a lease in the flood: ${floodWaits.map((w) => `${w.waited} (${w.admitted} admitted, p50 ${w.p50_ms} ms, max ${w.max_ms} ms)`).join(' / ')}`);
  const t0 = Date.now();
  const split = await Promise.all([sendCount(clustered[0].url, auth(sticky.key), body, 270, 8, 500_000), sendCount(clustered[1].url, auth(sticky.key), body, 30, 1, 600_000)]);
  const ms = Date.now() - t0;
  const after = await Promise.all(clustered.map((n) => leaseWaits(n.adminUrl!)));
  const stickyOk = split.reduce((s, r) => s + r.ok, 0);
  console.log(`three nodes, one 300 rpm key, exactly 300 requests (270 / 30 / 0 per node) in ${ms} ms of one clock minute:`);
  console.log(`  admitted ${stickyOk} of 300 (per node ${split.map((r) => r.ok).join('/')}/0; refusals ${JSON.stringify(mergeCounts(split.map((r) => r.statuses)))})`);
  for (let i = 0; i < 3; i++) {
    const w = after[i];
    console.log(`  node ${i}: ${w.waited} requests waited for a lease (${w.admitted} then admitted); latency added: mean ${w.mean_ms} ms, p50 ${w.p50_ms} ms, p99 ${w.p99_ms} ms, max ${w.max_ms} ms`);
  }

  // The same split from a steady client: 300 requests paced over 3 s (in one injected clock minute).
  for (const n of clustered) await setClock(n.adminUrl!, { now_ms: t + 120_000 });
  const steady = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: steady.orgId, amountMicros: 1_000_000_000, note: 'bench' });
  for (const n of clustered) await leaseWaits(n.adminUrl!, true);
  const paced = await Promise.all([sendPaced(clustered[0].url, auth(steady.key), body, 270, 11, 700_000), sendPaced(clustered[1].url, auth(steady.key), body, 30, 100, 800_000)]);
  const pacedWaits = await Promise.all(clustered.map((n) => leaseWaits(n.adminUrl!)));
  console.log(`the same 270 / 30 / 0 split from a steady client (paced over 3 s): admitted ${paced.reduce((s, r) => s + r.ok, 0)} of 300`);
  console.log(`  waited for a lease: ${pacedWaits.map((w) => `${w.waited} (p50 ${w.p50_ms} ms, max ${w.max_ms} ms)`).join(' / ')}`);
  admin.close();
  await stopAll();
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

function mergeCounts(list: Array<Record<string | number, number>>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of list) for (const [k, v] of Object.entries(m)) out[k] = (out[k] ?? 0) + v;
  return out;
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
