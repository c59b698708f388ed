// `npx tsx test/bench/responses-quick.ts`: a few seconds of demo-provider requests on one node, chat
// completions against the Responses API (JSON and SSE), 32 requests in flight, undici. Prints
// requests/s and p50/p99 per scenario. A script that prints figures, not a test.
import { Pool } from 'undici';
import { configYaml } from '../helpers/config.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { startControlPlane, startDataPlane, stopAll } from '../helpers/processes.js';

const SECONDS = Number(process.env.SECONDS_EACH ?? 3);
const IN_FLIGHT = 32;

async function run(pool: Pool, key: string, path: string, body: unknown): Promise<{ rps: number; p50: number; p99: number }> {
  const payload = JSON.stringify(body);
  const lat: number[] = [];
  const until = performance.now() + SECONDS * 1000;
  let n = 0;
  const worker = async () => {
    while (performance.now() < until) {
      const t = performance.now();
      const r = await pool.request({ method: 'POST', path, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-forwarded-for': `10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n++ & 255}` }, body: payload });
      await r.body.text();
      if (r.statusCode !== 200) throw new Error(`${path}: ${r.statusCode}`);
      lat.push(performance.now() - t);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  lat.sort((a, b) => a - b);
  return { rps: Math.round(lat.length / SECONDS), p50: +lat[Math.floor(lat.length * 0.5)].toFixed(2), p99: +lat[Math.floor(lat.length * 0.99)].toFixed(2) };
}

const cp = await startControlPlane({
  configYaml: configYaml((cfg) => {
    // Each request from its own address through a trusted proxy: the edge budgets in force, never tripped.
    cfg.trusted_proxies = ['127.0.0.1'];
    cfg.tiers.bench = { rpm: 1e9, tpm: 1e12, max_parallel_requests: 1000, monthly_cap_usd: null, free_grant_usd: '1000000.00', models: ['demo-chat'] };
  }),
});
try {
  const node = await startDataPlane(cp);
  const c = consoleClient(cp.address, cp.secrets.operatorToken);
  const k = await createKey(c, { tier: 'bench' });
  c.close();
  await waitUntilKnown(node.url, k.key);
  const pool = new Pool(node.url, { connections: IN_FLIGHT });
  const scenarios: Array<[string, string, unknown]> = [
    ['chat JSON', '/v1/chat/completions', { model: 'demo-chat', messages: [{ role: 'user', content: 'Hello there' }] }],
    ['responses JSON', '/v1/responses', { model: 'demo-chat', input: 'Hello there' }],
    ['chat SSE', '/v1/chat/completions', { model: 'demo-chat', stream: true, messages: [{ role: 'user', content: 'Hello there' }] }],
    ['responses SSE', '/v1/responses', { model: 'demo-chat', stream: true, input: 'Hello there' }],
  ];
  for (const [name, path, body] of scenarios) await run(pool, k.key, path, body); // warm-up
  for (const [name, path, body] of scenarios) console.log(name.padEnd(16), JSON.stringify(await run(pool, k.key, path, body)));
  await pool.close();
} finally {
  await stopAll();
}
