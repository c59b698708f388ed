// Limits and money on every path: tool requests and listings count against rpm, aborted tool requests
// give their money reservation back, a paused upstream is resumed when a known-length answer finishes
// inside onWritable, an abort before the upstream's headers is billed, and every answer after
// authentication carries the key's rate headers.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { type Console } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { eventually } from '../helpers/data-plane.js';
import { bearer, chatBody, rawRequest, request } from '../helpers/http.js';
import { type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageRows } from '../helpers/usage-db.js';

const SPEECH_BYTES = 4 * 1024 * 1024;
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
/** Requests the fixture is holding (never answered); they end when the client goes away. */
const held = new Set<ServerResponse>();
let heldWaiters: Array<() => void> = [];

// One fixture server: an OpenAI-compatible upstream under /v1 and a tool backend under /tools.
const fixture = createServer((req: IncomingMessage, res: ServerResponse) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    const url = req.url ?? '';
    const hold = () => {
      held.add(res);
      res.on('close', () => held.delete(res));
      for (const w of heldWaiters.splice(0)) w();
    };
    if (url.startsWith('/tools/')) {
      if (url.includes('/hold')) return hold();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ ok: true, path: url }));
      return;
    }
    if (url === '/v1/audio/speech') {
      // A known-length answer, written with backpressure.
      res.writeHead(200, { 'content-type': 'audio/mpeg', 'content-length': String(SPEECH_BYTES) });
      const chunk = Buffer.alloc(64 * 1024, 7);
      let sent = 0;
      const pump = () => {
        while (sent < SPEECH_BYTES) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
        res.end();
      };
      return pump();
    }
    const body = JSON.parse(Buffer.concat(parts).toString('utf8'));
    if (body.messages?.[0]?.content === 'hold') return hold();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'x', object: 'chat.completion', created: 1, model: body.model, choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 9, completion_tokens: 1, total_tokens: 10 } }));
  });
});

function waitForHeld(n: number): Promise<void> {
  return new Promise((resolve) => {
    const check = () => (held.size >= n ? resolve() : heldWaiters.push(check));
    check();
  });
}

const gw = gatewayFixture(
  async () => {
    await new Promise<void>((resolve) => fixture.listen(0, '127.0.0.1', resolve));
    const base = `http://127.0.0.1:${(fixture.address() as AddressInfo).port}`;
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          cfg.tool_backends = [
            { prefix: '/v1/files', base_url: `${base}/tools`, timeout_ms: 30_000 },
            { prefix: '/v1/vector_stores', base_url: `${base}/tools`, timeout_ms: 30_000 },
          ];
          addUpstreamModel(cfg, 'up-chat', `${base}/v1`);
          addUpstreamModel(cfg, 'up-speech', `${base}/v1`, ['free', 'paid'], { kind: 'speech', audio_usd_per_unit: '0.015', voices: ['alloy'], input_usd_per_mtok: undefined, output_usd_per_mtok: undefined });
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
      },
    };
  },
  (g) => {
    ({ cp, node, console: admin } = g);
  },
);
after(async () => {
  for (const r of held) r.destroy();
  fixture.close();
});

/**
 * Starts a request on a raw socket and destroys it once the fixture holds it (an abort mid-request).
 * Fails at once if the node answers instead of forwarding.
 */
