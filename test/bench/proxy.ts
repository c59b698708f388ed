// `npm run bench:proxy`: the node's hot path against a bare uWebSockets.js + undici proxy and against
// calling the upstream directly (issue 3, "Performance from the start"). A script that prints
// figures, not a test. Each server runs in its own process; the load generator is this process.
import { startDataPlane, startProcess, stopAll } from '../helpers/processes.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { startBenchControlPlane } from './targets.js';
import { load } from './load.js';

const DURATION_MS = Number(process.env.BENCH_DURATION_MS ?? 5000);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const body = JSON.stringify({ model: 'bench-chat', messages: [{ role: 'user', content: 'Hello there, how are you?' }] });

async function measure(url: string, headers: Record<string, string>, durationMs: number): Promise<number> {
  const r = await load(url, headers, body, durationMs, CONNECTIONS);
  if (r.other > 0) console.log(`  (${r.other} non-200 answers from ${url})`);
  return r.rps;
}

async function main(): Promise<void> {
  const upstream = startProcess(['test/bench/fake-upstream-server.ts']);
  const upstreamUrl = `http://127.0.0.1:${(await upstream.waitFor(/upstream listening on (\d+)/))[1]}`;
  const bare = startProcess(['test/bench/bare-proxy.ts', upstreamUrl]);
  const bareUrl = `http://127.0.0.1:${(await bare.waitFor(/bare proxy listening on (\d+)/))[1]}`;
  const cp = await startBenchControlPlane(upstreamUrl);
  // BENCH_PROFILE=DIR writes a CPU profile of the node into DIR when the run ends.
  const profile = process.env.BENCH_PROFILE;
  const node = await startDataPlane(cp, profile ? { nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${profile}`] } : {});
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const { key } = await createKey(admin, { tier: 'bench' });
  admin.close();
  const auth = { authorization: `Bearer ${key}` };
  // BENCH_WITHOUT_CONTROL_PLANE=1 stops the control plane once the node holds the key (the node then
  // serves fail-static and keeps usage in memory): shows what the control plane's ingestion costs
  // the shared machine.
  if (process.env.BENCH_WITHOUT_CONTROL_PLANE === '1') {
    for (let i = 0; i < 100 && (await fetch(`${node.url}/v1/models`, { headers: auth })).status !== 200; i++) await new Promise((r) => setTimeout(r, 20));
    await cp.proc.kill('SIGKILL');
  }
  await measure(upstreamUrl, {}, 1000);
  await measure(bareUrl, {}, 1000);
  await measure(node.url, auth, 1000);
  const direct: number[] = [];
  const viaBare: number[] = [];
  const viaNode: number[] = [];
  for (let round = 0; round < 2; round++) {
    direct.push(await measure(upstreamUrl, {}, DURATION_MS));
    viaBare.push(await measure(bareUrl, {}, DURATION_MS));
    viaNode.push(await measure(node.url, auth, DURATION_MS));
  }
  const avg = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const rounds = (xs: number[]) => `[rounds ${xs.map((x) => x.toFixed(0)).join(', ')}]`;
  console.log(`${CONNECTIONS} connections, ${DURATION_MS} ms × 2 rounds:`);
  console.log(`  upstream directly:      ${avg(direct).toFixed(0)} req/s ${rounds(direct)}`);
  console.log(`  bare uWS+undici proxy:  ${avg(viaBare).toFixed(0)} req/s ${rounds(viaBare)} (${(avg(viaBare) / avg(direct)).toFixed(3)} of direct)`);
  console.log(`  Tollgate node:          ${avg(viaNode).toFixed(0)} req/s ${rounds(viaNode)} (${(avg(viaNode) / avg(viaBare)).toFixed(3)} of the bare proxy; target ≥ 0.9)`);
  await node.proc.kill('SIGTERM');
  await stopAll();
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
