// Hardening, third round (issue 21): what a node keeps across sessions and connections. Realtime
// sessions that closed leave nothing for a drain to wait for.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { consoleClient, createKey, type Console } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { openRealtime } from '../helpers/realtime.js';
import { startControlPlane, startDataPlane, stopAll, type ControlPlane, type Proc } from '../helpers/processes.js';

let cp: ControlPlane;
let c: Console;

before(async () => {
  cp = await startControlPlane();
  c = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  c?.close();
  await stopAll();
});

function exitCode(proc: Proc): Promise<number | null> {
  const child = proc.child;
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once('exit', (code) => resolve(code)));
}

test('a SIGTERM after realtime sessions closed finds nothing open and exits at once', async () => {
  // Before the fix every upgraded request stayed in the node's set of open responses: after 3 closed
  // sessions the drain reported "open: 3" and waited the whole --drain-seconds.
  const dp = await startDataPlane(cp, { adminListen: true, extraArgs: ['--drain-seconds', '120'] });
  const k = await createKey(c, { tier: 'free' });
  await waitUntilKnown(dp.url, k.key);
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
