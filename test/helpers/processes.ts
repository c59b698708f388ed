// Starts the real processes on loopback port 0 and waits for the lines of the process interface
// (docs/design.md#process-interface): `control plane listening on HOST:PORT`, `data plane listening on HOST:PORT`,
// `data plane ready`. Every process started here is killed in t.after by the caller (or by stopAll).
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer as createNetServer } from 'node:net';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { NODE_HEAP_FLAGS, NODE_MEMORY_ENV } from '../../data-plane/heap-flags.js';
import { testDatabaseFor } from './postgres-server.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
// Long-running processes load tsx in-process (`node --import tsx`) instead of through tsx's CLI,
// which runs the program in a second node process: a SIGKILL to that wrapper left the real process
// running as an orphan (so "kill the control plane" tests killed nothing, and the orphan kept the
// test's pipes open so the test process never exited).
const TSX_LOADER = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const TSX_ARGS = ['--import', TSX_LOADER];
/**
 * The scripts test/run.mjs bundled for this run (test/process-bundles.mjs), script → bundle file:
 * started from its bundle, a control plane, node or CLI loads one file instead of each of its
 * modules through tsx's loader (about 0.7 s of CPU less per start).
 */
const BUNDLES: Record<string, string> = JSON.parse(process.env.TOLLGATE_TEST_BUNDLES || '{}');

/** Node's arguments that run `script` (relative to `cwd`, or absolute): this run's bundle of it, else the source through tsx. */
export function scriptArgs(script: string, cwd = ROOT): string[] {
  const bundle = BUNDLES[relative(ROOT, resolve(cwd, script))];
  return bundle ? [bundle] : [...TSX_ARGS, script];
}

