// Fuzzing a running node with fast-check, a bounded number of cases (`npm run fuzz -- --runs N` runs
// as many as asked), and slow clients: 500 connections sending one header byte per second must not stop
// normal requests from being served.
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { bearer, request } from '../helpers/http.js';
import { stopAll } from '../helpers/processes.js';
import { fuzzNode, startFuzzStack, type FuzzStack } from '../fuzz/node-fuzz.js';

let stack: FuzzStack;
before(async () => {
  stack = await startFuzzStack();
});
after(async () => {
  await stack?.close();
  await stopAll();
});

test('random methods, paths, headers and bodies: never a crash or hang, always a permitted status in the right shape', async () => {
  // A fixed seed in the suite (the same 1,000 cases every run); `npm run fuzz` explores new ones.
  await fuzzNode(stack, Number(process.env.TOLLGATE_FUZZ_RUNS ?? 1000), Number(process.env.TOLLGATE_FUZZ_SEED ?? 20261123));
});

test('500 connections sending one header byte per second do not stop normal requests', async () => {
  const port = Number(stack.node.address.split(':')[1]);
  const head = 'GET /v1/models HTTP/1.1\r\nHost: slow\r\n';
  const slow: Socket[] = [];
  for (let i = 0; i < 500; i++) {
    const s = connect(port, '127.0.0.1');
    s.on('error', () => {});
    slow.push(s);
  }
  let sent = 0;
  const drip = setInterval(() => {
    for (const s of slow) if (!s.destroyed) s.write(head[sent % head.length]);
    sent++;
  }, 1000);
  try {
    for (const s of slow) s.write(head[0]);
    // Meanwhile normal requests are answered promptly, several times over the next seconds.
    for (let i = 0; i < 15; i++) {
      const t0 = performance.now();
      const r = await request(`${stack.node.url}/v1/models`, { headers: bearer(stack.key) });
      assert.equal(r.status, 200);
      assert.ok(performance.now() - t0 < 1000, 'served promptly');
      await new Promise((res) => setTimeout(res, 200));
    }
    assert.ok(sent >= 2, 'the slow clients were dripping the whole time');
  } finally {
    clearInterval(drip);
    for (const s of slow) s.destroy();
  }
});
