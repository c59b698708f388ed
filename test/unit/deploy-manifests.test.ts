// The deployment files are checked by parsing them (no Docker engine or cluster runs in CI): the
// Dockerfile is multi-stage on Node 20; compose.yaml has the control plane, three nodes behind nginx
// with X-Forwarded-For and the nodes' trusted_proxies naming nginx, and the demo backends;
// kubernetes.yaml has the control plane as a StatefulSet with a volume, nodes as a Deployment with
// readiness probes and a PodDisruptionBudget, and every secret from a Secret. The flags the files pass
// are ones the programs accept, and the gateway configs they carry validate.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parse, parseAllDocuments } from 'yaml';
import { loadControlPlaneConfig } from '../../control-plane/config.js';
import { parseGatewayConfig } from '../../control-plane/gateway-config/gateway-config.js';
import { loadConfig } from '../../data-plane/config.js';
import { NODE_HEAP_FLAGS, NODE_MEMORY_ENV } from '../../data-plane/heap-flags.js';
import { ROOT } from '../helpers/processes.js';

const read = (name: string) => readFileSync(join(ROOT, name), 'utf8');

/** The flags are all known: parsing stops only at the first secret file, which is not on this machine. */
function assertControlPlaneArgs(args: string[]): void {
  const db = join(mkdtempSync(join(tmpdir(), 'tollgate-manifest-')), 'tollgate.db');
  const argv = args.slice(1).map((a) => (a.startsWith('--db=') ? `--db=${db}` : a));
  const i = argv.indexOf('--db');
  if (i >= 0) argv[i + 1] = db;
  assert.equal(args[0], 'control-plane/main.ts');
  assert.throws(() => loadControlPlaneConfig(argv, {}), /--pepper-file: cannot read \/(run|etc)\/\S+: ENOENT/);
}

function assertNodeArgs(args: string[]): void {
  assert.equal(args[0], 'data-plane/main.ts');
  const argv = args.slice(1).map((a) => a.replace('$(POD_NAME)', 'tollgate-node-5d9c7-abcde'));
  assert.throws(() => loadConfig(argv, {}), /--pepper-file: cannot read \/(run|etc)\/\S+: ENOENT/);
}

test('Dockerfile: multi-stage on Node 20, saying why', () => {
  const text = read('Dockerfile');
  const froms = [...text.matchAll(/^FROM (\S+)/gm)].map((m) => m[1]);
  assert.equal(froms.length, 2);
  for (const f of froms) assert.match(f, /^node:20-/);
  assert.match(text, /uWebSockets\.js/);
  assert.match(text, /npm ci --omit=dev/);
  assert.match(text, /^USER node$/m);
});

test('compose.yaml: control plane, three nodes behind nginx with X-Forwarded-For, demo backends, secrets from files', () => {
  const doc = parse(read('compose.yaml'), { merge: true });
  const s = doc.services;
  assert.deepEqual(Object.keys(s).sort(), ['control-plane', 'demo-backends', 'load-balancer', 'node-1', 'node-2', 'node-3']);

  assertControlPlaneArgs(s['control-plane'].command);
  assert.ok(s['control-plane'].volumes.some((v: string) => v.endsWith(':/var/lib/tollgate')), 'the database is on a volume');
  for (const [i, name] of ['node-1', 'node-2', 'node-3'].entries()) {
    const n = s[name];
    assertNodeArgs(n.command);
    assert.equal(n.command[n.command.indexOf('--control-plane') + 1], 'control-plane:50051');
    assert.equal(n.command[n.command.indexOf('--node-id') + 1], `edge-${i + 1}`);
    assert.deepEqual(n.secrets, ['tollgate_pepper', 'tollgate_node_token']);
    assert.match(n.healthcheck.test.join(' '), /http:\/\/127\.0\.0\.1:9090\/readyz/);
    assert.equal(n.command[n.command.indexOf('--admin-listen') + 1], '0.0.0.0:9090');
    // The same memory settings as every other way of starting a node.
    assert.deepEqual(n.environment, { NODE_OPTIONS: NODE_HEAP_FLAGS.join(' '), ...NODE_MEMORY_ENV });
  }
  assert.deepEqual(doc.secrets, { tollgate_pepper: { file: './secrets/pepper' }, tollgate_node_token: { file: './secrets/node-token' } });

  // nginx: round robin over the three nodes, X-Forwarded-For appended, streaming both ways.
  const lb = s['load-balancer'];
  assert.match(lb.image, /^nginx:/);
  const nginx = doc.configs.nginx.content.replace(/\$\$/g, '$');
  for (const name of ['node-1', 'node-2', 'node-3']) assert.match(nginx, new RegExp(`server ${name}:8080`));
  assert.match(nginx, /proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;/);
  assert.match(nginx, /proxy_request_buffering off;/);
  assert.match(nginx, /proxy_buffering off;/);
  assert.match(nginx, /client_max_body_size 256m;/);

  // The nodes believe X-Forwarded-For from nginx's fixed address, and only from it.
  const gateway = parseGatewayConfig(parse(doc.configs.gateway.content), {}, () => '');
  assert.deepEqual(gateway.settings.trustedProxies, [`${lb.networks.tollgate.ipv4_address}/32`]);
  const backendUrls = gateway.settings.toolBackends.flatMap((b) => b.baseUrls);
  assert.equal(backendUrls.length, 7);
  for (const u of backendUrls) assert.match(u, /^http:\/\/demo-backends:910[12]$/);
  assert.deepEqual(s['demo-backends'].command, ['cli/demo-backends/main.ts']);
});

