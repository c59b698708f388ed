// `npm start`: the embedded default. Starts a control plane on 127.0.0.1:50051 with ./data/tollgate.db
// and one data-plane node on 127.0.0.1:8080, both with the shipped demo config (the built-in `demo`
// provider answers locally: no network needed). Secrets it needs and nobody gave it are generated
// once into ./data with mode 0600. On a database with no organisation yet it creates a demo account,
// organisation, project and key, and prints the key once with a curl line. Ctrl-C stops both.
// It also starts the demo tool backends (cli/demo-backends/) on free loopback ports and gives the
// control plane the demo config with those backends filled in (./data/gateway-config.yaml, rewritten
// at every start), so every tool family answers offline.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { ConsoleClient } from './console-client.js';

const root = fileURLToPath(new URL('..', import.meta.url));
// tsx loaded in-process (`node --import`), so a signal to a child reaches the program itself.
const tsxLoader = pathToFileURL(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const dataDir = join(process.cwd(), 'data');
const cpAddress = process.env.TOLLGATE_CONTROL_PLANE_LISTEN ?? '127.0.0.1:50051';
const dpAddress = process.env.TOLLGATE_DATA_PLANE_LISTEN ?? '127.0.0.1:8080';

/** Reads a secret from the environment, else from ./data/NAME, else generates it there (0600). */
function secret(envName: string, file: string, make: () => string): { value: string; created: boolean } {
  const fromEnv = process.env[envName];
  if (fromEnv) return { value: fromEnv, created: false };
  const path = join(dataDir, file);
  if (existsSync(path)) return { value: readFileSync(path, 'utf8').trim(), created: false };
  const value = make();
  writeFileSync(path, `${value}\n`, { mode: 0o600 });
  return { value, created: true };
}

mkdirSync(dataDir, { recursive: true, mode: 0o700 });
const pepper = secret('TOLLGATE_PEPPER', 'pepper', () => randomBytes(32).toString('hex'));
const nodeToken = secret('TOLLGATE_NODE_TOKEN', 'node-token', () => `node_${randomBytes(32).toString('base64url')}`);
const operator = secret('TOLLGATE_OPERATOR_TOKEN', 'operator-token', () => `op_${randomBytes(32).toString('base64url')}`);
const env = {
  ...process.env,
  TOLLGATE_PEPPER: pepper.value,
  TOLLGATE_NODE_TOKEN: nodeToken.value,
  TOLLGATE_OPERATOR_TOKEN: operator.value,
};

const children: ChildProcess[] = [];
let stopping = false;

function launch(label: string, args: string[], onLine: (line: string) => void): ChildProcess {
  const child = spawn(process.execPath, ['--import', tsxLoader, ...args], { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] });
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

function waitForLine(child: ChildProcess, re: RegExp): Promise<RegExpMatchArray> {
  return new Promise((resolve, reject) => {
    const lines = [child.stdout!, child.stderr!].map((s) => createInterface({ input: s }));
    for (const rl of lines)
      rl.on('line', (line) => {
        const m = line.match(re);
        if (m) resolve(m);
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
      console.log(`Make a new one with: npm run -s cli -- --token "$(cat data/operator-token)" key create --project <PROJECT_ID>`);
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

/** The shipped demo config with the demo tool backends as every tool family's backend. */
function writeDemoConfig(mcpUrl: string, toolsUrl: string): string {
  const doc = parseYaml(readFileSync(join(root, 'control-plane', 'demo-config.yaml'), 'utf8')) as Record<string, unknown>;
  const timeouts = { connect_timeout_ms: 2000, header_timeout_ms: 30000, idle_timeout_ms: 60000 };
  doc.tool_backends = [
    // An MCP client keeps a GET event stream open for server messages, quiet for long stretches.
    { prefix: '/v1/mcp', base_urls: [mcpUrl], ...timeouts, idle_timeout_ms: 600000 },
    ...['/v1/files', '/v1/pdf', '/v1/skills', '/v1/vector_stores', '/v1/sandbox', '/v1/route'].map((prefix) => ({ prefix, base_urls: [toolsUrl], ...timeouts })),
  ];
  const path = join(dataDir, 'gateway-config.yaml');
  const header = '# Written by `npm start` at every start: control-plane/demo-config.yaml with the demo tool backends\n# it started on free loopback ports. Edit control-plane/demo-config.yaml instead.\n';
  writeFileSync(path, header + stringifyYaml(doc));
  return path;
}

async function main(): Promise<void> {
  if (operator.created) console.log(`Operator token (saved to data/operator-token): ${operator.value}`);
  const demo = launch('demo-backends', ['cli/demo-backends/main.ts'], () => {});
  const [mcpUrl, toolsUrl] = await Promise.all([
    waitForLine(demo, /demo backend mcp listening on (\S+)/).then((m) => m[1]),
    waitForLine(demo, /demo backend tools listening on (\S+)/).then((m) => m[1]),
  ]);
  const configPath = writeDemoConfig(mcpUrl, toolsUrl);
  const cp = launch('control-plane', ['control-plane/main.ts', '--db', join(dataDir, 'tollgate.db'), '--listen', cpAddress, '--config', configPath], () => {});
  await waitForLine(cp, /control plane listening on /);
  const dp = launch('data-plane', ['data-plane/main.ts', '--control-plane', cpAddress, '--listen', dpAddress, '--node-id', 'embedded'], () => {});
  await waitForLine(dp, /data plane ready/);
  await bootstrapDemo();
  console.log(`Tollgate is running: API on http://${dpAddress}/v1, control plane on ${cpAddress}, demo tool backends behind /v1/mcp, /v1/files, /v1/pdf, … Ctrl-C stops all.`);
}

main().catch((err: Error) => {
  console.error(`npm start failed: ${err.message}`);
  stop(1);
});
