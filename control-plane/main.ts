// Wiring only: load config, open the database, build the services, listen, handle signals.
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { hostname } from 'node:os';
import { pepperCheck } from '../proto/lib/keys.js';
import { ConsoleServiceService } from '../proto/gen/tollgate/v1/console.js';
import { SyncServiceService } from '../proto/gen/tollgate/v1/sync.js';
import { createAdminServer, listenAdmin } from './admin.js';
import { loadControlPlaneConfig, readGatewayConfig } from './config.js';
import { ConfigError } from '../proto/lib/process-flags.js';
import { ConsoleService } from './console/console-service.js';
import { ControlState } from './state/control-state.js';
import { addOpsServices, CONSOLE_SERVICE, HealthState, SYNC_SERVICE } from './grpc/ops.js';
import { LeaderGate } from './grpc/leader-gate.js';
import { leaderFromDetails } from '../proto/lib/leader-hint.js';
import { log as logger, logLine } from './log.js';
import { countUnaryCalls, observeTransaction, setFleetSource, setReady } from './metrics.js';
import { NewerSchemaError, runMigrations } from './store/migrate.js';
import { describeStore, openLeadership, openLogStore, openStateDb, StoreInUseError } from './store/open-store.js';
import type { Db } from './store/db.js';
import type { LogStore } from './store/log-store/log-store.js';
import { ReportIngest } from './sync/report-ingest.js';
import { SyncService } from './sync/sync-service.js';
import { AuditRecorder } from './audit/audit-recorder.js';
import { startWebhooks } from './webhooks/start-webhooks.js';
import { KeyExpirySweeper } from './console/key-expiry.js';
import { StoredResponsesFanout } from './sync/stored-responses.js';

const log = logLine;

