// The data-plane node: load config, construct, listen, sync, handle signals. Nothing else lives here.
import { join } from 'node:path';
import uWS from 'uWebSockets.js';
import { pepperCheck } from '../proto/lib/keys.js';
import { safetyIdKey } from '../proto/lib/safety-identifier.js';
import { SafetyFields } from './proxy/safety-fields.js';
import { isLoopbackAddress } from '../proto/lib/tls.js';
import { splitAddresses } from '../proto/lib/leader-hint.js';
import { StateHolder } from './state/key-table.js';
import { OpenStreams } from './state/open-streams.js';
import { loadConfig } from './config.js';
import { ConfigError } from '../proto/lib/process-flags.js';
import { createAdminApp } from './http/admin.js';
import { sessionLogRow } from './realtime/session-log.js';
import { heapWatch } from './heap-watch.js';
import { closeAllWork, isDraining, markDrainStarted, openWork, registerDrainable } from './drain.js';
import { closeOpenReplies, openReplies } from './request/reply.js';
import { ApiServer, listen } from './http/server.js';
import { BodyWatch } from './request/request-body.js';
import { BodyBudget } from './limits/body-budget.js';
import { Alarm, ManualClock, systemClock, type Clock } from './limits/clock.js';
import { EdgeBudgets } from './limits/edge-budgets.js';
import { KeyBudgets } from './limits/key-budgets.js';
import { LeaseClient } from './leases/lease-client.js';
import { log } from './log.js';
import { setBodySource, setEdgeWindowsSource, setJournalDepthSource, setOwnerRecordsSource, setSyncSource } from './metrics.js';
import { DemoProvider } from './proxy/providers/demo.js';
import { DEFAULT_OWNER_RECORDS_PER_ORG, DEFAULT_OWNER_RECORDS_PER_PROJECT, ResponseOwners } from './state/response-owners.js';
import { OpenAIProvider } from './proxy/providers/openai.js';
import { PoolRegistry, UpstreamTargets } from './proxy/providers/upstream-targets.js';
import { PooledUpstreams } from './proxy/providers/pooled-upstreams.js';
import { Journal } from './sync/journal.js';
import { ToolBackends } from './proxy/tool-backends.js';
import { deploymentHealth } from './proxy/pool-metrics.js';
import { Reporter } from './sync/reporter.js';
import { SyncClient } from './sync/sync-client.js';
import { UsageClient } from './sync/usage-client.js';
import { BackgroundFollowers } from './endpoints/responses/background-responses.js';
import { ResponsesEndpoint } from './endpoints/responses/responses.js';
import { Intake, type Endpoint } from './endpoints/intake.js';
import { SocketEndpoint } from './endpoints/sockets.js';
import { Listings, StoredResponses } from './endpoints/listings.js';
import { ResponsesForward } from './endpoints/responses/responses-forward.js';
import { ModelCalls } from './endpoints/model-calls.js';
import { Tools } from './endpoints/tools.js';
import { Transcription } from './endpoints/transcription.js';
import { Usage } from './endpoints/usage.js';
import { Gate } from './gate/gate.js';
import { DemoResponsesProvider } from './proxy/providers/demo-responses.js';
import { OpenAIResponsesProvider } from './proxy/providers/openai-responses.js';
import type { Provider } from './proxy/providers/provider.js';
import { RealtimeGateway, REALTIME_OVER_HTTP, type RealtimeOptions } from './realtime/gateway.js';
import type { RouteKind } from './routing/routes.js';
import type { UsageSource } from './sync/usage-client.js';
import { Admission } from './request/admission.js';
import { RequestContext } from './request/request-context.js';

