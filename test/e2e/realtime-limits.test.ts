// Realtime sessions and the node's limits: a client that stops reading makes the node pause the
// upstream instead of buffering past its configured limit; tokens from response.done count against
// the key's tpm and money against the organisation, and a session whose key's tpm or organisation's
// money runs out is closed after the current response with a reason saying why.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { type Console } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { configYaml } from '../helpers/config.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { attemptRealtime, isRefusal, openRealtime } from '../helpers/realtime.js';
import { minuteStart, setClock } from '../helpers/http.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';

const LIMIT_KIB = 256;
const MESSAGE_BYTES = 32 * 1024;
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
let upstream: FakeRealtimeUpstream;

const gw = gatewayFixture(async () => {
  upstream = await startFakeRealtimeUpstream();
  return {
    controlPlane: {
      configYaml: configYaml((cfg) => {
        cfg.models.push({ id: 'rt-upstream', provider: 'openai', kind: 'realtime', input_usd_per_mtok: '1.00', output_usd_per_mtok: '1.00' });
        // One demo response costs a few dollars: a free grant of 5.00 lasts about one.
        cfg.models.push({ id: 'demo-realtime-pricey', provider: 'demo', kind: 'realtime', input_usd_per_mtok: '100000', output_usd_per_mtok: '100000' });
        cfg.realtime_upstreams = [{ model: 'rt-upstream', url: upstream.url }];
        cfg.tiers.free.models.push('rt-upstream', 'demo-realtime-pricey');
        cfg.tiers['roomy'] = { rpm: 300, tpm: 1000000000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000.00', models: ['demo-realtime', 'demo-realtime-pricey'] };
        cfg.tiers['tiny-tpm'] = { rpm: 300, tpm: 20, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '5.00', models: ['demo-realtime'] };
      }),
    },
    node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' }, extraArgs: ['--realtime-max-buffered-kib', String(LIMIT_KIB)] },
  };
}, async () => {
  ({ cp, node, console: admin } = gw);
  // Inside one minute for the whole file: the tpm test reads the minute it spent.
  await setClock(node.adminUrl!, { now_ms: minuteStart() + 5_000 });
});
after(async () => {
  await upstream?.close();
});

async function stats(): Promise<{ open: number; paused_upstreams: number; peak_buffered_bytes: number }> {
  return (await fetch(`${node.adminUrl}/stats/realtime`)).json() as any;
}

test('a client that stops reading: the node holds at most its configured limit for it and pauses the upstream; everything arrives in order once it reads again', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const before = upstream.connections.length;
  const { ws, session } = await openRealtime(node.address, { key: k.key, model: 'rt-upstream' });
  const conn = await upstream.waitForConnection(before + 1);
  await session.waitFor('session.created');
  const count = 800; // 25 MiB: far more than the socket buffers between the three processes hold
  // The client stops reading, then asks the upstream for a flood.
  ws.pause();
  session.send({ type: 'test.flood', count, bytes: MESSAGE_BYTES });
  await eventually(async () => (await stats()).paused_upstreams === 1, 'the upstream paused');
  // The upstream is held back: it could not hand everything over and ws holds the rest unsent.
  await eventually(async () => conn.socket.bufferedAmount > 1024 * 1024, 'the upstream backs up');
  assert.ok(conn.floodSent < count || conn.socket.bufferedAmount > 0);
  const s = await stats();
  // The pause threshold, plus what one read of the upstream's socket may complete (a message and a
  // 64 KiB read) before the pause takes effect.
  const bound = LIMIT_KIB * 1024 + 2 * MESSAGE_BYTES + 64 * 1024;
  assert.ok(s.peak_buffered_bytes <= bound, `the node held ${s.peak_buffered_bytes} bytes for the client, bound ${bound}`);
  assert.ok(s.peak_buffered_bytes >= LIMIT_KIB * 1024, `it did fill up to its limit before pausing: ${s.peak_buffered_bytes}`);

  ws.resume();
  await session.waitFor('test.chunk', count, 60_000);
  const seqs = session.events.filter((e) => e.type === 'test.chunk').map((e) => e.seq);
  assert.deepEqual(seqs, Array.from({ length: count }, (_, i) => i), 'every message, once, in order');
  assert.equal((await stats()).paused_upstreams, 0);
  ws.close(1000);
  await session.waitClosed();
});

