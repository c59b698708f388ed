// TLS between the control plane and its clients: with --tls-cert/--tls-key/--tls-ca the control
// plane serves TLS and requires a client certificate signed by its CA. A node that trusts another CA,
// presents no certificate, or speaks plaintext never syncs; the CLI works over TLS (flags or env).
// A node sending its token in plaintext to a non-loopback address warns. Certificates are the
// TEST-ONLY ones under test/fixtures/tls.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, request } from '../helpers/http.js';
import { ROOT, runCliAsync, startControlPlane, startDataPlane, stopAll } from '../helpers/processes.js';

after(stopAll);

const certs = join(ROOT, 'test', 'fixtures', 'tls');
const file = (name: string) => join(certs, name);
const nodeTls = ['--tls-ca', file('ca.crt'), '--tls-cert', file('client.crt'), '--tls-key', file('client.key')];
const cliTlsEnv = { TOLLGATE_TLS_CA: file('ca.crt'), TOLLGATE_TLS_CERT: file('client.crt'), TOLLGATE_TLS_KEY: file('client.key') };

test('mutual TLS: a node with the right certificates syncs and serves; wrong CA, no certificate or plaintext cannot sync; the CLI works over TLS', async () => {
  const cp = await startControlPlane({ extraArgs: ['--tls-cert', file('server.crt'), '--tls-key', file('server.key'), '--tls-ca', file('ca.crt')] });
  assert.match(cp.proc.output(), /control plane listening on \S+ \(TLS, client certificates required\)/);
  const token = cp.secrets.operatorToken;

  const good = await startDataPlane(cp, { nodeId: 'good', extraArgs: nodeTls });

  const wrongCa = await startDataPlane(cp, {
    nodeId: 'wrong-ca',
    waitReady: false,
    extraArgs: ['--tls-ca', file('other-ca.crt'), '--tls-cert', file('other-client.crt'), '--tls-key', file('other-client.key')],
  });
  const noClientCert = await startDataPlane(cp, { nodeId: 'no-client-cert', waitReady: false, extraArgs: ['--tls-ca', file('ca.crt')] });
  const plaintext = await startDataPlane(cp, { nodeId: 'plaintext', waitReady: false });
  for (const node of [wrongCa, noClientCert, plaintext]) {
    await node.proc.waitFor(/control plane connection lost \(UNAVAILABLE/);
    assert.doesNotMatch(node.proc.output(), /data plane ready/);
  }

  // The CLI over TLS: flags on the command line.
  const flags = ['--tls-ca', file('ca.crt'), '--tls-cert', file('client.crt'), '--tls-key', file('client.key')];
  const nodes = await runCliAsync(cp, token, [...flags, '--json', 'nodes', 'list']);
  assert.equal(nodes.code, 0, nodes.stderr);
  const listed = JSON.parse(nodes.stdout) as { nodes: { id: string; connected: boolean }[] };
  assert.deepEqual(listed.nodes.map((n) => [n.id, n.connected]), [['good', true]]);

  // ... and from the environment: a key made over TLS authenticates on the node that synced.
  const acct = await runCliAsync(cp, token, ['--json', 'account', 'create', '--name', 'tls'], cliTlsEnv);
  assert.equal(acct.code, 0, acct.stderr);
  const accountId = JSON.parse(acct.stdout).id as string;
  const org = JSON.parse((await runCliAsync(cp, token, ['--json', 'org', 'create', '--name', 'tls', '--owner', accountId, '--tier', 'free'], cliTlsEnv)).stdout).id as string;
  const project = JSON.parse((await runCliAsync(cp, token, ['--json', 'project', 'create', '--org', org, '--name', 'p'], cliTlsEnv)).stdout).id as string;
  const created = await runCliAsync(cp, token, ['--json', 'key', 'create', '--project', project], cliTlsEnv);
  assert.equal(created.code, 0, created.stderr);
  const key = JSON.parse(created.stdout).key as string;
  await waitUntilKnown(good.url, key);
  assert.equal((await request(`${good.url}/v1/models`, { headers: bearer(key) })).status, 200);
  // GET /v1/usage asks the control plane too: over the same TLS, with the node's certificate.
  const usage = await request(`${good.url}/v1/usage`, { headers: bearer(key) });
  assert.equal(usage.status, 200, usage.text);

  // Plaintext, or TLS without a client certificate, does not reach the console either.
  const plain = await runCliAsync(cp, token, ['whoami']);
  assert.equal(plain.code, 1);
  assert.match(plain.stderr, /^503 control plane unreachable/);
  const noCert = await runCliAsync(cp, token, ['--tls-ca', file('ca.crt'), 'whoami']);
  assert.equal(noCert.code, 1);
  assert.match(noCert.stderr, /^503 control plane unreachable/);
  // A TLS file that is not there is a bad argument, named.
  const missing = await runCliAsync(cp, token, ['--tls-ca', file('nope.crt'), 'whoami']);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /^400 --tls-ca: cannot read .*nope\.crt: ENOENT/);
});

test('TLS without client certificates: a node trusting the CA syncs with no certificate of its own', async () => {
  const cp = await startControlPlane({ extraArgs: ['--tls-cert', file('server.crt'), '--tls-key', file('server.key')] });
  assert.match(cp.proc.output(), /control plane listening on \S+ \(TLS\)/);
  await startDataPlane(cp, { nodeId: 'ca-only', extraArgs: ['--tls-ca', file('ca.crt')] });
  const who = await runCliAsync(cp, cp.secrets.operatorToken, ['--tls-ca', file('ca.crt'), '--json', 'nodes', 'list']);
  assert.equal(who.code, 0, who.stderr);
  assert.equal((JSON.parse(who.stdout) as { nodes: unknown[] }).nodes.length, 1);
});

test('a node token sent in plaintext to a non-loopback address is warned about; --tls-ca alone needs the pair on the control plane', async () => {
  // 192.0.2.1 is TEST-NET-1: never routed, so the node only tries.
  const node = await startDataPlane(
    { address: '192.0.2.1:50051', secrets: { pepper: 'p'.repeat(64), nodeToken: 'node_x', operatorToken: '' } },
    { waitReady: false },
  );
  await node.proc.waitFor(/warning: the node token goes in plaintext to 192\.0\.2\.1:50051; use --tls-ca/);
  await node.proc.kill('SIGKILL');
  // The CLI warns the same about its token (0.0.0.0 is not loopback by name; port 1 refuses at once).
  const cli = await runCliAsync({ address: '0.0.0.0:1' }, 'op_some_token', ['whoami']);
  assert.match(cli.stderr, /^warning: the token goes in plaintext to 0\.0\.0\.0:1; pass --tls-ca/);
  assert.match(cli.stderr, /503 control plane unreachable at 0\.0\.0\.0:1/);
  const local = await runCliAsync({ address: '127.0.0.1:1' }, 'op_some_token', ['whoami']);
  assert.doesNotMatch(local.stderr, /plaintext/);

  await assert.rejects(startControlPlane({ extraArgs: ['--tls-ca', file('ca.crt')] }), /--tls-ca needs --tls-cert and --tls-key/);
  await assert.rejects(startControlPlane({ extraArgs: ['--tls-cert', file('server.crt')] }), /--tls-cert and --tls-key must be given together/);
});
