// `npm start`: the embedded default. Starts a control plane on 127.0.0.1:50051 with ./data/tollgate.db
// and one data-plane node on 127.0.0.1:8080, both with the shipped demo config (the built-in `demo`
// provider answers locally: no network needed). Secrets it needs are kept in files, generated once
// with mode 0600: the pepper in ./secrets (never beside the database, so a backup of ./data does not
// hold both), the node and operator tokens in ./data. The files win over the environment: a
// TOLLGATE_* variable that differs from its file is ignored with a warning (the database's keys were
// hashed with the file's pepper). On a database with no organisation yet it creates a demo account,
// organisation, project and key, and prints the key once with a curl line. SIGINT or SIGTERM stops
// every child; so does this process dying any other way (each child watches a pipe from it).
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, relative, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { ConsoleClient } from './console-client.js';

const USAGE = `Usage: npm start [-- OPTIONS]   (npm's own --help hides ours: write npm start -- --help)

Starts a control plane and one data-plane node with the shipped demo config.

Options:
  --listen HOST:PORT                the node's HTTP API (default 127.0.0.1:8080; env TOLLGATE_DATA_PLANE_LISTEN)
  --control-plane-listen HOST:PORT  the control plane's gRPC (default 127.0.0.1:50051; env TOLLGATE_CONTROL_PLANE_LISTEN)
  --data-dir DIR                    database, node token and operator token (default ./data)
  --secrets-dir DIR                 the key pepper, kept apart from the database (default ./secrets)
  -h, --help                        this help

Secrets come from the files; TOLLGATE_PEPPER, TOLLGATE_NODE_TOKEN and TOLLGATE_OPERATOR_TOKEN are used
only to create a file that does not exist yet, and are ignored with a warning when they differ from it.
`;

function usageExit(line: string): never {
  console.error(`npm start: ${line}\n\n${USAGE}`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({
    options: {
      listen: { type: 'string' },
      'control-plane-listen': { type: 'string' },
      'data-dir': { type: 'string' },
      'secrets-dir': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  }).values;
} catch (err) {
  usageExit((err as Error).message.split('. ')[0]);
}
if (args.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}

const root = fileURLToPath(new URL('..', import.meta.url));
// tsx loaded in-process (`node --import`), so a signal to a child reaches the program itself.
const tsxLoader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const exitWithParent = pathToFileURL(join(root, 'cli', 'exit-with-parent.mjs')).href;
const dataDir = resolve(args['data-dir'] ?? 'data');
const secretsDir = resolve(args['secrets-dir'] ?? 'secrets');
const cpAddress = args['control-plane-listen'] ?? (process.env.TOLLGATE_CONTROL_PLANE_LISTEN || '127.0.0.1:50051');
const dpAddress = args.listen ?? (process.env.TOLLGATE_DATA_PLANE_LISTEN || '127.0.0.1:8080');
for (const [flag, value] of [['--listen', dpAddress], ['--control-plane-listen', cpAddress]]) {
  if (!/^.+:\d{1,5}$/.test(value) || Number(value.slice(value.lastIndexOf(':') + 1)) > 65535) usageExit(`${flag} must be HOST:PORT, got ${JSON.stringify(value)}`);
}
const shown = (path: string) => relative(process.cwd(), path) || path;

/**
 * The secret in `dir/file`. The file wins: an environment variable only seeds a file that does not
 * exist yet, and one that differs from the file is reported and ignored.
 */
function secret(envName: string, dir: string, file: string, make: () => string): { value: string; created: boolean } {
  const path = join(dir, file);
  const fromEnv = process.env[envName] || undefined;
  if (existsSync(path)) {
    const value = readFileSync(path, 'utf8').trim();
    if (fromEnv !== undefined && fromEnv !== value) {
      console.error(`warning: ${envName} is set but differs from ${shown(path)}; npm start uses the file (unset ${envName} to silence this)`);
    }
    return { value, created: false };
  }
  const value = fromEnv ?? make();
  writeFileSync(path, `${value}\n`, { mode: 0o600 });
  if (fromEnv !== undefined) console.log(`${shown(path)} created from ${envName}`);
  return { value, created: fromEnv === undefined };
}

mkdirSync(dataDir, { recursive: true, mode: 0o700 });
mkdirSync(secretsDir, { recursive: true, mode: 0o700 });
// Before secrets/ existed the pepper was kept in data/: move it out, so backups of data/ lack it.
const oldPepper = join(dataDir, 'pepper');
if (existsSync(oldPepper) && !existsSync(join(secretsDir, 'pepper'))) {
  copyFileSync(oldPepper, join(secretsDir, 'pepper'));
  unlinkSync(oldPepper);
  console.log(`moved the key pepper from ${shown(oldPepper)} to ${shown(join(secretsDir, 'pepper'))}, away from the database`);
}
const pepper = secret('TOLLGATE_PEPPER', secretsDir, 'pepper', () => randomBytes(32).toString('hex'));
const nodeToken = secret('TOLLGATE_NODE_TOKEN', dataDir, 'node-token', () => `node_${randomBytes(32).toString('base64url')}`);
const operator = secret('TOLLGATE_OPERATOR_TOKEN', dataDir, 'operator-token', () => `op_${randomBytes(32).toString('base64url')}`);
const env = {
  ...process.env,
  TOLLGATE_PEPPER: pepper.value,
  TOLLGATE_NODE_TOKEN: nodeToken.value,
  TOLLGATE_OPERATOR_TOKEN: operator.value,
};

/** Fails when HOST:PORT cannot be bound, naming the flag that changes it. */
function checkFree(address: string, flag: string, what: string): Promise<void> {
  const host = address.slice(0, address.lastIndexOf(':')).replace(/^\[(.*)\]$/, '$1');
  const port = Number(address.slice(address.lastIndexOf(':') + 1));
  return new Promise((resolveFree, reject) => {
    const srv = createServer();
    srv.once('error', (err: NodeJS.ErrnoException) => {
      const why = err.code === 'EADDRINUSE' ? 'is already in use' : `cannot be used (${err.code ?? err.message})`;
      reject(new Error(`${address} (${what}) ${why}; choose another with ${flag} HOST:PORT`));
    });
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => resolveFree()));
  });
}

