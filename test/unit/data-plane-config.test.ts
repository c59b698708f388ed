// A node's process flags (data-plane/config.ts): defaults, and a bad value named in one line.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../data-plane/config.js';

const ENV = { TOLLGATE_PEPPER: 'p'.repeat(32), TOLLGATE_NODE_TOKEN: 'node_x'.repeat(5) };
const BASE = ['--control-plane', '127.0.0.1:1', '--listen', '127.0.0.1:0'];

test('--report-every-ms: once a second unless set, 0 for at once, at most a minute', () => {
  assert.equal(loadConfig(BASE, ENV).reportEveryMs, 1000);
  assert.equal(loadConfig([...BASE, '--report-every-ms', '0'], ENV).reportEveryMs, 0);
  assert.equal(loadConfig([...BASE, '--report-every-ms=60000'], ENV).reportEveryMs, 60_000);
  for (const bad of ['60001', '-1', '1.5', 'soon']) {
    assert.throws(() => loadConfig([...BASE, '--report-every-ms', bad], ENV), new RegExp(`^ConfigError: --report-every-ms must be a whole number of milliseconds from 0 to 60000, got "${bad.replace('.', '\\.')}"$`));
  }
});

test('a node flag without its value, or an unknown one, is one line naming it', () => {
  assert.throws(() => loadConfig([...BASE, '--drain-seconds'], ENV), /^ConfigError: --drain-seconds needs a value$/);
  assert.throws(() => loadConfig([...BASE, '--drain', '5'], ENV), /^ConfigError: unknown argument "--drain"; usage: data-plane /);
});

test('--control-plane (or TOLLGATE_CONTROL_PLANE) takes several control planes separated by commas; each must be HOST:PORT', () => {
  const listen = ['--listen', '127.0.0.1:0'];
  assert.equal(loadConfig(['--control-plane', 'cp-a:50051,cp-b:50051', ...listen], ENV).controlPlane, 'cp-a:50051,cp-b:50051');
  assert.equal(loadConfig(listen, { ...ENV, TOLLGATE_CONTROL_PLANE: 'cp-a:50051,cp-b:50051' }).controlPlane, 'cp-a:50051,cp-b:50051');
  // The flag wins over the environment.
  assert.equal(loadConfig(['--control-plane', 'cp-c:50051', ...listen], { ...ENV, TOLLGATE_CONTROL_PLANE: 'cp-a:50051' }).controlPlane, 'cp-c:50051');
  assert.throws(() => loadConfig(['--control-plane', 'cp-a:50051,cp-b', ...listen], ENV), /^ConfigError: --control-plane must be HOST:PORT, got "cp-b"$/);
  assert.throws(() => loadConfig(['--control-plane', ',', ...listen], ENV), /^ConfigError: --control-plane must be HOST:PORT, got ","$/);
});
