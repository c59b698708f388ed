// Structured logs: both processes write one JSON object per line with a level (pino), apart from the
// plain process-interface lines; start, sync changes, config reloads, revocations with node
// acknowledgements and request errors with their request id are logged; no line holds a key, token
// or pepper; --log-level filters.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { startGateway } from '../helpers/gateway-fixture.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { startProcess, stopAll } from '../helpers/processes.js';

after(async () => {
  await stopAll();
});

const INTERFACE_LINE = /^(control plane listening on \S+( \([^)]*\))?|control plane admin listening on \S+|data plane listening on \S+|data plane admin listening on \S+|data plane ready)$/;

interface LogLine {
  level: string;
  time: string;
  service: string;
  pid: number;
  msg: string;
  [k: string]: unknown;
}

/** Every line is a process-interface line or one JSON event with level, time, service, pid and msg. */
function events(output: string): LogLine[] {
  const out: LogLine[] = [];
  for (const line of output.split('\n')) {
    if (line === '' || INTERFACE_LINE.test(line)) continue;
    let e: LogLine;
    try {
      e = JSON.parse(line) as LogLine;
    } catch {
      assert.fail(`not a JSON log line: ${JSON.stringify(line)}`);
    }
    assert.ok(['fatal', 'error', 'warn', 'info', 'debug', 'trace'].includes(e.level), line);
    assert.ok(!Number.isNaN(Date.parse(e.time)), line);
    assert.ok(e.service === 'control-plane' || e.service === 'data-plane', line);
    assert.equal(typeof e.pid, 'number');
    assert.equal(typeof e.msg, 'string');
    out.push(e);
  }
  return out;
}

test('JSON events for start, sync, config reload, revocation with acks and request errors, and never a secret', async (t) => {
  const yaml = configYaml((cfg) => addUpstreamModel(cfg, 'dead-chat', 'http://127.0.0.1:1/v1', ['free', 'paid']));
  const gw = await startGateway(t, { controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret-value' } }, nodes: [{ nodeId: 'log-node' }] });
  const [cp, dp, c] = [gw.cp, gw.node, gw.console];
  try {
    const k = await gw.fundedKey({ tier: 'free' });
    const ok = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody() });
    assert.equal(ok.status, 200);
    const failed = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody('Hi', 'dead-chat') });
    assert.equal(failed.status, 502);
    await c.reloadConfig();
    const revoked = await c.revokeKey({ keyId: k.keyId });
    assert.equal(revoked.nodesConfirmed, 1);
    await cp.proc.waitFor(/"event":"key_revoked"/);
    await dp.proc.waitFor(/"msg":"request [^"]+ ended with status 502"/);

    const cpEvents = events(cp.proc.output());
    const dpEvents = events(dp.proc.output());
    assert.ok(cpEvents.some((e) => e.msg === 'control plane started' && e.level === 'info'));
    assert.ok(cpEvents.some((e) => /sync: node log-node connected/.test(e.msg)));
    assert.ok(cpEvents.some((e) => /^config reloaded from .*: version \d+$/.test(e.msg)));
    const revocation = cpEvents.find((e) => e.event === 'key_revoked')!;
    assert.equal(revocation.keyId, k.keyId);
    assert.equal(revocation.nodesTotal, 1);
    assert.equal(revocation.nodesConfirmed, 1);
    assert.equal(typeof revocation.version, 'number');

    assert.ok(dpEvents.some((e) => e.msg === 'data plane started' && e.nodeId === 'log-node'));
    assert.ok(dpEvents.some((e) => e.msg === 'first snapshot applied: ready'));
    const requestError = dpEvents.find((e) => /ended with status 502/.test(e.msg))!;
    assert.equal(requestError.level, 'error');
    assert.equal(requestError.status, 502);
    assert.equal(requestError.keyId, k.keyId);
    assert.match(String(requestError.requestId), /\S/);

    // Sync state change: the control plane goes away and comes back.
    await cp.proc.kill('SIGKILL');
    await dp.proc.waitFor(/"msg":"control plane connection lost/);
    const lost = events(dp.proc.output()).find((e) => /connection lost/.test(e.msg))!;
    assert.equal(lost.level, 'warn');

    for (const secret of [k.key, cp.secrets.operatorToken, cp.secrets.nodeToken, cp.secrets.pepper, 'upstream-secret-value']) {
      assert.ok(!cp.proc.output().includes(secret), 'a secret in the control plane output');
      assert.ok(!dp.proc.output().includes(secret), 'a secret in the node output');
    }
  } finally {
    c.close();
  }
});

test('--log-level warn leaves out info events; a bad level is refused at start', async (t) => {
  const { cp, node: dp } = await startGateway(t, { controlPlane: { extraArgs: ['--log-level', 'warn'] }, node: { extraArgs: ['--log-level', 'warn'] } });
  // The process-interface lines are still printed.
  assert.match(dp.proc.output(), /data plane ready/);
  assert.ok(events(cp.proc.output()).every((e) => e.level !== 'info'));
  assert.ok(events(dp.proc.output()).every((e) => e.level !== 'info'));
  assert.ok(!cp.proc.output().includes('control plane started'));

  const bad = startProcess(['data-plane/main.ts', '--control-plane', cp.address, '--listen', '127.0.0.1:0', '--log-level', 'loud'], {
    TOLLGATE_PEPPER: cp.secrets.pepper,
    TOLLGATE_NODE_TOKEN: cp.secrets.nodeToken,
  });
  const code = await new Promise<number | null>((resolve) => bad.child.once('exit', (c) => resolve(c)));
  assert.equal(code, 2);
  assert.match(bad.output(), /--log-level must be one of fatal, error, warn, info, debug, trace, silent, got "loud"/);
});
