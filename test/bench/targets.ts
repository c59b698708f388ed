// What `npm run bench` and `npm run bench:where` measure: the scenarios (requests) and the targets
// (the fake upstream called directly, the bare proxy, a control plane and a node with a key whose
// limits are far away), started the same way for both scripts.
import { startControlPlane, startDataPlane, startProcess, type Proc } from '../helpers/processes.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import type { Target } from './load.js';

export const CONNECTIONS = 50;

export interface Scenario {
  name: string;
  connections: number;
  request(auth: string): Target;
}

export const chatBody = (stream: boolean, model = 'bench-chat') =>
  JSON.stringify({
    model,
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'Hello there! In one sentence, what is an API gateway for?' },
    ],
    ...(stream ? { stream: true } : {}),
  });
const MiB = Buffer.alloc(1024 * 1024, 'tollgate bench ');

export const SCENARIOS: Scenario[] = [
  { name: 'json', connections: CONNECTIONS, request: (auth) => ({ method: 'POST', path: '/v1/chat/completions', headers: { authorization: auth, 'content-type': 'application/json' }, body: chatBody(false) }) },
  // The JSON chat to a model of three deployments on the same upstream (issue 36): beside `json`, what a pool costs the node.
  { name: 'json-pool3', connections: CONNECTIONS, request: (auth) => ({ method: 'POST', path: '/v1/chat/completions', headers: { authorization: auth, 'content-type': 'application/json' }, body: chatBody(false, 'bench-pool') }) },
  { name: 'sse', connections: CONNECTIONS, request: (auth) => ({ method: 'POST', path: '/v1/chat/completions', headers: { authorization: auth, 'content-type': 'application/json' }, body: chatBody(true) }) },
  { name: 'tool-get', connections: CONNECTIONS, request: (auth) => ({ method: 'GET', path: '/v1/vector_stores/vs_bench', headers: { authorization: auth } }) },
  { name: 'tool-post-1mib', connections: 8, request: (auth) => ({ method: 'POST', path: '/v1/vector_stores/vs_bench/files', headers: { authorization: auth, 'content-type': 'application/octet-stream' }, body: MiB }) },
  { name: 'models', connections: CONNECTIONS, request: (auth) => ({ method: 'GET', path: '/v1/models', headers: { authorization: auth } }) },
];

export function pickScenarios(only: string | undefined): Scenario[] {
  return only ? SCENARIOS.filter((s) => only.split(',').includes(s.name)) : SCENARIOS;
}

export interface BenchTargets {
  upstream: Proc;
  upstreamUrl: string;
  bare: Proc;
  bareUrl: string;
  cp: Awaited<ReturnType<typeof startControlPlane>>;
  node: Awaited<ReturnType<typeof startDataPlane>>;
  auth: string;
}

/**
 * The upstream, the bare proxy, a control plane and a node (node flags `nodeArgs`, bare proxy flags
 * `bareArgs`), a key provisioned and known to the node. Requests come through a trusted proxy
 * (127.0.0.1), so X-Forwarded-For sets each client's address.
 */
export async function startTargets(opts: { nodeArgs?: string[]; bareArgs?: string[] } = {}): Promise<BenchTargets> {
  const upstream = startProcess(['test/bench/fake-upstream-server.ts']);
  const upstreamUrl = `http://127.0.0.1:${(await upstream.waitFor(/upstream listening on (\d+)/))[1]}`;
  const bare = startProcess(['test/bench/bare-proxy.ts', upstreamUrl], {}, { nodeArgs: opts.bareArgs });
  const bareUrl = `http://127.0.0.1:${(await bare.waitFor(/bare proxy listening on (\d+)/))[1]}`;
  const cp = await startBenchControlPlane(upstreamUrl);
  const node = await startDataPlane(cp, { nodeArgs: opts.nodeArgs });
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const { key } = await createKey(admin, { tier: 'bench' });
  admin.close();
  const auth = `Bearer ${key}`;
  await waitForKey(node.url, auth);
  return { upstream, upstreamUrl, bare, bareUrl, cp, node, auth };
}

/**
 * A control plane whose tier `bench` has limits far away (10^12 rpm, no cap), so a figure is the
 * pipeline's cost (edge budgets, auth, key budgets, money slices, usage), not a cap; model
 * `bench-chat`, `bench-pool` (the same upstream as three deployments) and the tool prefix
 * /v1/vector_stores on `upstreamUrl`; 127.0.0.1 a trusted proxy.
 */
export function startBenchControlPlane(upstreamUrl: string, opts: { modelTimeoutMs?: number } = {}): ReturnType<typeof startControlPlane> {
  return startControlPlane({
    configYaml: configYaml((cfg) => {
      cfg.trusted_proxies = ['127.0.0.1'];
      cfg.tiers.bench = { rpm: 1_000_000_000_000, tpm: 1_000_000_000_000_000, max_parallel_requests: 1_000_000, monthly_cap_usd: null, free_grant_usd: '1000000000', models: [] };
      addUpstreamModel(cfg, 'bench-chat', `${upstreamUrl}/v1`, ['bench'], opts.modelTimeoutMs ? { timeout_ms: opts.modelTimeoutMs } : undefined);
      // bench-chat's upstream as three deployments of equal weight, without limits of their own.
      const deployment = (id: string) => ({ id, base_url: `${upstreamUrl}/v1`, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', upstream_model: 'upstream-bench-chat' });
      addUpstreamModel(cfg, 'bench-pool', '', ['bench'], { base_url: undefined, api_key_env: undefined, upstream_model: undefined, deployments: ['d1', 'd2', 'd3'].map(deployment), ...(opts.modelTimeoutMs ? { timeout_ms: opts.modelTimeoutMs } : {}) });
      cfg.tool_backends = [{ prefix: '/v1/vector_stores', base_url: upstreamUrl, timeout_ms: 10_000 }];
    }),
    env: { TOLLGATE_TEST_UPSTREAM_KEY: 'bench-upstream-key' },
  });
}

export async function waitForKey(url: string, auth: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    const r = await fetch(`${url}/v1/models`, { headers: { authorization: auth, 'x-forwarded-for': '10.0.0.1' } });
    await r.arrayBuffer();
    if (r.status === 200) return;
    await new Promise((res) => setTimeout(res, 25));
  }
  throw new Error('the node never learnt the bench key');
}
