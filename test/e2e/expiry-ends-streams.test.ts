// Issue 32, finding 6: a key's expiry was checked only when a request was authenticated. On a node cut
// off from the control plane, an SSE stream or a realtime socket opened before `expires_at` kept
// serving (and billing) after it. Now the node's one policy for what a key has open ends them at the
// expiry, on the node's own clock: the stream with one terminal error event, billed what it served;
// the socket with 1008 and the reason; with the same 401 error a request of the expired key gets.
import { startTcpRelay, type TcpRelay } from '../helpers/tcp-relay.js';
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { consoleClient, createKey, type Console, type DemoKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer, request, setClock } from '../helpers/http.js';
import { openRealtime } from '../helpers/realtime.js';
import { cliJsonAsync, startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageRows } from '../helpers/usage-db.js';

/** Micro-dollars per token of `up-chat` (USD per million tokens = micro-dollars per token). */
const IN_MICROS = 1000;
const OUT_MICROS = 3000;
/** The one 401 a request of an expired key gets (errors.ts KEY_INVALID). */
const EXPIRED_TEXT = 'Invalid API key: the key does not exist or was revoked.';

let up: FakeUpstream;
let cp: ControlPlane;
let node: DataPlane;
let relay: TcpRelay;
let op: Console;
let project: DemoKey;



const connected = async (want: boolean) => (await op.listNodes()).nodes.some((n) => n.id === 'expiry-node' && n.connected === want);

/** A key of `project` that expires in `expiresIn`, known on the node; its expiry in ms. */
async function expiringKey(expiresIn: string): Promise<{ key: string; keyId: string; expiresAtMs: number }> {
  const created = await cliJsonAsync(cp, cp.secrets.operatorToken, ['key', 'create', '--project', project.projectId, '--name', `expires ${expiresIn}`, '--expires-in', expiresIn]);
  await waitUntilKnown(node.url, created.key);
  return { key: created.key, keyId: created.id, expiresAtMs: Date.parse(created.expires_at) };
}

let chatKey: Awaited<ReturnType<typeof expiringKey>>;
let socketKey: Awaited<ReturnType<typeof expiringKey>>;

before(async () => {
  up = await startFakeUpstream();
  cp = await startControlPlane({
    env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
    configYaml: configYaml((cfg) => addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['free'], { input_usd_per_mtok: String(IN_MICROS), output_usd_per_mtok: String(OUT_MICROS) })),
  });
  relay = await startTcpRelay(cp.address);
  node = await startDataPlane({ address: relay.address, secrets: cp.secrets }, { nodeId: 'expiry-node', adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
  op = consoleClient(cp.address, cp.secrets.operatorToken);
  project = await createKey(op, { tier: 'free' });
  await waitUntilKnown(node.url, project.key);
  // Both keys are learnt while the node is connected; the chat key expires first.
  chatKey = await expiringKey('1h');
  socketKey = await expiringKey('2h');
  relay.cut();
  await eventually(() => connected(false), 'the node is cut off from the control plane');
});
after(async () => {
  op?.close();
  await stopAll();
  await relay?.close();
  await up?.close();
});

test('cut off from the control plane, an SSE chat stream open across its key expiry ends with one terminal error event, billed what it served', { timeout: 60_000 }, async () => {
  await setClock(node.adminUrl!, { now_ms: chatKey.expiresAtMs - 10_000 });
  up.setMode('hold-stream');
  const res = await fetch(`${node.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(chatKey.key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'Say hello' }] }),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = '';
  while (!/"content":"Hello"/.test(text)) text += dec.decode((await reader.read()).value, { stream: true });
  await up.waitForHeld(1);
  let ended = false;
  const rest = (async () => {
    for (;;) {
      const r = await reader.read().catch(() => ({ done: true, value: undefined }));
      if (r.done) break;
      text += dec.decode(r.value, { stream: true });
    }
    ended = true;
  })();
  const upstreamLetGo = up.waitForClientClose();

  // A second before the expiry the key still serves, and its stream stays open.
  await setClock(node.adminUrl!, { now_ms: chatKey.expiresAtMs - 1000 });
  assert.equal((await request(`${node.url}/v1/models`, { headers: bearer(chatKey.key) })).status, 200);
  assert.equal(ended, false, 'the stream is open before the expiry');

  // At the expiry: refused, and the stream ends with the same error, once.
  await setClock(node.adminUrl!, { now_ms: chatKey.expiresAtMs });
  const refused = await request(`${node.url}/v1/models`, { headers: bearer(chatKey.key) });
  assert.equal(refused.status, 401);
  await rest;
  const events = text.split('\n\n').filter((e) => e.startsWith('data: '));
  const errors = events.filter((e) => e.includes('"error"'));
  assert.equal(errors.length, 1, text);
  assert.equal(events[events.length - 1], errors[0], 'the error is the last event');
  assert.doesNotMatch(text, /\[DONE\]/);
  const err = JSON.parse(errors[0].slice('data: '.length)).error;
  assert.deepEqual({ type: err.type, message: err.message }, { type: refused.body.error.type, message: refused.body.error.message });
  assert.deepEqual({ type: err.type, message: err.message }, { type: 'authentication_error', message: EXPIRED_TEXT });
  await upstreamLetGo;
  up.release();
  up.setMode('normal');

  // Back in touch with the control plane, the node's journal delivers the cut stream's usage.
  relay.restore();
  await eventually(() => connected(true), 'the node reconnects', 30_000);
  const [row] = await waitForUsageRows(cp.dbPath, chatKey.keyId, 1, 30_000);
  assert.deepEqual([row.status, row.reason, row.model], [200, 'aborted', 'up-chat']);
  assert.ok(row.prompt_tokens > 0, 'the prompt is billed');
  assert.ok(row.completion_tokens > 0, 'what was served ("Hello") is billed');
  assert.equal(row.cost_micros, row.prompt_tokens * IN_MICROS + row.completion_tokens * OUT_MICROS);
  relay.cut();
  await eventually(() => connected(false), 'the node is cut off again');
});

test('cut off from the control plane, a realtime socket open across its key expiry is closed 1008 with the reason; another key keeps its socket', { timeout: 60_000 }, async () => {
  await setClock(node.adminUrl!, { now_ms: socketKey.expiresAtMs - 10_000 });
  const s = await openRealtime(node.address, { key: socketKey.key });
  await s.session.waitFor('session.created');
  const other = await openRealtime(node.address, { key: project.key });
  await other.session.waitFor('session.created');

  await setClock(node.adminUrl!, { now_ms: socketKey.expiresAtMs - 1000 });
  s.session.say('still mine?');
  await s.session.waitFor('response.done');
  assert.equal(s.session.closeCode, null, 'open before the expiry');

  await setClock(node.adminUrl!, { now_ms: socketKey.expiresAtMs });
  assert.equal(await s.session.waitClosed(5000), 1008);
  assert.equal(s.session.closeReason, `invalid_api_key: ${EXPIRED_TEXT.charAt(0).toLowerCase()}${EXPIRED_TEXT.slice(1)}`);
  assert.equal(other.session.closeCode, null, "another key's socket stays open");
  other.session.say('and mine?');
  await other.session.waitFor('response.done');
  other.ws.close(1000);
});
