// Graceful drain. SIGTERM during a streaming response: the node stops being ready and stops accepting
// connections, the stream completes, the node exits 0, and the stream's usage reaches the control
// plane. Past --drain-seconds what is still open is closed and billed as an abort. A second SIGTERM
// exits at once. The control plane on SIGTERM closes its database cleanly.
import assert from 'node:assert/strict';
import { existsSync, statSync } from 'node:fs';
import { connect } from 'node:net';
import { after, test } from 'node:test';
import { consoleClient, createKey } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer } from '../helpers/http.js';
import { scrapeMetrics } from '../helpers/prometheus.js';
import { startControlPlane, stopAll, type ControlPlane, type Proc } from '../helpers/processes.js';
import { waitForUsageRows } from '../helpers/usage-db.js';

let up: FakeUpstream;
let cp: ControlPlane;

// A control plane only: each test starts the node it drains.
const gw = gatewayFixture(
  async () => {
    up = await startFakeUpstream();
    const yaml = configYaml((cfg) => addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['free', 'paid'], { timeout_ms: 60_000 }));
    return { controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } }, nodes: 0 };
  },
  (g) => {
    cp = g.cp;
  },
);
after(async () => {
  await stopAll();
  await up.close();
});

function connectOnce(hostPort: string): Promise<void> {
  const i = hostPort.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const sock = connect({ host: hostPort.slice(0, i), port: Number(hostPort.slice(i + 1)) });
    sock.once('connect', () => {
      sock.destroy();
      resolve();
    });
    sock.once('error', reject);
  });
}

/** A kept-alive connection of raw HTTP/1.1: one request at a time, each answer read to its Content-Length. */
function rawConnection(hostPort: string): Promise<{ send(head: string): Promise<{ status: number; headers: string; body: any }>; closed: Promise<void> }> {
  const i = hostPort.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const sock = connect({ host: hostPort.slice(0, i), port: Number(hostPort.slice(i + 1)) });
    let data = '';
    let waiter: (() => void) | null = null;
    sock.on('data', (c) => {
      data += c.toString('latin1');
      waiter?.();
    });
    const closed = new Promise<void>((done) => sock.once('close', () => done()));
    const send = (head: string) =>
      new Promise<{ status: number; headers: string; body: any }>((done) => {
        data = '';
        waiter = () => {
          const end = data.indexOf('\r\n\r\n');
          const length = /content-length: *(\d+)/i.exec(data.slice(0, Math.max(0, end)));
          if (end < 0 || !length || data.length < end + 4 + Number(length[1])) return;
          waiter = null;
          done({ status: Number(data.slice(9, 12)), headers: data.slice(0, end), body: JSON.parse(data.slice(end + 4, end + 4 + Number(length[1]))) });
        };
        sock.write(head);
      });
    sock.once('connect', () => resolve({ send, closed }));
    sock.once('error', reject);
  });
}

function exitCode(proc: Proc): Promise<number | null> {
  const child = proc.child;
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once('exit', (code) => resolve(code)));
}

async function openHeldStream(url: string, key: string) {
  up.setMode('hold-stream');
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'Say hello' }] }),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = '';
  while (!/"content":"Hello"/.test(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
  }
  assert.match(text, /"content":"Hello"/);
  const rest = async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return text;
      text += dec.decode(value, { stream: true });
    }
  };
  return { rest };
}

