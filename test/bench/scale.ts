// `npm run bench:scale [-- --quick] [-- --only snapshot,revocation,streams]`: how a node behaves at
// scale (issue 13, item 2). A script that prints figures, not a test.
//
// 1. snapshot: a control plane holding 1,000,000 keys (seeded straight into its SQLite database in
//    bulk, then restarted): the time for a fresh node to receive and apply the snapshot, the node's
//    memory per key (RSS against a node holding one key, and V8 heap in-process), and the cost of a
//    lookup (HMAC + Map) with a million keys present against a thousand, in-process and over HTTP.
// 2. revocation: three nodes, 200 keys revoked one after the other through the console API (what
//    `tollgate key revoke` calls); for each, the time from the call to each node refusing the key,
//    p50/p99 (target p99 < 50 ms on loopback).
// 3. streams: 10,000 concurrent idle SSE streams on one node (each holds a client connection and an
//    upstream connection): the node's memory per stream; then as many idle realtime sessions.
// Results go to test/bench/out/scale-<time>.json.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Pool } from 'undici';
import WebSocket from 'ws';
import { GatewayState, StateHolder } from '../../data-plane/state/key-table.js';
import { decodeControlMessage } from '../../data-plane/state/snapshot-decoder.js';
import { hashKey } from '../../proto/lib/keys.js';
import { ControlMessage, type KeyEntry, type Snapshot } from '../../proto/gen/tollgate/v1/sync.js';
import { startControlPlane, startDataPlane, startProcess, stopAll, ROOT, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { seedKeys } from '../helpers/seed-keys.js';
import { nextIp, saturate } from './load.js';
import { rssBytes } from './procstat.js';

const { values: opts } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    keys: { type: 'string' },
    revocations: { type: 'string' },
    streams: { type: 'string' },
  },
});
const QUICK = opts.quick!;
const KEYS = Number(opts.keys ?? (QUICK ? 100_000 : 1_000_000));
const REVOCATIONS = Number(opts.revocations ?? (QUICK ? 50 : 200));
const STREAMS = Number(opts.streams ?? (QUICK ? 1_000 : 10_000));
const only = (name: string) => !opts.only || opts.only.split(',').includes(name);

const MB = 1024 * 1024;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function benchConfig(upstreamUrl?: string): string {
  return configYaml((cfg) => {
    cfg.trusted_proxies = ['127.0.0.1'];
    cfg.tiers.bench = { rpm: 1_000_000_000_000, tpm: 1_000_000_000_000_000, max_parallel_requests: 1_000_000, monthly_cap_usd: null, free_grant_usd: '1000000000', models: [] };
    if (upstreamUrl) addUpstreamModel(cfg, 'idle-chat', `${upstreamUrl}/idle/v1`, ['bench'], { timeout_ms: 600_000 });
    (cfg.tiers.bench.models as string[]).push('demo-realtime');
  });
}

/**
 * RSS of a process once it has settled: two readings a second apart within 1% of each other after a
 * GC-friendly pause (V8 hands freed pages back lazily, some seconds after a large transient such as a
 * snapshot), or the last reading after 20 s.
 */
async function settledRss(pid: number): Promise<number> {
  await sleep(1500);
  let last = rssBytes(pid) ?? 0;
  for (let i = 0; i < 19; i++) {
    await sleep(1000);
    const now = rssBytes(pid) ?? 0;
    if (Math.abs(now - last) <= last * 0.01) return now;
    last = now;
  }
  return last;
}

// ---------------------------------------------------------------------------------------------------
// 1. A snapshot of a million keys.

