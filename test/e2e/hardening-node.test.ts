// Hardening, third round (issue 21): what a node keeps across sessions and connections. Realtime
// sessions that closed leave nothing for a drain to wait for.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { eventually } from '../helpers/data-plane.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { openRealtime } from '../helpers/realtime.js';
import { type Proc } from '../helpers/processes.js';

// A control plane only: each test starts the nodes it needs.
const gw = gatewayFixture({ nodes: 0 });

function exitCode(proc: Proc): Promise<number | null> {
  const child = proc.child;
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once('exit', (code) => resolve(code)));
}

test('a SIGTERM after realtime sessions closed finds nothing open and exits at once', async () => {
  // Before the fix every upgraded request stayed in the node's set of open responses: after 3 closed
  // sessions the drain reported "open: 3" and waited the whole --drain-seconds.
  const dp = await gw.addNode({ adminListen: true, extraArgs: ['--drain-seconds', '120'] });
  const k = await gw.fundedKey({ tier: 'free', knownOn: [dp] });
  for (let i = 0; i < 3; i++) {
    const s = await openRealtime(dp.address, { key: k.key });
    await s.session.waitFor('session.created');
    s.ws.close(1000, 'done');
    assert.equal(await s.session.waitClosed(), 1000);
  }
  await eventually(async () => (await (await fetch(`${dp.adminUrl}/stats/realtime`)).json()).open === 0, 'the node closed its 3 sessions');
  dp.proc.child.kill('SIGTERM');
  const [line] = await dp.proc.waitFor(/[^\n]*"msg":"draining: no new connections[^\n]*/);
  assert.match(line, /"open":0\b/, line);
  assert.equal(await exitCode(dp.proc), 0);
  assert.doesNotMatch(dp.proc.output(), /drain deadline passed/);
});
