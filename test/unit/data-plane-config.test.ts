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