async function snapshotBench(): Promise<Record<string, unknown>> {
  console.log(`\n1. snapshot of ${KEYS.toLocaleString('en')} keys`);
  const inProcess = lookupInProcess();

  // Baseline: a control plane and a node with one key.
  const base = await startControlPlane({ configYaml: benchConfig() });
  const baseAdmin = consoleClient(base.address, base.secrets.operatorToken);
  const baseKey = await createKey(baseAdmin, { tier: 'bench' });
  baseAdmin.close();
  const baseNode = await startDataPlane(base);
  const baseRss = await settledRss(baseNode.proc.child.pid!);

  // The big one: one real key, then KEYS - 1 more seeded in bulk while the control plane is down.
  const cp = await startControlPlane({ configYaml: benchConfig() });
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const real = await createKey(admin, { tier: 'bench' });
  admin.close();
  await cp.proc.kill('SIGTERM');
  const seedStart = performance.now();
  await seedKeys(cp.dbPath, real.orgId, real.projectId, KEYS - 1);
  const seedMs = performance.now() - seedStart;
  console.log(`  seeded ${(KEYS - 1).toLocaleString('en')} keys into SQLite in ${(seedMs / 1000).toFixed(1)} s`);
  const cpStart = performance.now();
  // startControlPlane waits 30 s for the listening line; loading a million keys may take longer.
  const bigProc = startProcess(['control-plane/main.ts', '--db', cp.dbPath, '--listen', cp.address, '--config', cp.configPath!], {
    TOLLGATE_PEPPER: cp.secrets.pepper,
    TOLLGATE_OPERATOR_TOKEN: cp.secrets.operatorToken,
    TOLLGATE_NODE_TOKEN: cp.secrets.nodeToken,
  });
  await bigProc.waitFor(/control plane listening on (\S+)/, 600_000);
  const big = { proc: bigProc, address: cp.address, secrets: cp.secrets };
  const cpStartMs = performance.now() - cpStart;
  const cpRss = await settledRss(big.proc.child.pid!);

  const t0 = performance.now();
  let node: DataPlane;
  try {
    node = await startDataPlane(big, { waitReady: false });
    await node.proc.waitFor(/data plane ready/, 300_000);
  } catch (err) {
    console.log(`  the node never became ready: ${String(err).split('\n').slice(0, 6).join('\n  ')}`);
    return { keys: KEYS, seedMs, controlPlaneStartMs: cpStartMs, controlPlaneRssBytes: cpRss, nodeReady: false, inProcess };
  }
  const syncMs = performance.now() - t0;
  const rss = await settledRss(node.proc.child.pid!);
  const perKey = (rss - baseRss) / (KEYS - 1);
  console.log(`  control plane start with ${KEYS.toLocaleString('en')} keys: ${(cpStartMs / 1000).toFixed(1)} s, RSS ${(cpRss / MB).toFixed(0)} MB`);
  console.log(`  node start to "data plane ready" (snapshot received and applied): ${(syncMs / 1000).toFixed(1)} s`);
  console.log(`  node RSS ${(rss / MB).toFixed(0)} MB against ${(baseRss / MB).toFixed(0)} MB with one key: ${perKey.toFixed(0)} bytes per key`);

  // Lookup over HTTP: GET /v1/models (authentication is most of its work) on both nodes, interleaved.
  const models = (key: string) => ({ method: 'GET' as const, path: '/v1/models', headers: { authorization: `Bearer ${key}` } });
  await saturate(node.url, models(real.key), 20, 1);
  await saturate(baseNode.url, models(baseKey.key), 20, 1);
  const http: { oneKey: number[]; manyKeys: number[] } = { oneKey: [], manyKeys: [] };
  for (let i = 0; i < 2; i++) {
    http.manyKeys.push((await saturate(node.url, models(real.key), 20, 3)).rps);
    http.oneKey.push((await saturate(baseNode.url, models(baseKey.key), 20, 3)).rps);
  }
  const best = (xs: number[]) => Math.max(...xs);
  console.log(`  GET /v1/models: ${best(http.manyKeys).toFixed(0)} req/s with ${KEYS.toLocaleString('en')} keys, ${best(http.oneKey).toFixed(0)} req/s with one (best of 2, interleaved)`);
  await node.proc.kill('SIGTERM');
  await baseNode.proc.kill('SIGTERM');
  await big.proc.kill('SIGTERM');
  await base.proc.kill('SIGTERM');
  return {
    keys: KEYS,
    seedMs,
    controlPlaneStartMs: cpStartMs,
    controlPlaneRssBytes: cpRss,
    nodeReady: true,
    nodeSyncMs: syncMs,
    nodeRssBytes: rss,
    nodeRssOneKeyBytes: baseRss,
    nodeRssBytesPerKey: perKey,
    modelsRpsManyKeys: best(http.manyKeys),
    modelsRpsOneKey: best(http.oneKey),
    inProcess,
  };
}