const children: ChildProcess[] = [];
let stopping = false;

function launch(label: string, args: string[], onLine: (line: string) => void): ChildProcess {
  // stdin is a pipe from this process: when it closes (this process gone, however), the child stops.
  const child = spawn(process.execPath, ['--import', tsxLoader, '--import', exitWithParent, ...args], { cwd: root, env, stdio: ['pipe', 'pipe', 'pipe'] });
  for (const stream of [child.stdout!, child.stderr!]) {
    createInterface({ input: stream }).on('line', (line) => {
      console.log(`[${label}] ${line}`);
      onLine(line);
    });
  }
  child.on('exit', (code, signal) => {
    if (!stopping) {
      console.error(`${label} exited (${signal ?? code}); stopping`);
      stop(1);
    }
  });
  children.push(child);
  return child;
}

function stop(code: number): void {
  if (stopping) return;
  stopping = true;
  let left = children.filter((c) => c.exitCode === null && c.signalCode === null);
  if (left.length === 0) process.exit(code);
  for (const c of left) {
    c.once('exit', () => {
      left = left.filter((x) => x !== c);
      if (left.length === 0) process.exit(code);
    });
    c.kill('SIGTERM');
  }
  setTimeout(() => {
    for (const c of left) c.kill('SIGKILL');
    process.exit(code);
  }, 5000).unref();
}

process.on('SIGINT', () => stop(0));
process.on('SIGTERM', () => stop(0));
process.on('SIGHUP', () => stop(0));
// npm killed without passing the signal on: this process is re-parented, and stops too.
const parentPid = process.ppid;
setInterval(() => {
  if (process.ppid !== parentPid) stop(0);
}, 500).unref();

function waitForLine(child: ChildProcess, re: RegExp): Promise<void> {
  return new Promise((resolve, reject) => {
    const lines = [child.stdout!, child.stderr!].map((s) => createInterface({ input: s }));
    for (const rl of lines)
      rl.on('line', (line) => {
        if (re.test(line)) resolve();
      });
    child.once('exit', () => reject(new Error(`process exited before printing ${re}`)));
  });
}

async function bootstrapDemo(): Promise<void> {
  const client = new ConsoleClient(cpAddress, operator.value);
  try {
    const orgs = await client.listOrgs();
    if (orgs.orgs.length > 0) {
      console.log('Existing database: no demo key created (keys are shown only once, at creation).');
      console.log(`Make a new one with: npx tollgate --control-plane ${cpAddress} --token "$(cat ${shown(join(dataDir, 'operator-token'))})" key create --project <PROJECT_ID>`);
      return;
    }
    const { account } = await client.createAccount({ name: 'demo' });
    const org = await client.createOrg({ name: 'demo', ownerAccountId: account!.id, tier: 'free' });
    const project = await client.createProject({ orgId: org.id, name: 'demo' });
    const created = await client.createKey({ projectId: project.id, name: 'demo', allowedModels: [] });
    console.log('');
    console.log(`Demo organisation ${org.id} (free tier), project ${project.id}.`);
    console.log('Your API key (shown once, never again):');
    console.log(`  ${created.key}`);
    console.log('Try it:');
    console.log(
      `  curl -s http://${dpAddress}/v1/chat/completions -H "Authorization: Bearer ${created.key}" ` +
        `-H "Content-Type: application/json" -d '{"model":"demo-chat","messages":[{"role":"user","content":"Hello"}]}'`,
    );
    console.log('');
  } finally {
    client.close();
  }
}

async function main(): Promise<void> {
  await checkFree(cpAddress, '--control-plane-listen', "the control plane's gRPC port");
  await checkFree(dpAddress, '--listen', "the node's API port");
  if (operator.created) console.log(`Operator token (saved to ${shown(join(dataDir, 'operator-token'))}): ${operator.value}`);
  const cp = launch('control-plane', ['control-plane/main.ts', '--db', join(dataDir, 'tollgate.db'), '--listen', cpAddress], () => {});
  await waitForLine(cp, /control plane listening on /);
  const dp = launch('data-plane', ['data-plane/main.ts', '--control-plane', cpAddress, '--listen', dpAddress, '--node-id', 'embedded'], () => {});
  await waitForLine(dp, /data plane ready/);
  await bootstrapDemo();
  console.log(`Tollgate is running: API on http://${dpAddress}/v1, control plane on ${cpAddress}. Ctrl-C stops both.`);
  console.log(`The CLI: export TOLLGATE_TOKEN="$(cat ${shown(join(dataDir, 'operator-token'))})"; npx tollgate --control-plane ${cpAddress} nodes list`);
}

main().catch((err: Error) => {
  console.error(`npm start failed: ${err.message}`);
  stop(1);
});
