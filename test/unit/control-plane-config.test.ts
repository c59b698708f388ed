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

test('--database-url (or TOLLGATE_DATABASE_URL): a postgres:// URL puts the state in PostgreSQL; anything else names the setting, never the password', () => {
  const env = { TOLLGATE_PEPPER: 'p'.repeat(32), TOLLGATE_OPERATOR_TOKEN: 'op_x'.repeat(5), TOLLGATE_NODE_TOKEN: 'node_x'.repeat(5) };
  const listen = ['--listen', '127.0.0.1:0'];
  const url = 'postgres://tollgate:s3cret@db.internal:5433/tollgate';
  const cfg = loadControlPlaneConfig([...listen, '--database-url', url], env);
  assert.equal(cfg.databaseUrl, url);
  assert.equal(loadControlPlaneConfig(listen, { ...env, TOLLGATE_DATABASE_URL: 'postgresql://u:p@h/d' }).databaseUrl, 'postgresql://u:p@h/d');
  // The flag wins over the environment; without either, SQLite as before.
  assert.equal(loadControlPlaneConfig([...listen, '--database-url', url], { ...env, TOLLGATE_DATABASE_URL: 'postgres://other/x' }).databaseUrl, url);
  assert.equal(loadControlPlaneConfig(['--db', '/tmp/tollgate-cfg-test/x.db', ...listen], env).databaseUrl, null);
  const bad: [string[], Record<string, string>, RegExp][] = [
    [[...listen, '--database-url', 'mysql://u:hunter2@h/d'], env, /^--database-url must be a postgres:\/\/USER:PASSWORD@HOST:PORT\/DATABASE URL \(the value is not shown\)$/],
    [[...listen, '--database-url', 'postgres://u:hunter2@/d'], env, /^--database-url must be/],
    [[...listen, '--database-url', 'postgres://u:hunter2@h'], env, /^--database-url must be/],
    [[...listen, '--database-url', 'postgres://u:hunter2@h:99999/d'], env, /^--database-url must be/],
    [[...listen, '--database-url', 'not a url hunter2'], env, /^--database-url must be/],
    [listen, { ...env, TOLLGATE_DATABASE_URL: 'postgres//hunter2' }, /^TOLLGATE_DATABASE_URL must be/],
    // The request logs go to PostgreSQL too: a logs file would be ignored, so it is refused.
    [[...listen, '--database-url', url, '--logs-db', '/tmp/x.db'], env, /^--logs-db is for SQLite; with --database-url the request logs are in PostgreSQL$/],
    // Without --db there is no folder to keep generated tokens in.
    [[...listen, '--database-url', url], { ...env, TOLLGATE_OPERATOR_TOKEN: '' }, /^--database-url needs TOLLGATE_OPERATOR_TOKEN/],
    [[...listen, '--database-url', url], { ...env, TOLLGATE_NODE_TOKEN: '' }, /^--database-url needs --node-token-file or TOLLGATE_NODE_TOKEN/],
  ];
  for (const [argv, e, want] of bad) {
    assert.throws(() => loadControlPlaneConfig(argv, e), (err: Error) => {
      assert.match(err.message, want, argv.join(' '));
      assert.doesNotMatch(err.message, /hunter2/);
      return true;
    });
  }
});

test('--advertise-address and --leader-retry-ms (several control planes on PostgreSQL): defaults, and bad values named', () => {
  const env = { TOLLGATE_PEPPER: 'p'.repeat(32), TOLLGATE_OPERATOR_TOKEN: 'op_x'.repeat(5), TOLLGATE_NODE_TOKEN: 'node_x'.repeat(5) };
  const base = ['--database-url', 'postgres://u:p@db.internal:5432/tollgate', '--listen', '0.0.0.0:50051'];
  const plain = loadControlPlaneConfig(base, env);
  assert.equal(plain.advertiseAddress, null, 'the address it listens on unless told');
  assert.equal(plain.leaderRetryMs, 1000);
  const told = loadControlPlaneConfig([...base, '--advertise-address', 'cp-a.internal:50051', '--leader-retry-ms', '250'], env);
  assert.equal(told.advertiseAddress, 'cp-a.internal:50051');
  assert.equal(told.leaderRetryMs, 250);
  assert.throws(() => loadControlPlaneConfig([...base, '--advertise-address', 'cp-a'], env), /^ConfigError: --advertise-address must be HOST:PORT, got "cp-a"$/);
  assert.throws(() => loadControlPlaneConfig([...base, '--leader-retry-ms', '10'], env), /^ConfigError: --leader-retry-ms must be a whole number of milliseconds, at least 50, got "10"$/);
});