export interface Proc {
  child: ChildProcess;
  /** Everything printed so far on stdout and stderr. */
  output(): string;
  /** Resolves with the first match of `re` in the output (waiting for it), rejects if the process exits first. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  kill(signal?: NodeJS.Signals): Promise<number | null>;
}

const live = new Set<Proc>();

export function startProcess(args: string[], env: Record<string, string | undefined> = {}, opts: { cwd?: string; nodeArgs?: string[] } = {}): Proc {
  const child = spawn(process.execPath, [...(opts.nodeArgs ?? []), ...scriptArgs(args[0], opts.cwd), ...args.slice(1)], {
    cwd: opts.cwd ?? ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const waiters = new Set<() => void>();
  const onChunk = (chunk: Buffer) => {
    out += chunk.toString();
    for (const w of [...waiters]) w();
  };
  child.stdout!.on('data', onChunk);
  child.stderr!.on('data', onChunk);
  let exited = false;
  const exitPromise = new Promise<number | null>((resolve) =>
    child.on('exit', (code, signal) => {
      exited = true;
      for (const w of [...waiters]) w();
      resolve(code ?? (signal ? 128 : null));
    }),
  );
  const proc: Proc = {
    child,
    output: () => out,
    waitFor(re, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const m = out.match(re);
          if (m) {
            waiters.delete(check);
            clearTimeout(timer);
            resolve(m);
          } else if (exited) {
            waiters.delete(check);
            clearTimeout(timer);
            reject(new Error(`process exited before printing ${re}; output:\n${out}`));
          }
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`timed out waiting for ${re}; output:\n${out}`));
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
    async kill(signal = 'SIGTERM') {
      live.delete(proc);
      if (!exited) child.kill(signal);
      return exitPromise;
    },
  };
  live.add(proc);
  return proc;
}

export async function stopAll(): Promise<void> {
  await Promise.all([...live].map((p) => p.kill('SIGKILL')));
}

/**
 * A port the OS just handed out and released, for launchers that need a fixed address to print
 * (another process may take it first: callers retry on a busy port).
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createNetServer();
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

/**
 * Starts a launcher (npm start, npm run cluster) on two ports the OS just handed out. Another test may
 * take such a port before the launcher binds it; the launcher then says so, and fresh ports are tried.
 */
export async function startOnFreePorts(start: (cpPort: number, dpPort: number) => Proc, ready = /Tollgate is running/): Promise<{ proc: Proc; cpPort: number; dpPort: number }> {
  for (let attempt = 1; ; attempt++) {
    const [cpPort, dpPort] = [await freePort(), await freePort()];
    const proc = start(cpPort, dpPort);
    // A port found free may be taken before the launcher binds it (by one of its own children on
    // port 0, or by another test): the launcher or the control plane says so, and new ports are tried.
    const m = await proc.waitFor(new RegExp(`${ready.source}|already in use`), 90_000);
    if (m[0] !== 'already in use') return { proc, cpPort, dpPort };
    await proc.kill('SIGKILL');
    if (attempt === 3) throw new Error(`no free ports after 3 tries:\n${proc.output()}`);
  }
}

export function tempDir(label = 'tollgate-test-'): string {
  return mkdtempSync(join(tmpdir(), label));
}

/** Secrets shared by one test's control plane and nodes. */
export interface Secrets {
  pepper: string;
  operatorToken: string;
  nodeToken: string;
}

export function newSecrets(): Secrets {
  return {
    pepper: randomBytes(32).toString('hex'),
    operatorToken: `op_${randomBytes(24).toString('hex')}`,
    nodeToken: `node_${randomBytes(24).toString('hex')}`,
  };
}

export interface ControlPlane {
  proc: Proc;
  address: string;
  dbPath: string;
  dir: string;
  secrets: Secrets;
  configPath?: string;
  /** `http://HOST:PORT` of the admin listener (with `adminListen`). */
  adminUrl?: string;
}

export interface ControlPlaneOptions {
  /** Start the admin listener (/healthz, /readyz, /metrics) on a free loopback port. */
  adminListen?: boolean;
  dir?: string;
  secrets?: Secrets;
  configPath?: string;
  /** YAML text written to a config file in the test's folder. */
  configYaml?: string;
  listen?: string;
  extraArgs?: string[];
  env?: Record<string, string | undefined>;
  /** Flags for node itself (e.g. --cpu-prof in benchmarks). */
  nodeArgs?: string[];
  /** A postgres:// URL (test/helpers/postgres-server.ts): the state and request logs there, with --database-url instead of --db. */
  databaseUrl?: string;
}

export async function startControlPlane(opts: ControlPlaneOptions = {}): Promise<ControlPlane> {
  const dir = opts.dir ?? tempDir();
  const secrets = opts.secrets ?? newSecrets();
  const dbPath = join(dir, 'tollgate.db');
  let configPath = opts.configPath;
  if (opts.configYaml !== undefined) {
    configPath = join(dir, 'gateway.yaml');
    writeFileSync(configPath, opts.configYaml);
  }
  // TOLLGATE_TEST_STORE=postgres: every control plane on PostgreSQL (test/helpers/postgres-server.ts).
  const databaseUrl = opts.databaseUrl ?? (await testDatabaseFor(dir));
  const store = databaseUrl ? ['--database-url', databaseUrl] : ['--db', dbPath];
  const args = ['control-plane/main.ts', ...store, '--listen', opts.listen ?? '127.0.0.1:0'];
  if (configPath) args.push('--config', configPath);
  if (opts.adminListen) args.push('--admin-listen', '127.0.0.1:0');
  args.push(...(opts.extraArgs ?? []));
  const proc = startProcess(args, {
    TOLLGATE_PEPPER: secrets.pepper,
    TOLLGATE_OPERATOR_TOKEN: secrets.operatorToken,
    TOLLGATE_NODE_TOKEN: secrets.nodeToken,
    ...opts.env,
  }, { nodeArgs: opts.nodeArgs });
  const m = await proc.waitFor(/control plane listening on (\S+)/);
  const adminUrl = opts.adminListen ? `http://${(await proc.waitFor(/control plane admin listening on (\S+)/))[1]}` : undefined;
  return { proc, address: m[1], dbPath, dir, secrets, configPath, adminUrl };
}

export interface DataPlane {
  proc: Proc;
  url: string;
  address: string;
  adminUrl?: string;
}

export interface DataPlaneOptions {
  nodeId?: string;
  /** HOST:PORT to listen on (default 127.0.0.1:0); `[::]:0` listens dual-stack. */
  listen?: string;
  adminListen?: boolean;
  env?: Record<string, string | undefined>;
  extraArgs?: string[];
  /** Wait for `data plane ready` (default true). */
  waitReady?: boolean;
  /** Flags for node itself (e.g. --cpu-prof in benchmarks). */
  nodeArgs?: string[];
}

export async function startDataPlane(cp: { address: string; secrets: Secrets }, opts: DataPlaneOptions = {}): Promise<DataPlane> {
  const args = ['data-plane/main.ts', '--control-plane', cp.address, '--listen', opts.listen ?? '127.0.0.1:0'];
  if (opts.nodeId) args.push('--node-id', opts.nodeId);
  if (opts.adminListen) args.push('--admin-listen', '127.0.0.1:0');
  args.push(...(opts.extraArgs ?? []));
  const proc = startProcess(
    args,
    {
      ...NODE_MEMORY_ENV,
      TOLLGATE_PEPPER: cp.secrets.pepper,
      TOLLGATE_NODE_TOKEN: cp.secrets.nodeToken,
      ...opts.env,
    },
    // As every launcher starts a node: with its heap flags (later flags win).
    { nodeArgs: [...NODE_HEAP_FLAGS, ...(opts.nodeArgs ?? [])] },
  );
  const m = await proc.waitFor(/data plane listening on (\S+)/);
  let adminUrl: string | undefined;
  if (opts.adminListen) adminUrl = `http://${(await proc.waitFor(/data plane admin listening on (\S+)/))[1]}`;
  if (opts.waitReady !== false) await proc.waitFor(/data plane ready/);
  return { proc, url: `http://${m[1]}`, address: m[1], adminUrl };
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs a command to its end without blocking the event loop (in-process fakes keep answering while it
 * runs), collecting its output. Killed with SIGKILL after `timeoutMs` (code -1 then). `input` is
 * written to its stdin, which is then closed; without it stdin is /dev/null.
 */
export function runProcessAsync(
  command: string,
  args: readonly string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number; input?: string } = {},
): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: opts.cwd ?? ROOT, env: opts.env ?? process.env, stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout!.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr!.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    if (child.stdin) {
      // A child that exits without reading its input must not fail the run.
      child.stdin.on('error', () => undefined);
      child.stdin.end(opts.input);
    }
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    // 'close' (not 'exit'): the output pipes are drained by then.
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
  });
}

/**
 * Runs the CLI as a process without blocking the event loop (the one CLI runner of the tests: a
 * blocking one would stop in-process fakes from answering while it runs). Killed after `timeoutMs`
 * (code -1 then).
 */
export function runCliAsync(
  cp: { address: string },
  token: string | undefined,
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 60_000,
): Promise<CliResult> {
  const full = ['--control-plane', cp.address, ...(token !== undefined ? ['--token', token] : []), ...args];
  return runProcessAsync(process.execPath, [...scriptArgs('cli/main.ts'), ...full], {
    env: { ...process.env, TOLLGATE_TOKEN: '', TOLLGATE_CONTROL_PLANE: '', ...env },
    timeoutMs,
  });
}

/** Runs the CLI with --json without blocking and parses its one JSON object; throws with the output on failure. */
export async function cliJsonAsync<T = any>(cp: { address: string }, token: string, args: string[], env: Record<string, string> = {}): Promise<T> {
  const r = await runCliAsync(cp, token, ['--json', ...args], env);
  if (r.code !== 0) throw new Error(`tollgate ${args.join(' ')} failed (${r.code}): ${r.stderr}${r.stdout}`);
  return JSON.parse(r.stdout) as T;
}