/** How often a node checks whether it passed its maximum staleness while keys have something open. */
const STALE_CHECK_MS = 1000;

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
  log.level = config.logLevel;

  const manualClock = config.testClock ? new ManualClock(Date.now()) : null;
  const clock: Clock = manualClock ?? systemClock;
  const holder = new StateHolder();
  const journalLog = (line: string) => (/\b(full|failed|unreadable|dropped)\b/.test(line) ? log.warn({ journal: true }, line) : log.info({ journal: true }, line));
  let journal: Journal;
  try {
    journal = new Journal({ dir: config.dataDir === null ? null : join(config.dataDir, 'journal'), maxBytes: config.journalMaxBytes, log: journalLog });
  } catch (err) {
    fail(`data plane: --data-dir ${config.dataDir}: ${(err as Error).message}`);
  }
  const reporter = new Reporter(clock, { instanceId: config.instanceId, journal, log: journalLog, sendEveryMs: config.reportEveryMs });
  const pools = new PoolRegistry();
  const toolBackends = new ToolBackends();
  // What keys have open ends at the earliest of their keys' expiries too, on the node's clock, cut off or not.
  const expiryAlarm = new Alarm(clock, () => openStreams.enforce(holder.current, isStale()));
  const openStreams: OpenStreams = new OpenStreams({
    now: () => clock.now(),
    expiryOf: (keyHash) => holder.current.keysByHash.get(keyHash)?.expiresAtMs ?? 0,
    alarm: expiryAlarm,
  });
  // Bounded per project and per organisation as the config says (responses.owner_records_per_project,
  // owner_records_per_org; a control plane that sends no organisation bound: the default, or the
  // project's if larger); placed: the projects this node serves only, asked for over the sync stream
  // (docs/design.md#owner-records).
  const ownerRecordsPerProject = () => Number(holder.current.view.config.responses?.ownerRecordsPerProject ?? 0) || DEFAULT_OWNER_RECORDS_PER_PROJECT;
  const responseOwners = new ResponseOwners({
    perProject: ownerRecordsPerProject,
    perOrg: () => Number(holder.current.view.config.responses?.ownerRecordsPerOrg ?? 0) || Math.max(DEFAULT_OWNER_RECORDS_PER_ORG, ownerRecordsPerProject()),
    placed: true,
  });
  let sync: SyncClient | null = null;
  responseOwners.onNeed = (projectId) => sync?.sendOwnerInterest([projectId]);
  setOwnerRecordsSource(() => ({ records: responseOwners.size, projects: responseOwners.projects }));
  const leases = new LeaseClient(clock, (req) => sync?.sendLeaseRequest(req) ?? false, undefined, true);
  // One state per deployment of a pooled model, whichever API a request of it uses; its rpm and tpm
  // held across the cluster with the minute leases.
  const pooled = new PooledUpstreams(new UpstreamTargets(pools), clock, undefined, leases);
  const usage = new UsageClient({ address: config.controlPlane, currentAddress: () => sync?.currentAddress ?? config.controlPlane, nodeToken: config.nodeToken, tls: config.tls, connected: () => sync !== null && sync.disconnectedSince === null });

  const edge = new EdgeBudgets(clock);
  const bodyBudget = new BodyBudget(config.maxBufferedBodyBytes);
  const spillBudget = new BodyBudget(config.maxSpillBytes);
  /** Past --max-staleness without the control plane: the node can no longer vouch for any key. */
  const isStale = (): boolean => {
    const max = holder.current.view.config.maxStalenessMs;
    const since = sync?.disconnectedSince ?? null;
    return max > 0 && since !== null && clock.now() - since > max;
  };
  const api = buildApi({
    holder,
    pepper: config.pepper,
    clock,
    edge,
    keyBudgets: new KeyBudgets(clock, { allowance: leases }),
    bodyBudget,
    bodyWatch: new BodyWatch({ minBytesPerSec: config.bodyMinBytesPerSec, graceMs: config.bodyGraceMs }),
    leases,
    reporter,
    providers: { demo: new DemoProvider(), openai: new OpenAIProvider(pools, clock, new SafetyFields(safetyIdKey(config.pepper)), pooled) },
    pools,
    pooled,
    toolBackends,
    openStreams,
    responseOwners,
    instanceId: config.instanceId,
    spillDir: config.spillDir,
    spillBudget,
    isStale,
    usage,
    realtime: { maxBufferedBytes: config.realtimeMaxBufferedBytes, maxNodeBufferedBytes: config.realtimeMaxNodeBufferedBytes, logSession: (e) => reporter.log(sessionLogRow(e)) },
  });

  // The cork anchor (realtime/cork-anchor.ts) is held before the first client can connect.
  await api.realtime.anchor?.ready;
  const sockets: uWS.us_listen_socket[] = [];
  let listenAddress: string;
  try {
    const bound = await listen(api.app, config.listenHost, config.listenPort);
    sockets.push(bound.socket);
    listenAddress = `${config.listenHost}:${bound.port}`;
  } catch (err) {
    fail(`data plane: ${(err as Error).message} (in use, or not an address of this machine); choose another with --listen`);
  }
  // The process-interface line (docs/design.md#process-interface), printed plainly: tests, scripts and operators parse it.
  console.log(`data plane listening on ${listenAddress}`);
  log.info({ nodeId: config.nodeId, instanceId: config.instanceId, listen: listenAddress, controlPlane: config.controlPlane, drainSeconds: config.drainSeconds }, 'data plane started');

  // Metrics read these states when scraped; never on the request path.
  setEdgeWindowsSource(() => edge.trackedWindows());
  setBodySource(() => ({ bufferedBytes: bodyBudget.held(), bufferedLimitBytes: bodyBudget.maxBytes, spilledBytes: spillBudget.held(), spillLimitBytes: spillBudget.maxBytes }));
  // Unacknowledged usage: the reporter's queue of reports (the node-local journal, when it lands, feeds this).
  setJournalDepthSource(() => reporter.unackedCount);
  setSyncSource(() => {
    const since = sync?.disconnectedSince ?? null;
    return { connected: since === null, appliedVersion: holder.ready ? holder.current.version : 0, lagSeconds: since === null ? 0 : Math.max(0, (clock.now() - since) / 1000) };
  });

  // A node past its maximum staleness ends what keys have open, as the registry's policy says (fail-static until then).
  setInterval(() => {
    if (openStreams.count() > 0 && isStale()) openStreams.enforce(holder.current, true);
  }, STALE_CHECK_MS).unref();
  registerDrainable({ open: openReplies, closeAll: closeOpenReplies });
  registerDrainable({ open: () => api.realtime.open, closeAll: () => api.realtime.closeAll('the gateway node is shutting down; reconnect') });
  // Background responses are followed while the node drains; at its deadline each is billed safely above.
  registerDrainable(api.backgroundResponses);
  if (config.adminHost !== null) {
    const admin = createAdminApp(() => holder.ready && !isDraining(), manualClock, (reset) => api.leaseWaits.snapshot(reset), () => ({ used: leases.usedState(), standing: leases.standingState(), roster: leases.rosterState() }));
    // Open realtime sessions, paused upstreams and the most bytes held for one client (`?reset=1`).
    admin.get('/stats/realtime', (res, req) => {
      res.writeHeader('content-type', 'application/json').end(JSON.stringify(api.realtime.stats.snapshot(req.getQuery('reset') === '1')));
    });
    try {
      const bound = await listen(admin, config.adminHost, config.adminPort);
      sockets.push(bound.socket);
      console.log(`data plane admin listening on ${config.adminHost}:${bound.port}`);
    } catch (err) {
      fail(`data plane admin: ${(err as Error).message} (in use, or not an address of this machine); choose another with --admin-listen`);
    }
    if (manualClock) console.log('data plane: TEST-ONLY manual clock enabled (TOLLGATE_TEST_CLOCK=1)');
  }

  if (!config.tls && !splitAddresses(config.controlPlane).every(isLoopbackAddress)) {
    console.log(`data plane: warning: the node token goes in plaintext to ${config.controlPlane}; use --tls-ca (and --tls-cert/--tls-key) unless the network is private`);
  }
  const checkHeap = heapWatch((line) => log.warn({ heap: true }, line));
  sync = new SyncClient({
    address: config.controlPlane,
    tls: config.tls,
    journalDepth: () => reporter.unackedCount,
    journalExtra: () => ({ journalBytes: reporter.status.journalBytes, droppedLogRows: reporter.status.droppedLogRows }),
    deploymentHealth,
    nodeToken: config.nodeToken,
    nodeId: config.nodeId,
    instanceId: config.instanceId,
    pepperCheck: pepperCheck(config.pepper),
    listenAddress,
    holder,
    reporter,
    openStreams,
    responseOwners,
    leases,
    now: () => clock.now(),
    onApplied: checkHeap,
    onFirstSnapshot: () => {
      console.log('data plane ready');
      log.info({ version: holder.current.version }, 'first snapshot applied: ready');
    },
    onFatal: (line) => {
      log.fatal(line);
      process.exit(2);
    },
    log: (line) => (/\b(lost|failed|refused)\b/.test(line) ? log.warn({ sync: true }, line) : log.info({ sync: true }, line)),
  });
  sync.start();

  // Graceful drain (SIGTERM or SIGINT): stop accepting connections and stop being ready; let the
  // requests and streams in flight finish, each connection closing after its response, within
  // --drain-seconds; then close what is left (through its abort path, so its usage is recorded),
  // give unused leases back, wait for the control plane to acknowledge the usage, and exit 0. The
  // same signal a second time exits at once.
  const signalsSeen = new Set<string>();
  const onSignal = (signal: NodeJS.Signals) => {
    if (signalsSeen.has(signal)) {
      log.warn({ signal, open: openWork() }, `second ${signal}: exiting at once`);
      process.exit(1);
    }
    signalsSeen.add(signal);
    if (isDraining()) return;
    markDrainStarted();
    void drain(signal).catch((err: Error) => {
      log.error({ err }, 'drain failed');
      process.exit(1);
    });
  };
  const drain = async (signal: string) => {
    const startedAt = Date.now();
    const deadline = startedAt + config.drainSeconds * 1000;
    // Only the API listener closes: the admin listener keeps answering /readyz (503 now) and /metrics.
    uWS.us_listen_socket_close(sockets[0]);
    log.info({ signal, open: openWork(), drainSeconds: config.drainSeconds }, 'draining: no new connections, waiting for requests in flight');
    while (openWork() > 0 && Date.now() < deadline) await sleep(50);
    const cut = closeAllWork();
    if (cut > 0) log.warn({ cut }, `drain deadline passed: ${cut} responses closed`);
    leases.giveBackAll();
    reporter.flush();
    // Usage goes to the control plane before the process goes (at least a few seconds, even when the
    // requests used up the drain time).
    const flushed = await reporter.drain(Math.max(3000, deadline - Date.now())).catch(() => false);
    if (flushed) log.info({ ms: Date.now() - startedAt }, 'drained: usage acknowledged by the control plane');
    else log.error({ unacknowledged: reporter.unackedCount }, 'drained, but usage reports were not acknowledged by the control plane');
    sync?.stop();
    usage.close();
    reporter.stop();
    for (const s of sockets.slice(1)) uWS.us_listen_socket_close(s);
    await pools.close().catch(() => {});
    await toolBackends.close().catch(() => {});
    process.exit(0);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

main().catch((err: Error) => fail(`data plane failed: ${err.stack ?? err.message}`, 1));

/** What the node's parts are built from (each takes the part it needs). */
interface NodeDeps {
  holder: StateHolder;
  pepper: Buffer;
  clock: Clock;
  edge: EdgeBudgets;
  keyBudgets: KeyBudgets;
  /** Node-wide budget for request bodies held in memory. */
  bodyBudget?: BodyBudget;
  /** The least pace of a body read whole (408 below it). */
  bodyWatch?: BodyWatch;
  /** Money slices per organisation (and key minute slices, through keyBudgets) from the control plane. */
  leases?: LeaseClient;
  reporter: Reporter;
  providers: Readonly<Record<string, Provider>>;
  pools: PoolRegistry;
  /** Pooled models' deployments: their health and counts (proxy/providers/pooled-upstreams.ts). */
  pooled?: PooledUpstreams;
  instanceId: string;
  /** Where uploads are spilled past their in-memory threshold (upload-spill.ts). */
  spillDir: string;
  /** Node-wide budget for spilled upload bytes (a share per organisation and per account). */
  spillBudget?: BodyBudget;
  /** True when the node was cut off from the control plane longer than the configured maximum. */
  isStale(): boolean;
  /** GET /v1/usage reads the control plane's durable usage through this; absent: 503. */
  usage?: UsageSource;
  /** Realtime sessions: buffer and message limits, the request-log seam. */
  realtime?: RealtimeOptions;
  /** Tool backends: pools, the choice among a prefix's URLs, passive health. */
  toolBackends?: ToolBackends;
  /** Every request of a key from authentication to its end, so revocation can end it (open-streams.ts). */
  openStreams?: OpenStreams;
  /** Who owns each stored response (state/response-owners.ts); shared with the sync client. */
  responseOwners?: ResponseOwners;
}

/** The node's API, built once: the gate, the intake and every endpoint family, wired to uWS by http/server.ts. */
function buildApi(deps: NodeDeps) {
  const gate = new Gate(deps);
  const admission = new Admission(deps, (key, path, ticket, minute, requestId) => new RequestContext(deps, requestId || gate.nextRequestId(), key, path, ticket, minute));
  const intake = new Intake(deps, admission);
  const demoResponses = new DemoResponsesProvider(() => deps.clock.now());
  // The safety_identifier of Responses requests, over HTTP and WebSocket alike (proxy/safety-fields.ts).
  const safety = new SafetyFields(safetyIdKey(deps.pepper));
  const owners = deps.responseOwners ?? new ResponseOwners();
  const backgroundResponses = new BackgroundFollowers({ holder: deps.holder, clock: deps.clock, openStreams: deps.openStreams, isStale: () => deps.isStale(), owners });
  const responses = new ResponsesEndpoint({
    followers: backgroundResponses,
    clock: deps.clock,
    owners,
    providers: { demo: demoResponses, openai: new OpenAIResponsesProvider(deps.pools, safety, deps.pooled) },
    reportOwner: (id, projectId, model, createdAtMs, deployment) => deps.reporter.recordStoredResponse(id, projectId, model, createdAtMs, deployment),
  });
  const modelCalls = new ModelCalls(deps, admission, responses);
  const listings = new Listings(deps);
  const forward = new ResponsesForward(deps, admission, responses);
  const endpoints: Record<RouteKind, Endpoint> = {
    chat: modelCalls,
    embeddings: modelCalls,
    speech: modelCalls,
    responses: modelCalls,
    'stored-response': new StoredResponses(deps, responses),
    conversation: forward,
    compact: forward,
    'input-tokens': forward,
    transcriptions: new Transcription(deps),
    models: listings,
    model: listings,
    voices: listings,
    usage: new Usage(deps),
    tool: new Tools(deps.toolBackends ?? new ToolBackends()),
    realtime: REALTIME_OVER_HTTP,
  };
  const realtime = new RealtimeGateway(deps, gate, intake, deps.realtime);
  // The socket endpoints, realtime and the Responses API's WebSocket mode: the gateway is their uWS side.
  realtime.endpoint = new SocketEndpoint(deps, admission, realtime, { hooks: responses, demo: demoResponses, safety });
  const server = new ApiServer({ gate, intake, endpoints, sockets: realtime });
  return { app: server.app, realtime, backgroundResponses, leaseWaits: admission.waits };
}
