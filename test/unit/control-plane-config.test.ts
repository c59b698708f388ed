// The control plane's process flags (control-plane/config.ts); the gateway config file's schema has
// its own file, control-plane-gateway-config.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadControlPlaneConfig } from '../../control-plane/config.js';
import { DEMO_CONFIG_PATH } from '../../control-plane/gateway-config/gateway-config.js';

test('process flags: bad values name the setting', () => {
  const env = { TOLLGATE_PEPPER: 'p'.repeat(32), TOLLGATE_OPERATOR_TOKEN: 'op_x'.repeat(5), TOLLGATE_NODE_TOKEN: 'node_x'.repeat(5) };
  const cases: [string[], Record<string, string>, RegExp][] = [
    [['--listen', '127.0.0.1:0'], env, /--db is required/],
    [['--db', '/tmp/tollgate-cfg-test/x.db'], env, /--listen is required/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', 'nope'], env, /--listen must be HOST:PORT/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0', '--bogus', '1'], env, /unknown argument "--bogus"/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0', '--revoke-ack-timeout-ms', 'soon'], env, /--revoke-ack-timeout-ms must be/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0'], { ...env, TOLLGATE_PEPPER: 'short' }, /key pepper too short/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0'], { ...env, TOLLGATE_PEPPER: '' }, /no key pepper/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0', '--config', '/nonexistent.yaml'], env, /--config: .* does not exist/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0', '--snapshot-part-entries', '0'], env, /--snapshot-part-entries must be a whole number, at least 1, got "0"/],
    [['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0', '--snapshot-part-entries', '1e4'], env, /--snapshot-part-entries must be a whole number/],
  ];
  for (const [argv, e, want] of cases) assert.throws(() => loadControlPlaneConfig(argv, e), want, argv.join(' '));
  const ok = loadControlPlaneConfig(['--db', '/tmp/tollgate-cfg-test/x.db', '--listen', '127.0.0.1:0', '--revoke-ack-timeout-ms', '250'], env);
  assert.equal(ok.revokeAckTimeoutMs, 250);
  assert.equal(ok.snapshotPartEntries, 10_000, 'a snapshot in parts of 10,000 keys by default');
  assert.equal(ok.configPath, DEMO_CONFIG_PATH);
  assert.equal(ok.pepper.toString(), 'p'.repeat(32));
});

// Before: the control plane took TOLLGATE_PEPPER over --pepper-file while a node took the file, so
// one shell with both set gave the two sides different peppers.
test('an explicit --pepper-file or --node-token-file wins over the environment, as on the nodes', async () => {
  const { mkdtempSync, writeFileSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-cfg-'));
  writeFileSync(join(dir, 'pepper'), `${'f'.repeat(40)}\n`);
  writeFileSync(join(dir, 'node-token'), 'node_from_file_0123456789\n');
  const cfg = loadControlPlaneConfig(
    ['--db', join(dir, 't.db'), '--listen', '127.0.0.1:0', '--pepper-file', join(dir, 'pepper'), '--node-token-file', join(dir, 'node-token')],
    { TOLLGATE_PEPPER: 'e'.repeat(40), TOLLGATE_NODE_TOKEN: 'node_from_env_0123456789', TOLLGATE_OPERATOR_TOKEN: 'op_0123456789abcdef' },
  );
  assert.equal(cfg.pepper.toString('utf8'), 'f'.repeat(40));
  assert.equal(cfg.nodeToken, 'node_from_file_0123456789');
  const fromEnv = loadControlPlaneConfig(['--db', join(dir, 't.db'), '--listen', '127.0.0.1:0'], { TOLLGATE_PEPPER: 'e'.repeat(40), TOLLGATE_NODE_TOKEN: 'node_from_env_0123456789', TOLLGATE_OPERATOR_TOKEN: 'op_0123456789abcdef' });
  assert.equal(fromEnv.pepper.toString('utf8'), 'e'.repeat(40));
});
