// The only module of the data plane that reads argv and the environment. It returns a frozen, typed
// object; a bad setting fails start with one line naming it (ConfigError, exit code 2).
import { ConfigError, readProcessFlags } from '../proto/lib/process-flags.js';
import { isNodeId } from '../proto/lib/node-ids.js';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { checkPepper } from '../proto/lib/keys.js';
import { checkLogLevel, type LogLevel } from '../proto/lib/logger.js';
import { readTlsFiles, type TlsFiles } from '../proto/lib/tls.js';
import { splitAddresses } from '../proto/lib/leader-hint.js';


export interface NodeConfig {
  controlPlane: string;
  listenHost: string;
  listenPort: number;
  adminHost: string | null;
  adminPort: number;
  nodeId: string;
  /** Random per process start. */
  instanceId: string;
  pepper: Buffer;
  nodeToken: string;
  /**
   * TEST-ONLY switch (env TOLLGATE_TEST_CLOCK=1): the node's clock is a manual clock that the admin
   * listener's POST /test/clock sets or advances. Never set it in production.
   */
  testClock: boolean;
  /** Node-wide cap on request bodies held in memory at once (`--max-buffered-body-mib`, default 256). */
  maxBufferedBodyBytes: number;
  /** Least average rate of a body read whole, after the grace (`--body-min-rate-kib`, KiB/s, default 16; 0: none): 408 below it. */
  bodyMinBytesPerSec: number;
  /** Slack before and within the minimum body rate (`--body-grace-seconds`, default 10). */
  bodyGraceMs: number;
  /** Node-wide cap on upload bytes spilled to disk at once (`--max-spill-mib`, default 4096): 503 past it. */
  maxSpillBytes: number;
  /** Where uploads too large to hold in memory are spilled: the OS temporary directory (TMPDIR). */
  spillDir: string;
  /** Bytes held for one realtime client before its upstream is paused (`--realtime-max-buffered-kib`, default 1024). */
  realtimeMaxBufferedBytes: number;
  /** Bytes all realtime sessions together may hold (`--realtime-max-node-buffered-mib`, default 256). */
  realtimeMaxNodeBufferedBytes: number;
  /** `--log-level` (default info). */
  logLevel: LogLevel;
  /** `--drain-seconds` (default 30): how long SIGTERM waits for in-flight requests and streams. */
  drainSeconds: number;
  /** TLS to the control plane: `ca` to trust (else the system's), `cert`/`key` for mutual TLS. Null: plaintext. */
  tls: TlsFiles | null;
  /**
   * `--data-dir`: the node's own folder; unacknowledged reports are journaled under `journal/` there
   * and replayed after a restart. null: the journal is kept in memory (lost if the process dies).
   */
  dataDir: string | null;
  /** `--journal-max-mib` (default 1024; 64 without a data dir): past it, request-log rows are dropped. */
  journalMaxBytes: number;
  /** `--report-every-ms` (default 1000): how often journaled reports are sent to the control plane; 0: at once. */
  reportEveryMs: number;
}

const USAGE =
  'usage: data-plane --control-plane HOST:PORT[,HOST:PORT…] --listen HOST:PORT [--admin-listen HOST:PORT] [--node-id ID] [--pepper-file FILE] [--node-token-file FILE] [--max-buffered-body-mib N] [--body-min-rate-kib N] [--body-grace-seconds N] [--max-spill-mib N] [--data-dir DIR] [--journal-max-mib N] [--report-every-ms N] [--realtime-max-buffered-kib N] [--realtime-max-node-buffered-mib N] [--drain-seconds N] [--log-level LEVEL] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]';
const FLAGS = ['control-plane', 'listen', 'admin-listen', 'node-id', 'pepper-file', 'node-token-file', 'max-buffered-body-mib', 'body-min-rate-kib', 'body-grace-seconds', 'max-spill-mib', 'data-dir', 'journal-max-mib', 'report-every-ms', 'realtime-max-buffered-kib', 'realtime-max-node-buffered-mib', 'drain-seconds', 'log-level', 'tls-ca', 'tls-cert', 'tls-key'] as const;


function hostPort(flag: string, value: string): { host: string; port: number } {
  const m = /^(.+):(\d{1,5})$/.exec(value);
  if (!m || Number(m[2]) > 65535) throw new ConfigError(`${flag} must be HOST:PORT, got ${JSON.stringify(value)}`);
  return { host: m[1].replace(/^\[(.*)\]$/, '$1'), port: Number(m[2]) };
}