/**
 * Turns of `demo-realtime-pricey` (0.10 USD a token) until the gateway closes the socket or `maxTurns`
 * responses came: what they cost, in micro-dollars, and the most one cost.
 */
async function talkUntilClosed(session: Awaited<ReturnType<typeof openRealtime>>['session'], maxTurns: number): Promise<{ costs: number; maxCost: number; responses: number }> {
  let costs = 0;
  let maxCost = 0;
  let responses = 0;
  while (session.closeCode === null && responses < maxTurns) {
    session.say(`turn ${responses}`);
    const done = await session.waitFor('response.done', responses + 1).catch(() => null);
    if (!done) break;
    responses++;
    const u = done.response.usage;
    const cost = Math.ceil((u.input_tokens * 100_000_000_000 + u.output_tokens * 100_000_000_000) / 1_000_000);
    costs += cost;
    maxCost = Math.max(maxCost, cost);
    // Give the close a moment to arrive before the next turn (it follows the response.done).
    await session.waitClosed(500).catch(() => {});
  }
  return { costs, maxCost, responses };
}

test("usage: a free organisation whose grant runs out mid-session gets its socket closed after the response, with the reason; its spend is the grant plus at most that response", async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const { session } = await openRealtime(node.address, { key: k.key, model: 'demo-realtime-pricey' });
  await session.waitFor('session.created');
  const { costs, maxCost, responses } = await talkUntilClosed(session, 10);
  assert.equal(await session.waitClosed(), 1008);
  assert.match(session.closeReason, /^insufficient_quota: .*balance/);
  assert.ok(responses >= 1, 'at least one response went through');
  const lastEvent = session.events[session.events.length - 1];
  assert.equal(lastEvent.type, 'response.done', 'the response in flight was delivered whole before the close');
  await eventually(async () => (await admin.getOrg({ orgId: k.orgId })).spendTotalMicros === costs, 'every response charged');
  const org = await admin.getOrg({ orgId: k.orgId });
  assert.ok(org.spendTotalMicros >= 5_000_000, `spent ${org.spendTotalMicros}`);
  assert.ok(org.spendTotalMicros < 5_000_000 + maxCost, `spent ${org.spendTotalMicros}; one response costs up to ${maxCost}`);
  await eventually(async () => (await admin.getOrg({ orgId: k.orgId })).blocked, 'the organisation blocked');
  const again = await attemptRealtime(node.address, { key: k.key, model: 'demo-realtime-pricey' });
  assert.ok(isRefusal(again));
  assert.equal(again.status, 401);
  assert.equal(again.body.error.type, 'insufficient_quota');
});

test("a key's own spend limit reached mid-session closes the socket after the response (1008, naming the limit); the spend is the limit plus at most that response", async () => {
  // docs/money-limits.md: realtime refuses in band as for an organisation that ran out.
  const k = await gw.fundedKey({ tier: 'roomy' });
  const created = await admin.createKey({ projectId: k.projectId, name: 'limited', allowedModels: [], limitMicros: 10_000_000 });
  await waitUntilKnown(node.url, created.key);
  const { session } = await openRealtime(node.address, { key: created.key, model: 'demo-realtime-pricey' });
  await session.waitFor('session.created');
  const { costs, maxCost, responses } = await talkUntilClosed(session, 20);
  assert.equal(await session.waitClosed(), 1008);
  assert.equal(session.closeReason, "insufficient_quota: the key's spend limit ($10.00) was reached; it never resets");
  assert.ok(costs >= 10_000_000, `closed with ${costs} spent of the 10 USD limit`);
  assert.ok(costs < 10_000_000 + maxCost, `spent ${costs}; one response costs up to ${maxCost}`);
  await eventually(async () => (await admin.getKey({ keyId: created.apiKey!.id })).limitSpentMicros === costs, 'every response charged to the key');
  // The organisation has money left: only this key is refused, by name.
  assert.equal((await admin.getOrg({ orgId: k.orgId })).blocked, false);
  const again = await attemptRealtime(node.address, { key: created.key, model: 'demo-realtime-pricey' });
  assert.ok(isRefusal(again));
  assert.equal(again.status, 401);
  assert.equal(again.body.error.type, 'insufficient_quota');
  assert.equal(again.body.error.message, "This API key's spend limit of $10.00 was reached; it never resets: use another key.");
});

