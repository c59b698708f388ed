// Request bodies and validation, end to end: what reaches the upstream is exactly what was checked and
// billed; malformed chat messages are refused with the parameter named; models.retrieve works the
// OpenAI SDK's way; JSON bodies cannot exhaust a node's memory.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { scrapeMetrics } from '../helpers/prometheus.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer, rawRequest, request } from '../helpers/http.js';
import { startDataPlane, type ControlPlane, type DataPlane } from '../helpers/processes.js';

let cp: ControlPlane;
let node: DataPlane;
let upstream: FakeUpstream;
let paidKey: string;

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => addUpstreamModel(cfg, 'up-chat', upstream.baseUrl)),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
      },
    };
  },
  async (g) => {
    ({ cp, node } = g);
    paidKey = (await g.fundedKey({ tier: 'paid', creditMicros: 10_000_000 })).key;
  },
);
after(async () => {
  await upstream?.close();
});

function chatRaw(key: string, text: string) {
  return request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body: text });
}

test('a body with a repeated key is refused: the upstream never runs a model other than the one billed', async () => {
  // Before the fix, {"model":"a",…,"model":"b"} was checked and billed as "b" but forwarded as sent, so
  // an upstream that keeps the first key ran "a".
  const before = upstream.requests.length;
  const rows: Array<[string, string]> = [
    ['{"model":"demo-chat-pro","messages":[{"role":"user","content":"x"}],"model":"up-chat"}', 'model'],
    ['{"model":"up-chat","messages":[{"role":"user","content":"x","role":"system"}]}', 'messages.[0].role'],
  ];
  for (const [body, param] of rows) {
    const r = await chatRaw(paidKey, body);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.body.error.type, 'invalid_request_error');
    assert.equal(r.body.error.param, param);
    assert.equal(r.body.error.code, '400');
  }
  const ok = await chatRaw(paidKey, '{"model":"up-chat","messages":[{"role":"user","content":"x"}]}');
  assert.equal(ok.status, 200, ok.text);
  assert.equal(upstream.requests.length, before + 1, 'only the valid request reached the upstream');
  assert.equal(upstream.requests.at(-1)!.body.model, 'upstream-up-chat');
});

test('chat messages are checked: an object with a string role, content a string, parts or null where allowed', async () => {
  const before = upstream.requests.length;
  const rows: Array<[unknown, string]> = [
    [['hello'], 'messages.[0]'],
    [[{ content: 'x' }], 'messages.[0].role'],
    [[{ role: 'user', content: 'a' }, { role: 'user', content: 42 }], 'messages.[1].content'],
    [[{ role: 'user', content: null }], 'messages.[0].content'],
  ];
  for (const [messages, param] of rows) {
    const r = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(paidKey), json: { model: 'up-chat', messages } });
    assert.equal(r.status, 400, JSON.stringify(messages));
    assert.equal(r.body.error.param, param);
    assert.match(r.body.error.message, new RegExp(param.replace(/[.[\]]/g, '\\$&')));
  }
  const parts = await request(`${node.url}/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(paidKey),
    json: { model: 'up-chat', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c1', content: 'done' }] },
  });
  assert.equal(parts.status, 200, parts.text);
  assert.equal(upstream.requests.length, before + 1);
  const wrongKind = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(paidKey), json: { model: 'demo-embed', messages: [{ role: 'user', content: 'x' }] } });
  assert.equal(wrongKind.status, 400);
  assert.match(wrongKind.body.error.message, /is an embeddings model/);
});

test('models.retrieve answers the model object, or 404 in the model endpoints\' shape', async () => {
  const free = await gw.fundedKey({ tier: 'free' });
  const client = new OpenAI({ apiKey: free.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const m = await client.models.retrieve('demo-chat');
  assert.deepEqual({ id: m.id, object: m.object, owned_by: m.owned_by }, { id: 'demo-chat', object: 'model', owned_by: 'tollgate' });
  assert.equal(typeof m.created, 'number');
  for (const id of ['no-such-model', 'demo-chat-pro' /* paid plan only */]) {
    await assert.rejects(client.models.retrieve(id), (err: unknown) => {
      assert.ok(err instanceof OpenAI.NotFoundError, String(err));
      const e = (err as InstanceType<typeof OpenAI.NotFoundError>).error as Record<string, unknown>;
      assert.equal(e.type, 'invalid_request_error');
      assert.equal(e.param, 'model');
      assert.equal(e.code, '404');
      return true;
    });
  }
  const wrongMethod = await request(`${node.url}/v1/models/demo-chat`, { method: 'DELETE', headers: bearer(free.key) });
  assert.equal(wrongMethod.status, 405);
  assert.equal(wrongMethod.headers.get('allow'), 'GET');
});

/** Resident memory of a process, in bytes. */
function rssOf(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) * 1024;
}

/** Sends a huge body as fast as the node takes it, until the node answers or closes. */
function pushHugeBody(path: string, key: string, bytes: number, chunked: boolean): Promise<string> {
  return new Promise((resolve) => {
    const sock = connect(Number(node.address.split(':')[1]), '127.0.0.1');
    let answer = '';
    let sent = 0;
    const chunk = Buffer.alloc(1024 * 1024, 0x61);
    const framing = chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${bytes}`;
    const pump = () => {
      while (sent < bytes && !sock.destroyed) {
        sent += chunk.length;
        const data = chunked ? Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]) : chunk;
        if (!sock.write(data)) return void sock.once('drain', pump);
      }
    };
    sock.on('connect', () => {
      sock.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\n${framing}\r\n\r\n{"model":"demo-speech","input":"`);
      pump();
    });
    sock.on('data', (c: Buffer) => {
      answer += c.toString('latin1');
      if (/\r\n\r\n[\s\S]*\}/.test(answer)) sock.destroy();
    });
    sock.on('error', () => {});
    sock.on('close', () => resolve(answer));
  });
}