/** Heap per key and the cost of one lookup, in this process: KEYS keys against 1,000. */
function lookupInProcess(): Record<string, number> {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const pepper = randomBytes(32);
  const probe = Array.from({ length: 1000 }, (_, i) => `sk-tollgate-probe${String(i).padStart(38, '0')}`);
  const build = (n: number) => {
    const keys: KeyEntry[] = [];
    for (let i = 0; i < n; i++) {
      const hash = i < probe.length ? hashKey(pepper, probe[i]) : randomBytes(32).toString('hex');
      keys.push({ keyId: `key_bulk${String(i).padStart(7, '0')}`, keyHash: hash, projectId: 'proj_bench00000', orgId: 'org_bench000000', allowedModels: [], rpmLimit: 300, tpmLimit: 1_000_000, maxParallelRequests: 100 });
    }
    const snap: Snapshot = { version: 1, config: undefined, keys, orgs: [{ orgId: 'org_bench000000', tier: 'bench', blocked: false, blockedReason: '' }] } as unknown as Snapshot;
    return snap;
  };
  const time = (state: GatewayState, rounds: number) => {
    let found = 0;
    const t = performance.now();
    for (let r = 0; r < rounds; r++) for (const k of probe) if (state.lookup(pepper, k)) found++;
    const ns = ((performance.now() - t) * 1e6) / (rounds * probe.length);
    if (found !== rounds * probe.length) throw new Error('a probe key was not found');
    return ns;
  };
  const small = GatewayState.fromSnapshot(build(1000));
  let snap: Snapshot | null = build(KEYS);
  // The node decodes the snapshot's bytes straight into its packed table (decodeControlMessage).
  let bytes: Uint8Array | null = ControlMessage.encode(ControlMessage.fromPartial({ snapshot: snap })).finish();
  snap = null;
  gc();
  // V8 heap plus ArrayBuffers: the packed key table lives in typed arrays, outside the V8 heap.
  const used = () => process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
  const before = used() - bytes.length;
  const t = performance.now();
  const holder = new StateHolder();
  holder.applySnapshot(decodeControlMessage(bytes).snapshot!);
  const large = holder.current;
  const applyMs = performance.now() - t;
  bytes = null;
  gc();
  const heapPerKey = (used() - before) / KEYS;
  // Warm up both, then measure interleaved.
  time(small, 50);
  time(large, 50);
  const smallNs: number[] = [];
  const largeNs: number[] = [];
  for (let i = 0; i < 3; i++) {
    smallNs.push(time(small, 200));
    largeNs.push(time(large, 200));
  }
  // Random probes over the million: the cost when the index's entries are cold in the CPU caches.
  const hashes = [...large.keysByHash.keys()];
  let hit = 0;
  const tc = performance.now();
  for (let i = 0; i < 200_000; i++) if (large.keysByHash.has(hashes[(i * 7919) % hashes.length])) hit++;
  const coldMapNs = ((performance.now() - tc) * 1e6) / 200_000;
  const min = (xs: number[]) => Math.min(...xs);
  const tablePerKey = large.keyTableBytes / KEYS;
  console.log(`  in-process: decoding and applying the snapshot ${applyMs.toFixed(0)} ms, the packed table's arrays ${tablePerKey.toFixed(0)} bytes per key (V8 heap + ArrayBuffers before and after, less the snapshot's bytes: ${heapPerKey.toFixed(0)}, a rough figure: garbage freed late shows)`);
  console.log(`  in-process lookup (HMAC + index probe + constant-time compare): ${min(largeNs).toFixed(0)} ns with ${KEYS.toLocaleString('en')} keys, ${min(smallNs).toFixed(0)} ns with 1,000; a cold index probe from hex alone ${coldMapNs.toFixed(0)} ns (${hit} hits)`);
  return { applyMs, heapBytesPerKey: heapPerKey, keyTableBytesPerKey: tablePerKey, lookupNsManyKeys: min(largeNs), lookupNsThousandKeys: min(smallNs), coldMapProbeNs: coldMapNs };
}