test('kubernetes.yaml: StatefulSet with a volume, Deployment with readiness probes and a PodDisruptionBudget, secrets from Secrets', () => {
  const docs = parseAllDocuments(read('kubernetes.yaml')).map((d) => d.toJS());
  const byKind = (kind: string) => docs.filter((d) => d.kind === kind);
  assert.equal(byKind('Secret').length, 0, 'no secret values in the manifests');

  const [sts] = byKind('StatefulSet');
  assert.equal(sts.spec.replicas, 1);
  assert.equal(sts.spec.volumeClaimTemplates[0].metadata.name, 'data');
  const cp = sts.spec.template.spec.containers[0];
  assert.ok(cp.volumeMounts.some((m: { name: string; mountPath: string }) => m.name === 'data' && m.mountPath === '/var/lib/tollgate'));
  assertControlPlaneArgs(cp.args);
  assert.deepEqual(cp.env.find((e: { name: string }) => e.name === 'TOLLGATE_OPERATOR_TOKEN').valueFrom, { secretKeyRef: { name: 'tollgate-secrets', key: 'operator-token' } });
  assert.ok(cp.readinessProbe);

  const [dep] = byKind('Deployment');
  assert.equal(dep.spec.replicas, 3);
  const node = dep.spec.template.spec.containers[0];
  assertNodeArgs(node.args);
  const env = (name: string) => node.env.find((e: { name: string }) => e.name === name)?.value;
  assert.equal(env('NODE_OPTIONS'), NODE_HEAP_FLAGS.join(' '));
  for (const [k, v] of Object.entries(NODE_MEMORY_ENV)) assert.equal(env(k), v);
  assert.deepEqual(node.readinessProbe.httpGet, { path: '/readyz', port: 'admin' });
  assert.deepEqual(node.livenessProbe.httpGet, { path: '/healthz', port: 'admin' });
  assert.ok(node.ports.some((p: { name: string; containerPort: number }) => p.name === 'admin' && p.containerPort === 9090));

  const [pdb] = byKind('PodDisruptionBudget');
  assert.deepEqual(pdb.spec.selector.matchLabels, dep.spec.selector.matchLabels);
  assert.ok(pdb.spec.minAvailable >= 1 && pdb.spec.minAvailable < dep.spec.replicas);

  // Every secret a pod reads is a Secret volume or a secretKeyRef.
  const secretNames = [sts, dep].flatMap((w) => w.spec.template.spec.volumes.filter((v: { secret?: unknown }) => v.secret).map((v: { secret: { secretName: string } }) => v.secret.secretName));
  assert.deepEqual(new Set(secretNames), new Set(['tollgate-secrets', 'tollgate-cp-tls', 'tollgate-node-tls']));
  for (const args of [cp.args, node.args]) {
    for (const a of args.filter((x: string) => /^--(pepper-file|node-token-file|tls-)/.test(x))) assert.match(a, /=\/etc\/tollgate\/(secrets|tls)\//);
  }

  const [cm] = byKind('ConfigMap');
  const gateway = parseGatewayConfig(parse(cm.data['gateway.yaml']), {}, () => '');
  assert.ok(gateway.settings.models.size > 0);
});