test('20 concurrent 150 MiB speech bodies: node memory stays bounded and other requests are served', async () => {
  // Before the fix, /v1/audio/speech read JSON bodies up to the audio path's 200 MiB cap, whole, before
  // the key's limits applied: 20 of them held gigabytes.
  const pid = node.proc.child.pid!;
  const baseline = rssOf(pid);
  let peak = baseline;
  const sampler = setInterval(() => (peak = Math.max(peak, rssOf(pid))), 20);
  const latencies: number[] = [];
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const t0 = performance.now();
      const r = await request(`${node.url}/v1/models`, { headers: bearer(paidKey) });
      latencies.push(performance.now() - t0);
      assert.equal(r.status, 200);
      await new Promise((res) => setTimeout(res, 50));
    }
  })();
  const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => pushHugeBody('/v1/audio/speech', paidKey, 150 * 1024 * 1024, i % 2 === 1)));
  polling = false;
  await poller;
  clearInterval(sampler);
  // Each is refused before its body is read: a 413, unless the node's close (uWS closes a connection
  // whose client keeps sending a refused body) reset the socket before the client read the answer.
  for (const a of answers) if (a !== '') assert.match(a, /^HTTP\/1\.1 413[\s\S]*"type":"invalid_request_error"/, a.slice(0, 300));
  // A client that waits for the answer before sending its body reads the 413 in Shape A.
  const declared = await rawRequest(node.address, `POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${paidKey}\r\nContent-Type: application/json\r\nContent-Length: ${150 * 1024 * 1024}\r\n\r\n`);
  assert.equal(declared.status, 413);
  assert.match(declared.text, /"type":"invalid_request_error","param":null,"code":"413"/);
  latencies.sort((a, b) => a - b);
  const p99 = latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * 0.99))];
  assert.ok(latencies.length >= 1);
  // A liveness bound, not a speed target (those live in benchmarks): before the fix the node stalled
  // for seconds; 500 ms leaves room for a loaded test machine.
  assert.ok(p99 < 500, `GET /v1/models p99 ${p99.toFixed(1)} ms`);
  assert.ok(peak < 400 * 1024 * 1024, `node RSS peaked at ${(peak / 2 ** 20).toFixed(0)} MiB`);
  // The key's slots all came back: a normal request still works.
  const ok = await request(`${node.url}/v1/audio/speech`, { method: 'POST', headers: bearer(paidKey), json: { model: 'demo-speech', input: 'hello', voice: 'alloy' } });
  assert.equal(ok.status, 200);
});

/** A paid key of its own organisation, with credit, known to `node`. */
async function fundedKey(node: DataPlane): Promise<string> {
  return (await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000, knownOn: [node] })).key;
}

// Large in bytes, small in tokens (the bulk is a field that is not prompt), so tpm slices play no part.
const BIG_BODY = JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'hi' }], user: 'y'.repeat(2 * 1024 * 1024 - 100) });