async function main(): Promise<void> {
  const cfg = loadControlPlaneConfig();
  logger.level = cfg.logLevel;
  const gateway = readGatewayConfig(cfg.configPath);
  const health = new HealthState();
  // Every console and sync call passes the gate: refused (UNAVAILABLE, naming the leader) unless this control plane leads.
  const gate = new LeaderGate();
  const server = new Server({
    // Notice dead nodes: ping idle streams, drop them when pings go unanswered.
    'grpc.keepalive_time_ms': 10_000,
    'grpc.keepalive_timeout_ms': 5_000,
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 5_000,
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
    'grpc.max_send_message_length': 256 * 1024 * 1024,
  });
  server.addService(ConsoleServiceService, countUnaryCalls(gate.handlers(CONSOLE_SERVICE, ConsoleServiceService)));
  server.addService(SyncServiceService, gate.handlers(SYNC_SERVICE, SyncServiceService));
  addOpsServices(server, health);
  const serverCredentials = cfg.tls
    ? ServerCredentials.createSsl(cfg.tls.ca, [{ cert_chain: cfg.tls.cert!, private_key: cfg.tls.key! }], cfg.tls.ca !== null)
    : ServerCredentials.createInsecure();
  const transport = !cfg.tls ? 'plaintext' : cfg.tls.ca ? 'TLS, client certificates required' : 'TLS';
  const host = cfg.listen.slice(0, cfg.listen.lastIndexOf(':'));
  let listening: Promise<number> | null = null;
  const listen = () =>
    (listening ??= new Promise<number>((resolve, reject) =>
      server.bindAsync(cfg.listen, serverCredentials, (err, p) => {
        if (!err) resolve(p);
        else if (/EADDRINUSE/.test(err.message)) reject(new ConfigError(`--listen ${cfg.listen}: address already in use; choose another with --listen`));
        else reject(new ConfigError(`--listen ${cfg.listen}: cannot listen (${err.message})`));
      }),
    ));
  // Where nodes and the CLI reach this control plane: --advertise-address, else the address it listens on.
  const advertisedAddress = (port: number) => cfg.advertiseAddress ?? `${host === '0.0.0.0' || host === '[::]' ? hostname() : host}:${port}`;
  let announced = false;
  // The process-interface line (docs/design.md#process-interface), printed plainly: tests, scripts and operators parse it.
  const announce = (port: number) => {
    if (!announced) console.log(`control plane listening on ${host}:${port} (${transport})`);
    announced = true;
  };

  // Several control planes on one PostgreSQL database: one leads, the others stand by until the lock is theirs.
  const leadership = openLeadership(cfg, log, cfg.leaderRetryMs);
  let leading = leadership === null;
  const standbyStop = () => {
    if (leading) return;
    void leadership?.stop();
    server.forceShutdown();
    process.exit(0);
  };
  process.once('SIGINT', standbyStop);
  process.once('SIGTERM', standbyStop);
  if (leadership) {
    leading = await leadership.waitToLead((leaderAddress) => {
      gate.standBy(leaderAddress);
      if (listening) return;
      health.setNotServing();
      // A standby listens, to answer every call with the leader's address.
      listen().then((port) => {
        announce(port);
        leadership.ownAddress = advertisedAddress(port);
      }, fail);
    });
    if (!leading) return;
    log(`leading: took the leader lock (epoch ${leadership.epoch}); loading the state`);
  }
  process.off('SIGINT', standbyStop);
  process.off('SIGTERM', standbyStop);
  let deposed: ((reason: string) => void) | null = null;
  // The leader's epoch, checked by each write: a write refused on it means another control plane leads.
  const fence = leadership ? { epoch: leadership.epoch, onFenced: (err: Error) => deposed?.(err.message) } : undefined;

  const db = await openStateDb(cfg, log, fence);
  db.txObserver = observeTransaction;
  await runMigrations(db);
  const state = await ControlState.open(db, gateway, { configPath: cfg.configPath, log });
  // Request logs: their own file (or PostgreSQL partitions), one table per UTC day, older days dropped whole.
  const logs = await openLogStore(cfg, { retentionDays: cfg.logRetentionDays, now: () => state.now(), log }, fence);
  await logs.applyRetention();
  const webhooks = await startWebhooks(state, log);
  const audit = new AuditRecorder(db, { now: () => state.now(), retentionDays: cfg.auditRetentionDays, log });
  await audit.applyRetention();
  const storedResponses = new StoredResponsesFanout(db, () => state.now(), log, () => Number(state.config.responses?.ownerRecordsPerProject ?? 0));
  storedResponses.start();
  const ingest = new ReportIngest(state, webhooks.revokedKeys.wrap(logs), storedResponses, log);
  // Usage a former process journaled and did not fold is folded before nodes connect.
  await ingest.usageFold.start();
  const sync: SyncService = new SyncService(state, ingest, {
    nodeToken: cfg.nodeToken,
    pepperCheck: pepperCheck(cfg.pepper),
    log,
    storedResponses,
    snapshotPartEntries: cfg.snapshotPartEntries,
    onNodeDisconnected: (node) => webhooks.nodeDisconnected(node, (id) => sync.liveNodes().some((n) => n.id === id)),
  });
  await sync.expectRejoin(cfg.rejoinGraceMs);
  // Project caps' and key limits' 80 % and 100 % thresholds, once per period (docs/money-limits.md).
  sync.moneyPools.onSpent = (spent) => {
    webhooks.events.limitThresholds(spent).catch((err: Error) => log(`webhooks: ${spent.kind} limit threshold not recorded: ${err.message}`));
  };
  const consoleService = new ConsoleService(state, sync, {
    operatorToken: cfg.operatorToken,
    pepper: cfg.pepper,
    revokeAckTimeoutMs: cfg.revokeAckTimeoutMs,
    log,
    logs,
    audit,
    webhooks,
    // A project's new cap: what it spent is read afresh when its pool is next leased.
    onProjectCapSet: async (tx, project) => tx.afterCommit(() => sync.moneyPools.forgetProject(project.id)),
  });
  const expiry = new KeyExpirySweeper(state, (keyId, reason) => consoleService.revoke(keyId, reason), webhooks.events, log);
  const expiryTimer = setInterval(() => {
    expiry.sweep().catch((err: Error) => log(`key expiry sweep failed: ${err.message}`));
  }, 1_000);
  expiryTimer.unref();
  setFleetSource({
    connectedCount: () => sync.connectedCount(),
    liveNodes: () => sync.liveNodes(),
    currentVersion: () => state.snapshots.version,
    get ingestBacklog() {
      return sync.ingestBacklog;
    },
  });
  gate.serve(CONSOLE_SERVICE, consoleService.handlers());
  gate.serve(SYNC_SERVICE, sync.handlers());
  gate.lead();
  health.setServing();
  const port = await listen();
  const advertised = advertisedAddress(port);
  await leadership?.advertise(advertised);
  sync.startRejoinGrace();
  if (cfg.operatorTokenCreatedAt) {
    // Shown once, to the operator who started it: a plain line on the terminal, never a log event.
    console.log(`operator token: ${cfg.operatorToken}`);
    log(`operator token saved to ${cfg.operatorTokenCreatedAt} (mode 0600); it is not printed again`);
  }
  let admin: ReturnType<typeof createAdminServer> | null = null;
  let adminAddress: string | null = null;
  if (cfg.adminListen) {
    admin = createAdminServer((err) => logger.error({ err }, 'metrics failed'));
    const bound = await listenAdmin(admin, cfg.adminListen).catch((err: NodeJS.ErrnoException) => {
      throw new ConfigError(`--admin-listen: cannot listen on ${cfg.adminListen}: ${err.code ?? err.message}`);
    });
    adminAddress = `${bound.host}:${bound.port}`;
    console.log(`control plane admin listening on ${adminAddress}`);
  }
  // SIGHUP must reach this process itself (tsx's launcher relays only SIGINT and SIGTERM).
  log(`control plane pid ${process.pid}: SIGHUP re-reads ${cfg.configPath}`);
  setReady(true);
  logger.info({ listen: `${host}:${port}`, transport, admin: adminAddress, db: describeStore(cfg), config: cfg.configPath, version: state.snapshots.version, leader: leadership ? advertised : undefined }, 'control plane started');
  if (leadership) console.log(`control plane leading (epoch ${leadership.epoch}) at ${advertised}`);
  announce(port);

  const monthTimer = setInterval(() => {
    state.checkMonthRollover().catch((err: Error) => log(`month rollover failed: ${err.message}`));
  }, 30_000);
  monthTimer.unref();
  const retentionTimer = setInterval(() => {
    logs.applyRetention().catch((err: Error) => log(`request-log retention failed: ${err.message}`));
    audit.applyRetention().catch((err: Error) => log(`audit retention failed: ${err.message}`));
  }, 3_600_000);
  retentionTimer.unref();

  process.on('SIGHUP', () => {
    state.reloadConfig().then(
      (v) => log(`config reloaded from ${cfg.configPath}: version ${v}`),
      (err: Error) => log(err instanceof ConfigError ? `config not reloaded, old config kept: ${err.message}` : `config reload failed: ${err.message}`),
    );
  });

  // SIGTERM or SIGINT: stop being ready, end the node streams, let console calls in flight answer
  // (forced after 3 s), let every queued transaction commit or roll back, close the database (which
  // checkpoints the WAL), exit 0. The same signal a second time exits at once.
  const signalsSeen = new Set<string>();
  let stopping = false;
  // The lead lost (the lock's connection ended, or a write failed the fence): stop acting at once,
  // answer as a standby naming the new leader, end the nodes' streams, and exit 3 once calls in
  // flight are answered: a supervisor starts it again, as a standby (docs/deployment.md).
  deposed = (reason: string) => {
    if (stopping) return;
    stopping = true;
    gate.standBy(leaderFromDetails(reason) ?? '');
    stopWriting(db, logs, reason);
    setReady(false);
    health.setNotServing();
    log(`lost the lead: ${reason}; no longer serving, exiting`);
    clearInterval(monthTimer);
    clearInterval(retentionTimer);
    clearInterval(expiryTimer);
    webhooks.stop();
    sync.closeAll();
    leadership?.readLeaderAddress().then(
      (a) => a && gate.standBy(a),
      () => undefined,
    );
    const force = setTimeout(() => server.forceShutdown(), 3000);
    server.tryShutdown(() => {
      clearTimeout(force);
      void leadership?.stop();
      process.exit(3);
    });
  };
  leadership?.onLost((reason) => deposed?.(reason));
  const stop = (signal: NodeJS.Signals) => {
    if (signalsSeen.has(signal)) {
      logger.warn({ signal }, `second ${signal}: exiting at once`);
      process.exit(1);
    }
    signalsSeen.add(signal);
    if (stopping) return;
    stopping = true;
    setReady(false);
    health.setNotServing();
    logger.info({ signal }, 'stopping: closing node streams and finishing console calls');
    clearInterval(monthTimer);
    clearInterval(retentionTimer);
    clearInterval(expiryTimer);
    webhooks.stop();
    sync.closeAll();
    const force = setTimeout(() => server.forceShutdown(), 3000);
    server.tryShutdown(() => {
      clearTimeout(force);
      Promise.all([ingest.usageFold.close().then(() => db.close()), logs.close()]).then(
        async () => {
          // The lock goes with its connection: a standby may lead at once.
          await leadership?.stop();
          logger.info('stopped: database closed cleanly');
          admin?.close();
          process.exit(0);
        },
        (err: Error) => {
          logger.error({ err }, 'database did not close cleanly');
          process.exit(1);
        },
      );
    });
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

/** Both stores refuse every write from now (PostgreSQL; SQLite has one control plane and no leader). */
function stopWriting(db: Db, logs: LogStore, reason: string): void {
  db.refuseWrites?.(reason);
  logs.refuseWrites?.(reason);
}

function fail(err: unknown): never {
  // A setting to fix, or a database this version must not touch: one line, exit 2.
  if (err instanceof ConfigError || err instanceof NewerSchemaError || err instanceof StoreInUseError) {
    console.error(err.message);
    process.exit(2);
  }
  logger.fatal({ err }, `control plane failed to start: ${(err as Error)?.message ?? String(err)}`);
  process.exit(1);
}

main().catch(fail);