// ---------------------------------------------------------------------------------------------------
// 2. Revocation latency over three nodes.

async function revocationBench(): Promise<Record<string, unknown>> {
  console.log(`\n2. revocation: ${REVOCATIONS} keys revoked one by one, 3 nodes`);
  const cp = await startControlPlane({ configYaml: benchConfig() });
  const nodes = [await startDataPlane(cp), await startDataPlane(cp), await startDataPlane(cp)];
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const first = await createKey(admin, { tier: 'bench' });
  const keys = [first];
  for (let i = 1; i < REVOCATIONS; i++) keys.push(await createKey(admin, { orgId: first.orgId, projectId: first.projectId }));
  const pools = nodes.map((n) => new Pool(n.url, { connections: 4 }));
  // GET on the chat path: after authentication a 405, which costs the key nothing; before, a 401.
  const probe = async (pool: Pool, key: string) => {
    const r = await pool.request({ method: 'GET', path: '/v1/chat/completions', headers: { authorization: `Bearer ${key}`, 'x-forwarded-for': nextIp() } });
    await r.body.dump();
    return r.statusCode;
  };
  for (const k of keys) for (const p of pools) while ((await probe(p, k.key)) === 401) await sleep(10);

  const perNode: number[][] = [[], [], []];
  const worst: number[] = [];
  const rpc: number[] = [];
  let confirmed = 0;
  for (const k of keys) {
    const t0 = performance.now();
    let stop = false;
    const call = admin.revokeKey({ keyId: k.keyId }).then((r) => {
      rpc.push(performance.now() - t0);
      if (r.nodesConfirmed === r.nodesTotal) confirmed++;
    });
    // Each node is asked again and again, one request at a time, until it refuses the key.
    const refused = pools.map(async (p, i) => {
      while (!stop) {
        if ((await probe(p, k.key)) === 401) {
          const ms = performance.now() - t0;
          perNode[i].push(ms);
          return ms;
        }
        if (performance.now() - t0 > 10_000) throw new Error(`node ${i} still accepts a revoked key after 10 s`);
      }
      return NaN;
    });
    const times = await Promise.all(refused);
    stop = true;
    worst.push(Math.max(...times));
    await call;
  }
  admin.close();
  await Promise.all(pools.map((p) => p.close()));
  const pct = (xs: number[], q: number) => {
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.floor(q * s.length))];
  };
  const row = (xs: number[]) => ({ p50Ms: pct(xs, 0.5), p99Ms: pct(xs, 0.99), maxMs: Math.max(...xs) });
  const result = { revocations: keys.length, nodes: row(worst), perNode: perNode.map(row), rpc: row(rpc), allNodesConfirmed: confirmed };
  perNode.forEach((xs, i) => console.log(`  node ${i + 1}: refuses after p50 ${row(xs).p50Ms.toFixed(1)} ms, p99 ${row(xs).p99Ms.toFixed(1)} ms, max ${row(xs).maxMs.toFixed(1)} ms`));
  console.log(`  all three nodes: p50 ${result.nodes.p50Ms.toFixed(1)} ms, p99 ${result.nodes.p99Ms.toFixed(1)} ms (target < 50 ms); the revoke call returned after p50 ${result.rpc.p50Ms.toFixed(1)} ms, p99 ${result.rpc.p99Ms.toFixed(1)} ms; ${confirmed}/${keys.length} calls confirmed by every node`);
  for (const n of nodes) await n.proc.kill('SIGTERM');
  await cp.proc.kill('SIGTERM');
  return result;
}