function readSecretFile(flag: string, path: string): Buffer {
  try {
    const raw = readFileSync(path);
    // A trailing newline (as editors and `echo` leave) is not part of the secret.
    let end = raw.length;
    if (end > 0 && raw[end - 1] === 0x0a) end--;
    if (end > 0 && raw[end - 1] === 0x0d) end--;
    return raw.subarray(0, end);
  } catch (err) {
    throw new ConfigError(`${flag}: cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
  }
}

export function loadConfig(argv: readonly string[] = process.argv.slice(2), env: NodeJS.ProcessEnv = process.env): Readonly<NodeConfig> {
  const flags = readProcessFlags(argv, FLAGS, USAGE);
  // One control plane, or several on one PostgreSQL database (the node finds the leader among them).
  const cpValue = flags['control-plane'] ?? (env.TOLLGATE_CONTROL_PLANE || undefined);
  if (!cpValue) throw new ConfigError(`--control-plane is required; ${USAGE}`);
  if (splitAddresses(cpValue).length === 0) throw new ConfigError(`--control-plane must be HOST:PORT, got ${JSON.stringify(cpValue)}`);
  for (const a of splitAddresses(cpValue)) hostPort('--control-plane', a);
  const listenValue = flags.listen;
  if (!listenValue) throw new ConfigError(`--listen is required; ${USAGE}`);
  const listen = hostPort('--listen', listenValue);
  const adminValue = flags['admin-listen'];
  const admin = adminValue ? hostPort('--admin-listen', adminValue) : null;

  const pepperFile = flags['pepper-file'];
  const pepper = pepperFile ? readSecretFile('--pepper-file', pepperFile) : env.TOLLGATE_PEPPER ? Buffer.from(env.TOLLGATE_PEPPER, 'utf8') : undefined;
  const pepperError = checkPepper(pepper);
  if (pepperError) throw new ConfigError(pepperError);

  const tokenFile = flags['node-token-file'];
  const nodeToken = tokenFile ? readSecretFile('--node-token-file', tokenFile).toString('utf8').trim() : (env.TOLLGATE_NODE_TOKEN ?? '').trim();
  if (!nodeToken) throw new ConfigError('no node token: set TOLLGATE_NODE_TOKEN or pass --node-token-file');

  const nodeId = flags['node-id'] ?? `${hostname()}-${randomBytes(3).toString('hex')}`;
  if (!isNodeId(nodeId)) throw new ConfigError(`--node-id must be 1-128 characters of A-Z a-z 0-9 . _ : -, got ${JSON.stringify(nodeId)}`);

  const bufferedMib = flags['max-buffered-body-mib'] ?? '256';
  if (!/^\d{1,6}$/.test(bufferedMib) || Number(bufferedMib) < 1) throw new ConfigError(`--max-buffered-body-mib must be a whole number of MiB, at least 1, got ${JSON.stringify(bufferedMib)}`);

  const minRateKib = flags['body-min-rate-kib'] ?? '16';
  if (!/^\d{1,7}$/.test(minRateKib)) throw new ConfigError(`--body-min-rate-kib must be a whole number of KiB per second (0: no minimum), got ${JSON.stringify(minRateKib)}`);
  const graceSeconds = flags['body-grace-seconds'] ?? '10';
  if (!/^\d{1,5}$/.test(graceSeconds) || Number(graceSeconds) < 1) throw new ConfigError(`--body-grace-seconds must be a whole number of seconds, at least 1, got ${JSON.stringify(graceSeconds)}`);
  const spillMib = flags['max-spill-mib'] ?? '4096';
  if (!/^\d{1,7}$/.test(spillMib) || Number(spillMib) < 1) throw new ConfigError(`--max-spill-mib must be a whole number of MiB, at least 1, got ${JSON.stringify(spillMib)}`);

  const dataDir = flags['data-dir'] ?? null;
  if (dataDir !== null && dataDir.trim() === '') throw new ConfigError('--data-dir must not be empty');
  const journalMib = flags['journal-max-mib'] ?? (dataDir === null ? '64' : '1024');
  if (!/^\d{1,7}$/.test(journalMib) || Number(journalMib) < 1) throw new ConfigError(`--journal-max-mib must be a whole number of MiB, at least 1, got ${JSON.stringify(journalMib)}`);
  const reportEveryMs = flags['report-every-ms'] ?? '1000';
  if (!/^\d{1,5}$/.test(reportEveryMs) || Number(reportEveryMs) > 60_000) throw new ConfigError(`--report-every-ms must be a whole number of milliseconds from 0 to 60000, got ${JSON.stringify(reportEveryMs)}`);
  const realtimeKib = flags['realtime-max-buffered-kib'] ?? '1024';
  if (!/^\d{1,7}$/.test(realtimeKib) || Number(realtimeKib) < 16) throw new ConfigError(`--realtime-max-buffered-kib must be a whole number of KiB, at least 16, got ${JSON.stringify(realtimeKib)}`);
  const realtimeNodeMib = flags['realtime-max-node-buffered-mib'] ?? '256';
  if (!/^\d{1,6}$/.test(realtimeNodeMib) || Number(realtimeNodeMib) < 1) throw new ConfigError(`--realtime-max-node-buffered-mib must be a whole number of MiB, at least 1, got ${JSON.stringify(realtimeNodeMib)}`);
  const logLevel = flags['log-level'] ?? 'info';
  const levelError = checkLogLevel(logLevel);
  if (levelError) throw new ConfigError(levelError);
  const drainSeconds = flags['drain-seconds'] ?? '30';
  if (!/^\d{1,5}$/.test(drainSeconds)) throw new ConfigError(`--drain-seconds must be a whole number of seconds, got ${JSON.stringify(drainSeconds)}`);

  return Object.freeze({
    controlPlane: cpValue,
    listenHost: listen.host,
    listenPort: listen.port,
    adminHost: admin?.host ?? null,
    adminPort: admin?.port ?? 0,
    nodeId,
    instanceId: randomBytes(12).toString('base64url'),
    pepper: pepper!,
    nodeToken,
    testClock: env.TOLLGATE_TEST_CLOCK === '1',
    maxBufferedBodyBytes: Number(bufferedMib) * 1024 * 1024,
    bodyMinBytesPerSec: Number(minRateKib) * 1024,
    bodyGraceMs: Number(graceSeconds) * 1000,
    maxSpillBytes: Number(spillMib) * 1024 * 1024,
    spillDir: tmpdir(),
    dataDir,
    journalMaxBytes: Number(journalMib) * 1024 * 1024,
    reportEveryMs: Number(reportEveryMs),
    realtimeMaxBufferedBytes: Number(realtimeKib) * 1024,
    realtimeMaxNodeBufferedBytes: Number(realtimeNodeMib) * 1024 * 1024,
    logLevel: logLevel as LogLevel,
    drainSeconds: Number(drainSeconds),
    tls: readTlsFiles({ cert: flags['tls-cert'], key: flags['tls-key'], ca: flags['tls-ca'] }),
  });
}