async function abortOnceHeld(path: string, method: string, key: string, body = ''): Promise<void> {
  const before = held.size;
  const sock = connect(Number(node.address.split(':')[1]), '127.0.0.1');
  sock.on('error', () => {});
  let answer = '';
  const answered = new Promise<never>((_, reject) =>
    sock.on('data', (c: Buffer) => {
      answer += c.toString();
      reject(new Error(`the node answered ${path} instead of forwarding it: ${answer.slice(0, 300)}`));
    }),
  );
  sock.write(`${method} ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  await Promise.race([waitForHeld(before + 1), answered]);
  sock.destroy();
  await eventually(async () => held.size === before, 'the node to abort the held upstream request');
}

test('tool requests, model listings and voices each count one request against rpm', async () => {
  // Before the fix, tool requests refunded their rpm ticket and listings never took one.
  const { key } = await gw.fundedKey({ tier: 'free' });
  for (let i = 1; i <= 20; i++) {
    const r = await request(`${node.url}/v1/files/f${i}?purpose=x`, { headers: bearer(key) });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-ratelimit-remaining-requests'), String(20 - i));
  }
  for (let i = 21; i <= 25; i++) {
    const r = await request(`${node.url}/v1/files/f${i}`, { headers: bearer(key) });
    assert.equal(r.status, 429, `request ${i}: ${r.text}`);
    assert.equal(r.body.error.type, 'requests');
    assert.equal(r.body.error.code, '429');
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
  }

  const other = (await gw.fundedKey({ tier: 'free' })).key;
  for (let i = 1; i <= 20; i++) {
    const path = i % 2 ? '/v1/models' : '/v1/audio/voices';
    const r = await request(`${node.url}${path}`, { headers: bearer(other) });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-ratelimit-remaining-requests'), String(20 - i), path);
  }
  const refused = await request(`${node.url}/v1/models`, { headers: bearer(other) });
  assert.equal(refused.status, 429);
  assert.equal(refused.body.error.type, 'requests');
});

test('aborted tool requests give their money reservation back: a paying organisation is not refused after 50', async () => {
  // Before the fix, each aborted tool request kept the estimated cost of the organisation's costliest
  // request reserved on the node for good, so its slice ran dry and it was refused with 401.
  const { key } = await gw.fundedKey({ tier: 'paid', creditMicros: 200_000 });
  // One costly request (~8,000 prompt tokens at $5/Mtok: ~$0.04) sets the reservation per request.
  const big = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('word '.repeat(8000), 'demo-chat-pro') });
  assert.equal(big.status, 200, big.text);
  // Vector stores: their edge budget (120 a minute) has room for 50 after the test above.
  for (let i = 0; i < 50; i++) await abortOnceHeld(`/v1/vector_stores/hold-${i}`, 'GET', key);
  const after = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody('still paying') });
  assert.equal(after.status, 200, after.text);
});

test('a known-length answer to a client that stops reading for 2 s is delivered whole and billed in full', async () => {
  // Before the fix, a tryEnd that finished inside onWritable never resumed the paused upstream: the
  // usage row said 500 with cost 0.
  const { key, keyId } = await gw.fundedKey({ tier: 'free' });
  const input = 'Read this aloud, slowly.';
  const body = JSON.stringify({ model: 'up-speech', input, voice: 'alloy' });
  const received = await new Promise<number>((resolve, reject) => {
    const sock = connect(Number(node.address.split(':')[1]), '127.0.0.1');
    let bytes = 0;
    let headerDone = false;
    let head = '';
    sock.on('error', reject);
    sock.on('connect', () => {
      sock.write(`POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      sock.pause();
      // A slow client: reads nothing for 2 s, then drains everything.
      setTimeout(() => sock.resume(), 2000);
    });
    sock.on('data', (c: Buffer) => {
      if (!headerDone) {
        head += c.toString('latin1');
        const i = head.indexOf('\r\n\r\n');
        if (i === -1) return;
        headerDone = true;
        assert.match(head, /^HTTP\/1\.1 200/);
        bytes = Buffer.byteLength(head, 'latin1') - (i + 4);
      } else bytes += c.length;
      if (bytes >= SPEECH_BYTES) {
        sock.destroy();
        resolve(bytes);
      }
    });
    sock.on('close', () => resolve(bytes));
  });
  assert.equal(received, SPEECH_BYTES);
  const [row] = await waitForUsageRows(cp.dbPath, keyId, 1);
  assert.equal(row.status, 200);
  assert.equal(row.cost_micros, Math.ceil((input.length * 15_000) / 1000));
});

test('a client that aborts before the upstream answered is billed its prompt and recorded as 499', async () => {
  // Before the fix, such a request was recorded with cost 0: aborting just before the end was free.
  const { key, keyId } = await gw.fundedKey({ tier: 'free' });
  await abortOnceHeld('/v1/chat/completions', 'POST', key, JSON.stringify({ model: 'up-chat', messages: [{ role: 'user', content: 'hold' }] }));
  const [row] = await waitForUsageRows(cp.dbPath, keyId, 1);
  assert.equal(row.status, 499);
  assert.ok(row.prompt_tokens > 0, 'the prompt is billed');
  assert.ok(row.cost_micros > 0);
});

test('every answer after authentication carries the rate headers: 404, 405, 413, 400 and the blocked organisation 401', async () => {
  // Before the fix, the 413 and the blocked organisation's 401 had no x-ratelimit-* headers.
  const { key, orgId } = await gw.fundedKey({ tier: 'free' });
  const expectHeaders = (r: { status: number; text: string; headers: Headers }, what: string) => {
    assert.equal(r.headers.get('x-ratelimit-limit-requests'), '20', `${what}: ${r.status} ${r.text}`);
    assert.ok(r.headers.get('x-ratelimit-remaining-requests') !== null, what);
    assert.equal(r.headers.get('x-ratelimit-limit-tokens'), '60000', what);
    assert.match(r.headers.get('x-ratelimit-reset-requests') ?? '', /^\d+(\.\d+)?m?s$/, what);
    assert.match(r.headers.get('x-ratelimit-reset-tokens') ?? '', /^\d+(\.\d+)?m?s$/, what);
  };
  const notFound = await request(`${node.url}/v1/nope`, { headers: bearer(key) });
  assert.equal(notFound.status, 404);
  expectHeaders(notFound, '404');
  const wrongMethod = await request(`${node.url}/v1/chat/completions`, { method: 'GET', headers: bearer(key) });
  assert.equal(wrongMethod.status, 405);
  expectHeaders(wrongMethod, '405');
  const badJson = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body: '{"model":' });
  assert.equal(badJson.status, 400);
  expectHeaders(badJson, '400');
  const tooLarge = await rawRequest(node.address, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${40 * 1024 * 1024}\r\n\r\n`);
  assert.equal(tooLarge.status, 413);
  assert.match(tooLarge.text, /x-ratelimit-limit-requests: 20\r\n/i);

  await admin.setOrgCap({ orgId, capMicros: 0 });
  await eventually(async () => (await request(`${node.url}/v1/models`, { headers: bearer(key) })).status === 401, 'the cap to block the organisation');
  const blocked = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody() });
  assert.equal(blocked.status, 401);
  assert.equal(blocked.body.error.type, 'insufficient_quota');
  expectHeaders(blocked, 'blocked 401');
  // A limit header is never a lie: a blocked key's remaining count is what the key has left, not more.
  assert.ok(Number(blocked.headers.get('x-ratelimit-remaining-requests')) <= 20);
  await sleep(0);
});
