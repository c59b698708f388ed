// `npm run cluster`: several nodes on one machine with the real programs — a control plane, N
// data-plane nodes (default 3) and a load balancer in front of them (cli/load-balancer.ts: round
// robin, X-Forwarded-For, skips a node that is down). Without --config it writes a copy of the demo
// config whose trusted_proxies name the load balancer (loopback), so nodes count each client's own
// address. Secrets as with `npm start`: the pepper in ./secrets, tokens and database in
// ./data-cluster. A node that exits is reported and left out; the control plane exiting, SIGINT or
// SIGTERM stops everything.
import { writeFileSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { startLoadBalancer } from './load-balancer.js';
import { bootstrapDemo, checkFree, Launcher, launcherWithSecrets, ROOT, shown, splitHostPort, waitForLine } from './local-run.js';
import { NODE_HEAP_FLAGS, NODE_MEMORY_ENV } from '../data-plane/heap-flags.js';

const USAGE = `Usage: npm run cluster [-- OPTIONS]

Starts a control plane, several data-plane nodes and a load balancer in front of them, on this machine.

Options:
  --nodes N                         how many nodes (default 3)
  --listen HOST:PORT                the load balancer: the API clients call (default 127.0.0.1:8080)
  --control-plane-listen HOST:PORT  the control plane's gRPC (default 127.0.0.1:50051)
  --config FILE                     gateway config (default: the demo config with trusted_proxies set
                                    to the load balancer, written to DATA_DIR/cluster-gateway.yaml)
  --data-dir DIR                    database, node token and operator token (default ./data-cluster)
  --secrets-dir DIR                 the key pepper, kept apart from the database (default ./secrets)
  -h, --help                        this help

Nodes listen on free loopback ports (printed), with an admin listener each (/healthz, /readyz).
`;

function usageExit(line: string): never {
  console.error(`npm run cluster: ${line}\n\n${USAGE}`);
  process.exit(2);
}

function parseCli() {
  try {
    return parseArgs({
    options: {
      nodes: { type: 'string' },
      listen: { type: 'string' },
      'control-plane-listen': { type: 'string' },
      config: { type: 'string' },
      'data-dir': { type: 'string' },
      'secrets-dir': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  }).values;
  } catch (err) {
    usageExit((err as Error).message.split('. ')[0]);
  }
}
const args = parseCli();
if (args.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}

const nodeCount = Number(args.nodes ?? '3');
if (!Number.isInteger(nodeCount) || nodeCount < 1 || nodeCount > 32) usageExit(`--nodes must be a whole number from 1 to 32, got ${JSON.stringify(args.nodes)}`);
const lbAddress = args.listen ?? '127.0.0.1:8080';
const cpListen = args['control-plane-listen'] ?? '127.0.0.1:50051';
for (const [flag, value] of [['--listen', lbAddress], ['--control-plane-listen', cpListen]]) {
  if (!splitHostPort(value)) usageExit(`${flag} must be HOST:PORT, got ${JSON.stringify(value)}`);
}
const dataDir = resolve(args['data-dir'] ?? 'data-cluster');
const secretsDir = resolve(args['secrets-dir'] ?? 'secrets');

let launcher: Launcher | undefined;

/** The demo config, with the load balancer (loopback) as the one trusted proxy. */
function clusterConfig(): string {
  const cfg = parseYaml(readFileSync(join(ROOT, 'control-plane', 'demo-config.yaml'), 'utf8')) as Record<string, unknown>;
  cfg.trusted_proxies = ['127.0.0.1/32', '::1/128'];
  const path = join(dataDir, 'cluster-gateway.yaml');
  writeFileSync(path, `# Written by npm run cluster: the demo config, trusting the local load balancer's X-Forwarded-For.\n${stringifyYaml(cfg)}`);
  return path;
}

async function main(): Promise<void> {
  await checkFree(cpListen, '--control-plane-listen', "the control plane's gRPC port");
  await checkFree(lbAddress, '--listen', "the load balancer's port");
  // Secret files are created or read only once the ports are known to be free.
  const started = launcherWithSecrets(dataDir, secretsDir);
  launcher = started.launcher;
  const secrets = started.secrets;
  const configPath = args.config ? resolve(args.config) : clusterConfig();

  const cp = launcher.launch('control-plane', ['control-plane/main.ts', '--db', join(dataDir, 'tollgate.db'), '--listen', cpListen, '--config', configPath], { stopLast: true });
  const cpAddress = (await waitForLine(cp, /control plane listening on (\S+)/))[1];
  console.log(`cluster: control plane on ${cpAddress} (pid ${cp.pid})`);

  const nodes = await Promise.all(
    Array.from({ length: nodeCount }, async (_, i) => {
      const id = `edge-${i + 1}`;
      const child = launcher!.launch(id, ['data-plane/main.ts', '--control-plane', cpAddress, '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0', '--node-id', id], { critical: false, nodeArgs: NODE_HEAP_FLAGS, envDefaults: NODE_MEMORY_ENV });
      const [api, admin] = await Promise.all([waitForLine(child, /data plane listening on (\S+)/), waitForLine(child, /data plane admin listening on (\S+)/)]);
      await waitForLine(child, /data plane ready/);
      console.log(`cluster: node ${id} on ${api[1]}, admin ${admin[1]} (pid ${child.pid})`);
      return api[1];
    }),
  );

  const lb = await startLoadBalancer({ listen: lbAddress, backends: nodes, log: (line) => console.log(`[load-balancer] ${line}`) });
  console.log(`cluster: load balancer on ${lb.address} -> ${nodes.join(', ')}`);
  await bootstrapDemo(cpAddress, secrets, `http://${lb.address}`);
  console.log(`cluster ready: API on http://${lb.address}/v1, control plane on ${cpAddress}, ${nodeCount} node(s). Ctrl-C stops everything.`);
  console.log(`The CLI: export TOLLGATE_TOKEN="$(cat ${shown(secrets.operatorTokenPath)})"; npx tollgate --control-plane ${cpAddress} nodes list`);
}

main().catch((err: Error) => {
  console.error(`npm run cluster failed: ${err.message}`);
  if (launcher) launcher.stop(1);
  else process.exit(1);
});
