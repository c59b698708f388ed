// `npm start`: the embedded default. Starts a control plane on 127.0.0.1:50051 with ./data/tollgate.db
// and one data-plane node on 127.0.0.1:8080, both with the shipped demo config (the built-in `demo`
// provider answers locally: no network needed). Secrets it needs are kept in files, generated once
// with mode 0600: the pepper in ./secrets (never beside the database, so a backup of ./data does not
// hold both), the node and operator tokens in ./data. The files win over the environment: a
// TOLLGATE_* variable that differs from its file is ignored with a warning (the database's keys were
// hashed with the file's pepper). On a database with no organisation yet it creates a demo account,
// organisation, project and key, and prints the key once with a curl line. SIGINT or SIGTERM stops
// every child; so does this process dying any other way (each child watches a pipe from it).
// It also starts the demo tool backends (cli/demo-backends/) on free loopback ports and gives the
// control plane the demo config with those backends filled in (<data-dir>/gateway-config.yaml,
// rewritten at every start), so every tool family answers offline.
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { parseArgs } from 'node:util';
import { bootstrapDemo, checkFree, Launcher, launcherWithSecrets, shown, splitHostPort, waitForLine } from './local-run.js';
import { NODE_HEAP_FLAGS, NODE_MEMORY_ENV } from '../data-plane/heap-flags.js';

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

const dataDir = resolve(args['data-dir'] ?? 'data');
const secretsDir = resolve(args['secrets-dir'] ?? 'secrets');
const cpAddress = args['control-plane-listen'] ?? (process.env.TOLLGATE_CONTROL_PLANE_LISTEN || '127.0.0.1:50051');
const dpAddress = args.listen ?? (process.env.TOLLGATE_DATA_PLANE_LISTEN || '127.0.0.1:8080');
for (const [flag, value] of [['--listen', dpAddress], ['--control-plane-listen', cpAddress]]) {
  if (!splitHostPort(value)) usageExit(`${flag} must be HOST:PORT, got ${JSON.stringify(value)}`);
}

let launcher: Launcher | undefined;

/** The shipped demo config with the demo tool backends as every tool family's backend. */
function writeDemoConfig(mcpUrl: string, toolsUrl: string): string {
  const doc = parseYaml(readFileSync(join(import.meta.dirname, '..', 'control-plane', 'demo-config.yaml'), 'utf8')) as Record<string, unknown>;
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
  await checkFree(cpAddress, '--control-plane-listen', "the control plane's gRPC port");
  await checkFree(dpAddress, '--listen', "the node's API port");
  // Secret files are created or read only once the ports are known to be free.
  const started = launcherWithSecrets(dataDir, secretsDir);
  launcher = started.launcher;
  const secrets = started.secrets;
  const demo = launcher.launch('demo-backends', ['cli/demo-backends/main.ts']);
  const [mcpUrl, toolsUrl] = await Promise.all([
    waitForLine(demo, /demo backend mcp listening on (\S+)/).then((m) => m[1]),
    waitForLine(demo, /demo backend tools listening on (\S+)/).then((m) => m[1]),
  ]);
  const configPath = writeDemoConfig(mcpUrl, toolsUrl);
  const cp = launcher.launch('control-plane', ['control-plane/main.ts', '--db', join(dataDir, 'tollgate.db'), '--listen', cpAddress, '--config', configPath], { stopLast: true });
  await waitForLine(cp, /control plane listening on /);
  // The node journals its unacknowledged usage and request logs under data/node (replayed after a crash).
  const dp = launcher.launch('data-plane', ['data-plane/main.ts', '--control-plane', cpAddress, '--listen', dpAddress, '--node-id', 'embedded', '--data-dir', join(dataDir, 'node')], { nodeArgs: NODE_HEAP_FLAGS, envDefaults: NODE_MEMORY_ENV });
  await waitForLine(dp, /data plane ready/);
  await bootstrapDemo(cpAddress, secrets, `http://${dpAddress}`);
  console.log(`Tollgate is running: API on http://${dpAddress}/v1, control plane on ${cpAddress}, demo tool backends behind /v1/mcp, /v1/files, /v1/pdf, … Ctrl-C stops all.`);
  console.log(`The CLI: export TOLLGATE_TOKEN="$(cat ${shown(secrets.operatorTokenPath)})"; npx tollgate --control-plane ${cpAddress} nodes list`);
}

main().catch((err: Error) => {
  console.error(`npm start failed: ${err.message}`);
  if (launcher) launcher.stop(1);
  else process.exit(1);
});