test('SIGTERM during a stream: not ready, no new connections, the stream completes, exit 0, usage arrives', async () => {
  const dp = await gw.addNode({ adminListen: true, extraArgs: ['--drain-seconds', '60'] });
  const k = await gw.fundedKey({ tier: 'free', knownOn: [dp] });
  const stream = await openHeldStream(dp.url, k.key);

  dp.proc.child.kill('SIGTERM');
  await dp.proc.waitFor(/"msg":"draining: no new connections/);
  // Readiness flips while the stream is still open.
  assert.equal((await fetch(`${dp.adminUrl}/readyz`)).status, 503);
  const m = await scrapeMetrics(`${dp.adminUrl}/metrics`);
  assert.equal(m.value('tollgate_node_draining'), 1);
  assert.equal(m.value('tollgate_node_open_streams', { kind: 'sse' }), 1);
  // A new connection is refused.
  await assert.rejects(connectOnce(dp.address), /ECONNREFUSED/);
  // A request on a connection opened before the drain is still answered, and that connection closes.
  const late = await fetch(`${dp.url}/v1/models`, { headers: bearer(k.key) });
  assert.equal(late.status, 200);
  assert.equal(late.headers.get('connection'), 'close');
  assert.equal(dp.proc.child.exitCode, null, 'the node waits for the stream');

  up.release();
  const text = await stream.rest();
  assert.match(text, /\[DONE\]/);
  assert.equal(await exitCode(dp.proc), 0);
  assert.match(dp.proc.output(), /"msg":"drained: usage acknowledged by the control plane"/);
  // The stream's usage is in the control plane's usage table, with its tokens.
  const rows = await waitForUsageRows(cp.dbPath, k.keyId, 1);
  assert.equal(rows.length, 1);
  assert.equal(rows[0].status, 200);
  assert.equal(rows[0].model, 'up-chat');
  assert.ok(rows[0].completion_tokens > 0);
  up.setMode('normal');
});

test('one drain for HTTP and WebSocket upgrades: on connections opened before it, a request is answered and closes its connection, an upgrade is refused with 503', async () => {
  const dp = await gw.addNode({ extraArgs: ['--drain-seconds', '60'] });
  const k = await gw.fundedKey({ tier: 'free', knownOn: [dp] });
  const models = `GET /v1/models HTTP/1.1\r\nHost: drain\r\nAuthorization: Bearer ${k.key}\r\n\r\n`;
  const upgrade = [
    'GET /v1/realtime?model=demo-realtime HTTP/1.1',
    'Host: drain',
    'Connection: Upgrade',
    'Upgrade: websocket',
    'Sec-WebSocket-Version: 13',
    'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==',
    `Authorization: Bearer ${k.key}`,
  ].join('\r\n');
  // Two connections, kept alive before the drain; a held stream keeps the node draining.
  const [a, b] = await Promise.all([rawConnection(dp.address), rawConnection(dp.address)]);
  assert.equal((await a.send(models)).status, 200);
  assert.equal((await b.send(models)).status, 200);
  const stream = await openHeldStream(dp.url, k.key);

  dp.proc.child.kill('SIGTERM');
  await dp.proc.waitFor(/"msg":"draining: no new connections/);
  const refused = await a.send(`${upgrade}\r\n\r\n`);
  assert.equal(refused.status, 503);
  assert.equal(refused.body.error.type, 'api_error');
  assert.match(refused.body.error.message, /shutting down/);
  assert.match(refused.headers, /\r\nretry-after: 1\r\n/i);
  await a.closed;
  const served = await b.send(models);
  assert.equal(served.status, 200);
  assert.match(served.headers, /\r\nconnection: close\r\n/i);
  await b.closed;

  up.release();
  assert.match(await stream.rest(), /\[DONE\]/);
  assert.equal(await exitCode(dp.proc), 0);
  up.setMode('normal');
});

test('past --drain-seconds an open stream is closed, billed as an abort, and the node still exits 0', async () => {
  const dp = await gw.addNode({ extraArgs: ['--drain-seconds', '1'] });
  const k = await gw.fundedKey({ tier: 'free', knownOn: [dp] });
  const stream = await openHeldStream(dp.url, k.key);
  dp.proc.child.kill('SIGTERM');
  // The upstream never finishes; the node cuts the stream at the deadline.
  const text = await stream.rest().catch(() => 'cut');
  assert.doesNotMatch(text, /\[DONE\]/);
  assert.equal(await exitCode(dp.proc), 0);
  assert.match(dp.proc.output(), /drain deadline passed: 1 responses closed/);
  // The request log says what the client saw (the 200 head, then the stream cut) and what was billed.
  const rows = await waitForUsageRows(cp.dbPath, k.keyId, 1);
  assert.deepEqual([rows[0].status, rows[0].reason], [200, 'aborted']);
  assert.ok(rows[0].prompt_tokens > 0, 'the prompt is billed');
  up.release();
  up.setMode('normal');
});

test('a second SIGTERM exits at once, without waiting for the open stream', async () => {
  const dp = await gw.addNode({ extraArgs: ['--drain-seconds', '60'] });
  const k = await gw.fundedKey({ tier: 'free', knownOn: [dp] });
  const stream = await openHeldStream(dp.url, k.key);
  dp.proc.child.kill('SIGTERM');
  await dp.proc.waitFor(/"msg":"draining: no new connections/);
  dp.proc.child.kill('SIGTERM');
  // Exits while the upstream still holds the stream.
  assert.equal(await exitCode(dp.proc), 1);
  assert.match(dp.proc.output(), /second SIGTERM: exiting at once/);
  await stream.rest().catch(() => '');
  up.release();
  up.setMode('normal');
});

test('the control plane on SIGTERM closes its database cleanly and exits 0', async () => {
  const own = await startControlPlane();
  const oc = consoleClient(own.address, own.secrets.operatorToken);
  await createKey(oc, { tier: 'paid' });
  oc.close();
  assert.ok(existsSync(`${own.dbPath}-wal`), 'the database runs in WAL mode');
  own.proc.child.kill('SIGTERM');
  assert.equal(await exitCode(own.proc), 0);
  assert.match(own.proc.output(), /"msg":"stopped: database closed cleanly"/);
  // A clean close checkpoints the WAL into the database file and removes it.
  await eventually(async () => !existsSync(`${own.dbPath}-wal`) || statSync(`${own.dbPath}-wal`).size === 0, 'WAL checkpointed');
});