/**
 * A client that declares BIG_BODY's length, sends all of it but the last 1,000 bytes and waits: the
 * node holds what arrived (the budget is taken as bytes arrive, issue 21).
 */
function slowClient(node: DataPlane, key: string) {
  const sock = connect(Number(node.address.split(':')[1]), '127.0.0.1');
  sock.on('error', () => {});
  let answer = '';
  sock.on('data', (c: Buffer) => (answer += c.toString()));
  sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BIG_BODY)}\r\n\r\n`);
  sock.write(BIG_BODY.slice(0, -1000));
  return {
    sock,
    answer: () => answer,
    /** Sends the rest and resolves with the whole answer. */
    finish: () => {
      sock.write(BIG_BODY.slice(-1000));
      return new Promise<string>((resolve) => {
        const check = () => (/\r\n\r\n\{/.test(answer) ? resolve(answer) : setTimeout(check, 10));
        check();
      });
    },
  };
}

const postBig = (node: DataPlane, key: string) =>
  request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body: BIG_BODY });

/** Posts BIG_BODY until the node answers 503 (the slow clients' budget is taken once they are read). */
async function until503(node: DataPlane, key: string) {
  for (let i = 0; i < 200; i++) {
    const r = await postBig(node, key);
    if (r.status === 503) return r;
    await new Promise((res) => setTimeout(res, 10));
  }
  return undefined;
}

test('the node-wide body budget refuses a body that does not fit with 503 and retry-after, and frees on completion', async (t) => {
  // 8 MiB: each organisation may hold a quarter, so four organisations' slow 2 MiB bodies fill it.
  const small = await startDataPlane(cp, { adminListen: true, extraArgs: ['--max-buffered-body-mib', '8'] });
  t.after(() => small.proc.kill('SIGKILL'));
  const keys = [];
  for (let i = 0; i < 5; i++) keys.push(await fundedKey(small));
  const slow = keys.slice(0, 4).map((k) => slowClient(small, k));
  // The budget is taken as bytes arrive: wait until the node holds what the slow clients sent.
  const sent = 4 * (Buffer.byteLength(BIG_BODY) - 1000);
  await eventually(async () => (await scrapeMetrics(`${small.adminUrl}/metrics`)).value('tollgate_node_body_buffered_bytes')! >= sent, `the node to hold the ${sent} bytes the slow clients sent`, 30_000);
  const refused = await until503(small, keys[4]);
  assert.ok(refused, 'a body that does not fit the node-wide budget is refused');
  assert.equal(refused.headers.get('retry-after'), '1');
  assert.equal(refused.body.error.type, 'api_error');
  assert.equal(refused.body.error.code, '503');
  // The slow bodies finish: they are served, and the budget is free again.
  for (const a of await Promise.all(slow.map((s) => s.finish()))) assert.match(a, /^HTTP\/1\.1 200/);
  for (const s of slow) s.sock.destroy();
  const after = await postBig(small, keys[4]);
  assert.equal(after.status, 200, after.text);
});

test('one organisation holding slow bodies cannot take the node-wide budget from the others', async (t) => {
  // Before the fix, one organisation's slow clients (a key may run 100 in parallel) could hold the
  // whole budget, and every other organisation's JSON requests were refused with 503.
  const small = await startDataPlane(cp, { adminListen: true, extraArgs: ['--max-buffered-body-mib', '8'] });
  t.after(() => small.proc.kill('SIGKILL'));
  const hog = await fundedKey(small);
  const other = await fundedKey(small);
  const slow = [0, 1, 2, 3].map(() => slowClient(small, hog));
  // The budget is taken as bytes arrive: one slow body holds the share, the three others are refused.
  await eventually(async () => slow.filter((s) => /^HTTP\/1\.1 503/.test(s.answer())).length === 3, 'three slow bodies to be refused');
  const sent = Buffer.byteLength(BIG_BODY) - 1000;
  await eventually(async () => (await scrapeMetrics(`${small.adminUrl}/metrics`)).value('tollgate_node_body_buffered_bytes')! >= sent, 'the node to hold the fourth', 30_000);
  // The first slow body fits the hog's share (a quarter of the budget); its next ones are refused.
  const refused = await until503(small, hog);
  assert.ok(refused, "the organisation's own share is spent");
  assert.match(refused.body.error.message, /organisation/);
  const served = await postBig(small, other);
  assert.equal(served.status, 200, served.text);
  for (const s of slow) s.sock.destroy();
});
