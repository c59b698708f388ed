// The node-wide bound on what realtime sessions hold (issue 21, finding 15). Before it, each session
// was bounded on its own but nothing bounded them together: every new session that stopped reading
// added its own limit to the node's memory. Here one session may hold 768 KiB and all of them 1 MiB.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { consoleClient, createKey, type Console } from '../helpers/console.js';
import { configYaml } from '../helpers/config.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';
import { attemptRealtime, isRefusal, openRealtime } from '../helpers/realtime.js';
import { startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';

const SESSION_KIB = 768;
const NODE_MIB = 1;
const MESSAGE_BYTES = 32 * 1024;
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
let upstream: FakeRealtimeUpstream;

before(async () => {
  upstream = await startFakeRealtimeUpstream();
  cp = await startControlPlane({
    configYaml: configYaml((cfg) => {
      cfg.models.push({ id: 'rt-upstream', provider: 'openai', kind: 'realtime', input_usd_per_mtok: '1.00', output_usd_per_mtok: '1.00' });
      cfg.realtime_upstreams = [{ model: 'rt-upstream', url: upstream.url }];
      cfg.tiers.free.models.push('rt-upstream');
    }),
  });
  node = await startDataPlane(cp, {
    adminListen: true,
    extraArgs: ['--realtime-max-buffered-kib', String(SESSION_KIB), '--realtime-max-node-buffered-mib', String(NODE_MIB)],
  });
  admin = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  admin?.close();
  await stopAll();
  await upstream?.close();
});

async function stats(): Promise<{ open: number; paused_upstreams: number; node_buffered_bytes: number; node_peak_buffered_bytes: number; node_max_buffered_bytes: number }> {
  return (await fetch(`${node.adminUrl}/stats/realtime`)).json() as any;
}

test('past the node-wide bound upstreams are paused and new sessions refused (503, retry-after); room again once clients read', async () => {
  const k = await createKey(admin, { tier: 'free' });
  await waitUntilKnown(node.url, k.key);
  assert.equal((await stats()).node_max_buffered_bytes, NODE_MIB * 1024 * 1024);
  const count = 800; // 25 MiB each: far more than the socket buffers between the processes hold
  const open = async () => {
    const s = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
    await s.session.waitFor('session.created');
    s.ws.pause();
    s.session.send({ type: 'test.flood', count, bytes: MESSAGE_BYTES });
    return s;
  };
  // The first client stops reading: its upstream pauses at its own limit, under the node's.
  const a = await open();
  await eventually(async () => (await stats()).paused_upstreams === 1, 'the first upstream paused');
  // What uWS holds can shrink after a pause (the kernel's socket buffers grow and take some): the peak
  // is what the node held when it paused; a paused upstream resumes only under half its own limit.
  const first = await stats();
  assert.ok(first.node_peak_buffered_bytes >= SESSION_KIB * 1024 && first.node_peak_buffered_bytes < NODE_MIB * 1024 * 1024, `held at most ${first.node_peak_buffered_bytes}`);
  assert.ok(first.node_buffered_bytes >= (SESSION_KIB * 1024) / 2, `held ${first.node_buffered_bytes}`);
  // A second one: the two together reach the node's bound, and the second upstream pauses there.
  const b = await open();
  await eventually(async () => (await stats()).paused_upstreams === 2, 'the second upstream paused');
  const full = await stats();
  // The bound, plus what one read of the upstream's socket may complete before the pause takes effect.
  const bound = NODE_MIB * 1024 * 1024 + 2 * MESSAGE_BYTES + 64 * 1024;
  assert.ok(full.node_peak_buffered_bytes >= NODE_MIB * 1024 * 1024 && full.node_peak_buffered_bytes <= bound, `held at most ${full.node_peak_buffered_bytes}, bound ${bound}`);
  // Both stay paused while the node holds three quarters of its bound or more (they resume under it).
  assert.ok(full.node_buffered_bytes >= (NODE_MIB * 1024 * 1024 * 3) / 4 && full.node_buffered_bytes <= bound, `held ${full.node_buffered_bytes}, bound ${bound}`);
  // A new session is refused while the node is full.
  const refused = await attemptRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  assert.ok(isRefusal(refused), 'refused');
  assert.equal(refused.status, 503);
  assert.equal(refused.headers['retry-after'], '1');
  assert.equal(refused.body.error.type, 'api_error');
  assert.match(refused.body.error.message, /realtime messages/);

  // The clients read again: every message arrives, in order, and the node has room again.
  a.ws.resume();
  b.ws.resume();
  for (const s of [a, b]) {
    await s.session.waitFor('test.chunk', count, 60_000);
    const seqs = s.session.events.filter((e) => e.type === 'test.chunk').map((e) => e.seq);
    assert.deepEqual(seqs, Array.from({ length: count }, (_, i) => i), 'every message, once, in order');
  }
  await eventually(async () => (await stats()).node_buffered_bytes === 0, 'nothing held');
  const c = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  await c.session.waitFor('session.created');
  for (const s of [a, b, c]) {
    s.ws.close(1000);
    await s.session.waitClosed();
  }
  await eventually(async () => (await stats()).open === 0, 'all closed');
});
