// The data-plane node: load config, construct, listen, sync, handle signals. Nothing else lives here.
import uWS from 'uWebSockets.js';
import { pepperCheck } from '../proto/lib/keys.js';
import { StateHolder } from './auth/key-table.js';
import { OpenStreams } from './auth/open-streams.js';
import { ConfigError, loadConfig } from './config.js';
import { createAdminApp } from './http/admin.js';
import { ApiServer, listen } from './http/server.js';
import { BodyBudget } from './limits/body-budget.js';
import { ManualClock, systemClock, type Clock } from './limits/clock.js';
import { EdgeBudgets } from './limits/edge-budgets.js';
import { KeyBudgets } from './limits/key-budgets.js';
import { LeaseClient } from './limits/lease-client.js';
import { DemoProvider } from './proxy/providers/demo.js';
import { OpenAIProvider, PoolRegistry } from './proxy/providers/openai.js';
import { ToolBackends } from './proxy/tool-backends.js';
import { Reporter } from './sync/reporter.js';
import { SyncClient } from './sync/sync-client.js';

function fail(line: string, code = 2): never {
  console.error(line);
  process.exit(code);
}

/** The trufflesuite republish falls back to a slow pure-JS shim (no getParts, no SSLApp) when its binary does not load. */
function assertNativeUws(): void {
  const native = uWS as unknown as Record<string, unknown>;
  if (typeof native.getParts !== 'function' || typeof native.SSLApp !== 'function') {
    fail(
      `uWebSockets.js loaded its pure-JS fallback instead of the native binary (Node ${process.versions.node}, ABI ${process.versions.modules}); ` +
        'run on Node 20 and unset UWS_USE_FALLBACK',
    );
  }
}

async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) fail(err.message);
    throw err;
  }
  assertNativeUws();

  const manualClock = config.testClock ? new ManualClock(Date.now()) : null;
  const clock: Clock = manualClock ?? systemClock;
  const holder = new StateHolder();
  const reporter = new Reporter(clock);
  const pools = new PoolRegistry();
  const toolBackends = new ToolBackends();
  const openStreams = new OpenStreams();
  let sync: SyncClient | null = null;
  const leases = new LeaseClient(clock, (req) => sync?.sendLeaseRequest(req) ?? false);

  const api = new ApiServer({
    holder,
    pepper: config.pepper,
    clock,
    edge: new EdgeBudgets(clock),
    keyBudgets: new KeyBudgets(clock, { allowance: leases }),
    bodyBudget: new BodyBudget(config.maxBufferedBodyBytes),
    leases,
    reporter,
    providers: { demo: new DemoProvider(), openai: new OpenAIProvider(pools) },
    pools,
    toolBackends,
    openStreams,
    instanceId: config.instanceId,
    spillDir: config.spillDir,
    isStale: () => {
      const max = holder.current.view.config.maxStalenessMs;
      const since = sync?.disconnectedSince ?? null;
      return max > 0 && since !== null && clock.now() - since > max;
    },
  });

  const sockets: uWS.us_listen_socket[] = [];
  let listenAddress: string;
  try {
    const bound = await listen(api.app, config.listenHost, config.listenPort);
    sockets.push(bound.socket);
    listenAddress = `${config.listenHost}:${bound.port}`;
  } catch (err) {
    fail(`data plane: ${(err as Error).message}`);
  }
  console.log(`data plane listening on ${listenAddress}`);

  if (config.adminHost !== null) {
    const admin = createAdminApp(() => holder.ready, manualClock, (reset) => api.leaseWaits.snapshot(reset));
    try {
      const bound = await listen(admin, config.adminHost, config.adminPort);
      sockets.push(bound.socket);
      console.log(`data plane admin listening on ${config.adminHost}:${bound.port}`);
    } catch (err) {
      fail(`data plane admin: ${(err as Error).message}`);
    }
    if (manualClock) console.log('data plane: TEST-ONLY manual clock enabled (TOLLGATE_TEST_CLOCK=1)');
  }

  sync = new SyncClient({
    address: config.controlPlane,
    nodeToken: config.nodeToken,
    nodeId: config.nodeId,
    instanceId: config.instanceId,
    pepperCheck: pepperCheck(config.pepper),
    listenAddress,
    holder,
    reporter,
    openStreams,
    leases,
    now: () => clock.now(),
    onFirstSnapshot: () => console.log('data plane ready'),
    onFatal: (line) => fail(line),
    log: (line) => console.log(`data plane: ${line}`),
  });
  sync.start();

  let stopping = false;
  const shutdown = async () => {
    if (stopping) return;
    stopping = true;
    for (const s of sockets) uWS.us_listen_socket_close(s);
    sockets.length = 0;
    // Unused leases go back at once so other nodes can use them this minute; give queued usage a
    // moment to reach the control plane; then go.
    leases.giveBackAll();
    await reporter.drain(1000).catch(() => false);
    sync?.stop();
    reporter.stop();
    await pools.close().catch(() => {});
    await toolBackends.close().catch(() => {});
    process.exit(0);
  };
  process.on('SIGINT', () => void shutdown());
  process.on('SIGTERM', () => void shutdown());
}

main().catch((err: Error) => fail(`data plane failed: ${err.stack ?? err.message}`, 1));