test("tpm: a session whose response spends the key's tokens per minute is closed after that response (1013, reason)", async () => {
  const k = await gw.fundedKey({ tier: 'tiny-tpm' });
  const { session } = await openRealtime(node.address, { key: k.key });
  await session.waitFor('session.created');
  // A question whose own estimate fits the 20 (a turn is admitted on it, issue 32) and whose answer spends them.
  session.say('why is the sky blue');
  const done = await session.waitFor('response.done');
  assert.ok(done.response.usage.total_tokens > 20);
  assert.equal(await session.waitClosed(), 1013);
  assert.match(session.closeReason, /^tokens: the key's tokens per minute \(20\) are spent; retry after \d+ s$/);
  // The minute's tokens are spent for HTTP too.
  const r = await attemptRealtime(node.address, { key: k.key });
  assert.ok(isRefusal(r));
  assert.equal(r.headers['x-ratelimit-remaining-tokens'], '0');
});

test('a client that keeps asking for responses without reading them is closed (1008) instead of being buffered for without bound', async () => {
  // A key and organisation with room for hundreds of responses a minute: each create past them is
  // refused in-band (a turn is a request, issue 32), so only the buffering or the rpm can stop it.
  const k = await gw.fundedKey({ tier: 'roomy' });
  const { ws, session } = await openRealtime(node.address, { key: k.key });
  await session.waitFor('session.created');
  ws.pause();
  // About 3 KB of events per demo response: 6,000 of them is more than the node's 256 KiB for the
  // client plus one 8 MiB message of what the model has produced and the client has not taken.
  session.send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'again' }] } });
  for (let i = 0; i < 6000; i++) session.send({ type: 'response.create' });
  ws.resume();
  // Two bounded outcomes, depending on how fast this machine's model answers: the node closes the
  // client (1008) once what it holds passes its limit, or the model keeps up and every create is
  // answered (a response, or a refusal once the minute's 300 requests are spent). Either way the node
  // never held more than its limit plus one message for the client.
  const closed = session.waitClosed(60_000).then((code) => ({ code }));
  // `decided` ends the other wait: left polling, it held this file's process open for a minute.
  let decided = false;
  const allDone = eventually(async () => decided || session.count('response.done') + session.count('error') >= 6000, 'every create answered', 60_000).then(() => ({ code: 0 }));
  const outcome = await Promise.race([closed, allDone]);
  decided = true;
  if (outcome.code !== 0) {
    assert.equal(outcome.code, 1008);
    assert.match(session.closeReason, /the client sends faster than (the upstream accepts|it reads)/);
    assert.ok(session.count('response.done') < 6000, `${session.count('response.done')} responses were produced before the close`);
  } else ws.close();
  assert.ok((await stats()).peak_buffered_bytes <= 256 * 1024 + 8 * 1024 * 1024, `the node held ${(await stats()).peak_buffered_bytes} bytes for one client`);
  await eventually(async () => (await stats()).open === 0, 'the session was released');
});

test('a client message over the 8 MiB limit drops the connection at once and releases the session', async () => {
  const k = await gw.fundedKey({ tier: 'free' });
  const { session } = await openRealtime(node.address, { key: k.key });
  await session.waitFor('session.created');
  session.send({ type: 'input_audio_buffer.append', audio: 'A'.repeat(8 * 1024 * 1024 + 1) });
  // uWebSockets.js drops the connection without a close frame when a message is too big: 1006 here.
  const code = await session.waitClosed();
  assert.equal(code, 1006);
  await eventually(async () => (await stats()).open === 0, 'the session was released');
});