// ---------------------------------------------------------------------------------------------------
// 3. Idle streams.

async function streamsBench(): Promise<Record<string, unknown>> {
  // Each stream holds two descriptors in the node (client and upstream): stay under its limit.
  const hard = Number(spawnSync('sh', ['-c', 'ulimit -Hn'], { encoding: 'utf8' }).stdout.trim()) || 1024;
  const streams = Math.min(STREAMS, Math.floor((hard - 500) / 2));
  console.log(`\n3. ${streams.toLocaleString('en')} idle SSE streams on one node${streams < STREAMS ? ` (${STREAMS.toLocaleString('en')} asked; the descriptor limit here is ${hard}, two per stream in the node)` : ''}`);
  const upstream = startProcess(['test/bench/fake-upstream-server.ts']);
  const upstreamUrl = `http://127.0.0.1:${(await upstream.waitFor(/upstream listening on (\d+)/))[1]}`;
  const cp = await startControlPlane({ configYaml: benchConfig(upstreamUrl), env: { TOLLGATE_TEST_UPSTREAM_KEY: 'bench-upstream-key' } });
  const node = await startDataPlane(cp);
  const pid = node.proc.child.pid!;
  // Raise the node's (and the upstream's) soft descriptor limit to the hard one.
  for (const p of [pid, upstream.child.pid!, process.pid]) spawnSync('prlimit', ['--pid', String(p), `--nofile=${hard}:${hard}`]);
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const { key } = await createKey(admin, { tier: 'bench' });
  admin.close();
  const [host, port] = node.address.split(':');
  const body = JSON.stringify({ model: 'idle-chat', messages: [{ role: 'user', content: 'Wait.' }], stream: true });
  const open = (): Promise<Socket> =>
    new Promise((resolve, reject) => {
      const s = connect(Number(port), host, () => {
        s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: ${node.address}\r\nauthorization: Bearer ${key}\r\ncontent-type: application/json\r\nx-forwarded-for: ${nextIp()}\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      });
      let got = '';
      const onData = (c: Buffer) => {
        got += c.toString();
        if (got.includes('data: ')) {
          s.off('data', onData);
          if (!got.startsWith('HTTP/1.1 200')) return reject(new Error(`stream refused: ${got.slice(0, 200)}`));
          resolve(s);
        }
      };
      s.on('data', onData);
      s.on('error', reject);
      setTimeout(() => reject(new Error('no first event within 30 s')), 30_000).unref();
    });
  // The first one warms the node's paths; the baseline is taken after it.
  const sockets: Socket[] = [await open()];
  const rss0 = await settledRss(pid);
  const upstreamRss0 = rssBytes(upstream.child.pid!) ?? 0;
  const t0 = performance.now();
  let failed = 0;
  let firstError = '';
  for (let i = 1; i < streams; i += 200) {
    const batch = await Promise.allSettled(Array.from({ length: Math.min(200, streams - i) }, open));
    for (const b of batch) {
      if (b.status === 'fulfilled') sockets.push(b.value);
      else {
        failed++;
        firstError ||= String(b.reason);
      }
    }
  }
  const openMs = performance.now() - t0;
  const atUpstream = Number(await (await fetch(`${upstreamUrl}/_idle`)).text());
  const rss = await settledRss(pid);
  const perStream = (rss - rss0) / Math.max(1, sockets.length - 1);
  console.log(`  opened ${sockets.length.toLocaleString('en')} streams in ${(openMs / 1000).toFixed(1)} s (${failed} failed${firstError ? `: ${firstError}` : ''}); ${atUpstream.toLocaleString('en')} reached the upstream`);
  console.log(`  node RSS ${(rss / MB).toFixed(0)} MB against ${(rss0 / MB).toFixed(0)} MB with one stream: ${(perStream / 1024).toFixed(1)} KiB per stream (client and upstream connection)`);
  const upstreamRss = rssBytes(upstream.child.pid!) ?? 0;
  for (const s of sockets) s.destroy();
  await node.proc.kill('SIGTERM');
  const realtime = await openIdleRealtimeSockets(cp, key, streams, hard);
  await cp.proc.kill('SIGTERM');
  await upstream.kill('SIGTERM');
  return { asked: STREAMS, streams: sockets.length, failed, reachedUpstream: atUpstream, openMs, nodeRssBytes: rss, nodeRssOneStreamBytes: rss0, nodeRssBytesPerStream: perStream, upstreamRssGrowthBytes: upstreamRss - upstreamRss0, realtime };
}

/**
 * Idle realtime WebSocket sessions on one node (demo-realtime answers locally, so each is one client
 * socket and its session state): memory per session. One X-Forwarded-For each, through the trusted
 * proxy, so the per-IP budget of 60 attempts a minute is not what is measured.
 */
async function openIdleRealtimeSockets(cp: ControlPlane, key: string, count: number, fdLimit: number): Promise<Record<string, unknown>> {
  console.log(`  ${count.toLocaleString('en')} idle realtime sessions (demo-realtime) on a fresh node`);
  const node = await startDataPlane(cp);
  const pid = node.proc.child.pid!;
  for (const p of [pid, process.pid]) spawnSync('prlimit', ['--pid', String(p), `--nofile=${fdLimit}:${fdLimit}`]);
  const open = (): Promise<WebSocket> =>
    new Promise((resolve, reject) => {
      const ws = new WebSocket(`ws://${node.address}/v1/realtime?model=demo-realtime`, { headers: { authorization: `Bearer ${key}`, 'x-forwarded-for': nextIp() } });
      const timer = setTimeout(() => reject(new Error('no session.created within 30 s')), 30_000);
      timer.unref();
      ws.once('message', () => {
        clearTimeout(timer);
        resolve(ws);
      });
      ws.once('unexpected-response', (_req, res) => reject(new Error(`upgrade refused: ${res.statusCode}`)));
      ws.once('error', reject);
    });
  const sockets: WebSocket[] = [await open()];
  const rss0 = await settledRss(pid);
  let failed = 0;
  let firstError = '';
  for (let i = 1; i < count; i += 200) {
    for (const b of await Promise.allSettled(Array.from({ length: Math.min(200, count - i) }, open))) {
      if (b.status === 'fulfilled') sockets.push(b.value);
      else {
        failed++;
        firstError ||= String(b.reason);
      }
    }
  }
  const rss = await settledRss(pid);
  const perSocket = (rss - rss0) / Math.max(1, sockets.length - 1);
  console.log(`  opened ${sockets.length.toLocaleString('en')} sessions (${failed} failed${firstError ? `: ${firstError}` : ''}); node RSS ${(rss / MB).toFixed(0)} MB against ${(rss0 / MB).toFixed(0)} MB with one: ${(perSocket / 1024).toFixed(1)} KiB per session`);
  for (const ws of sockets) ws.terminate();
  await node.proc.kill('SIGTERM');
  return { measured: true, sessions: sockets.length, failed, nodeRssBytes: rss, nodeRssOneSessionBytes: rss0, nodeRssBytesPerSession: perSocket };
}

async function main(): Promise<void> {
  const out: Record<string, unknown> = { at: new Date().toISOString(), quick: QUICK };
  if (only('snapshot')) out.snapshot = await snapshotBench();
  if (only('revocation')) out.revocation = await revocationBench();
  if (only('streams')) out.streams = await streamsBench();
  const dir = join(ROOT, 'test', 'bench', 'out');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `scale-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, JSON.stringify(out, null, 2));
  console.log(`\nwritten to ${file}`);
  await stopAll();
}

main().catch(async (err) => {
  console.error(err);
  await stopAll();
  process.exit(1);
});
