// Tool endpoints against live FastAPI-style backends: Shape C answers pass through unchanged, the
// gateway's own failures are Shape B with the right status, a stopped or hanging backend gives 502
// `upstream_unreachable` (after the configured timeout), two backends with one stopped still answer
// every request, what the backend sees (credentials gone, caller ids added), and a config reload that
// changes backends without dropping a request in flight.
import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { writeFileSync } from 'node:fs';
import { after, test } from 'node:test';
import { configYaml } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { startFastApiBackend, SERVER_ERROR, VALIDATION_ERROR, type FastApiBackend } from '../helpers/fastapi-backend.js';
import { rawRequest } from '../helpers/http.js';
import { runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';

let main: FastApiBackend;
let second: FastApiBackend;
let stopped: FastApiBackend;
/** Stopped too, and used by /v1/vector_stores only, so its first refusal happens in that test. */
let stoppedFirst: FastApiBackend;
let hanging: FastApiBackend;
let cp: ControlPlane;
let node: DataPlane;
let caller: DemoKey;

const HEADER_TIMEOUT_MS = 1500;

function gatewayConfig(backends: { files: string[] }): string {
  return configYaml((cfg) => {
    cfg.tool_backends = [
      { prefix: '/v1/files', base_urls: backends.files, connect_timeout_ms: 2000, header_timeout_ms: 10_000, idle_timeout_ms: 10_000 },
      { prefix: '/v1/pdf', base_url: main.baseUrl, timeout_ms: 10_000 },
      // Old form: one base_url and one timeout.
      { prefix: '/v1/route', base_url: stopped.baseUrl, timeout_ms: 5000 },
      { prefix: '/v1/sandbox', base_urls: [hanging.baseUrl], header_timeout_ms: HEADER_TIMEOUT_MS },
      { prefix: '/v1/vector_stores', base_urls: [stoppedFirst.baseUrl, main.baseUrl], connect_timeout_ms: 2000 },
    ];
    cfg.tiers.tools = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };
    cfg.trusted_proxies = ['127.0.0.0/8'];
  });
}

const gw = gatewayFixture(
  async () => {
    [main, second, stopped, hanging, stoppedFirst] = await Promise.all(['main', 'second', 'stopped', 'hanging', 'stopped-first'].map((n) => startFastApiBackend(n)));
    hanging.hang = true;
    await Promise.all([stopped.close(), stoppedFirst.close()]);
    return { controlPlane: { configYaml: gatewayConfig({ files: [main.baseUrl] }) } };
  },
  async (g) => {
    ({ cp, node } = g);
    caller = await g.fundedKey({ tier: 'tools' });
  },
);
after(async () => {
  await Promise.all([main?.close(), second?.close(), hanging?.close()]);
});

// Each request comes from a client of its own behind the trusted proxy, so edge budgets never interfere.
let clients = 0;
function from(): Record<string, string> {
  clients++;
  return { 'x-forwarded-for': `100.64.${clients >> 8}.${clients & 255}` };
}

async function call(path: string, init: { method?: string; headers?: Record<string, string>; body?: string | Buffer; auth?: boolean } = {}) {
  const res = await fetch(`${node.url}${path}`, {
    method: init.method ?? 'GET',
    headers: { ...(init.auth === false ? {} : { authorization: `Bearer ${caller.key}` }), ...from(), ...init.headers },
    body: init.body as BodyInit | undefined,
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: (() => { try { return JSON.parse(text); } catch { return undefined; } })() };
}

function assertShapeB(r: { status: number; json: any; text: string }, status: number, code: string): void {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json), ['error'], r.text);
  assert.deepEqual(Object.keys(r.json.error).sort(), ['code', 'message']);
  assert.equal(r.json.error.code, code);
  assert.equal(typeof r.json.error.message, 'string');
  // No stack trace, internal address or backend URL.
  assert.doesNotMatch(r.json.error.message, /127\.0\.0\.1|localhost|http:\/\/|\bat .*\.ts:\d+/);
}

test("the backend's 404 for a mistyped sub-path, its 422 and its 500 reach the client unchanged", { timeout: 60_000 }, async () => {
  const rows: Array<[string, number, unknown]> = [
    ['/v1/files/x/nope', 404, { detail: 'Not Found' }],
    ['/v1/files/validate', 422, VALIDATION_ERROR],
    ['/v1/files/boom', 500, SERVER_ERROR],
  ];
  for (const [path, status, body] of rows) {
    const r = await call(path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    assert.equal(r.status, status, `${path}: ${r.text}`);
    assert.equal(r.text, JSON.stringify(body), `${path}: the body is passed through byte for byte`);
    assert.equal(r.headers.get('content-type'), 'application/json');
    assert.equal(r.headers.get('x-backend'), 'main', 'response headers pass through');
  }
});

test('a stopped backend gives 502 upstream_unreachable', { timeout: 60_000 }, async () => {
  const r = await call('/v1/route', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"input":"hi"}' });
  assertShapeB(r, 502, 'upstream_unreachable');
});

test('a backend that hangs before its headers gives 502 after the configured header timeout', { timeout: 60_000 }, async () => {
  const started = Date.now();
  const r = await call('/v1/sandbox/run', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"code":"1"}' });
  const took = Date.now() - started;
  assertShapeB(r, 502, 'upstream_unreachable');
  assert.match(r.json.error.message, /in time/);
  assert.ok(took >= HEADER_TIMEOUT_MS - 100, `answered after ${took} ms, before the ${HEADER_TIMEOUT_MS} ms timeout`);
  assert.ok(took < HEADER_TIMEOUT_MS + 8000, `answered after ${took} ms`);
  assert.ok(hanging.requests.length >= 1, 'the request reached the hanging backend');
});

test('with two backends, one stopped, every request still succeeds', { timeout: 60_000 }, async () => {
  main.clear();
  // The first request goes to the stopped backend first (round robin starts there): refused before a
  // byte of its body was sent, it moves on to the live one with its body whole.
  const body = JSON.stringify({ text: 'x'.repeat(100_000) });
  const first = await call('/v1/vector_stores/vs_1/texts', { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  assert.equal(first.status, 404, first.text);
  assert.equal(first.headers.get('x-backend'), 'main');
  assert.equal(main.requests.length, 1);
  assert.equal(main.requests[0].body, body, 'the body reached the live backend whole');
  main.clear();
  for (let i = 0; i < 12; i++) {
    const r = await call(`/v1/vector_stores?i=${i}`);
    // The fixture answers unknown paths with its own 404: what matters is that the live backend answered.
    assert.equal(r.status, 404, r.text);
    assert.deepEqual(r.json, { detail: 'Not Found' });
    assert.equal(r.headers.get('x-backend'), 'main');
  }
  assert.equal(main.requests.length, 12, 'every request reached the live backend');
});

test('every Shape B code over HTTP', { timeout: 60_000 }, async () => {
  assertShapeB(await call('/v1/files', { auth: false }), 401, 'invalid_api_key');
  assertShapeB(await call('/v1/files', { auth: false, headers: { authorization: 'Bearer sk-tollgate-notakey' } }), 401, 'invalid_api_key');
  assertShapeB(await call('/v1/nothing-here'), 404, 'not_found');
  assertShapeB(await call('/v1/files/a%2F..%2Fb'), 400, 'bad_path');
  assertShapeB(await call('/v1/files//double'), 400, 'bad_path');
  // No backend configured for a tool family: the router cannot reach one.
  assertShapeB(await call('/v1/skills'), 502, 'upstream_unreachable');
  // Over the cap, by Content-Length (64 MiB on /v1/pdf), answered before the body is read.
  const head = [
    'POST /v1/pdf HTTP/1.1',
    'Host: gateway.test',
    `Authorization: Bearer ${caller.key}`,
    'Content-Type: text/html',
    `Content-Length: ${64 * 1024 * 1024 + 1}`,
    'Connection: close',
  ].join('\r\n');
  const raw = await rawRequest(node.address, `${head}\r\n\r\n`);
  assert.equal(raw.status, 413);
  const body = JSON.parse(raw.text.slice(raw.text.indexOf('\r\n\r\n') + 4));
  assert.equal(body.error.code, 'payload_too_large');
});

test('a chunked body over the cap is cut at the cap: 413 payload_too_large, and the backend gets no complete request', { timeout: 60_000 }, async () => {
  main.clear();
  const cap = 64 * 1024 * 1024;
  const chunk = Buffer.alloc(1024 * 1024, 0x62);
  let sent = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(ctrl) {
      if (sent > cap + 4 * chunk.length) return ctrl.close();
      sent += chunk.length;
      ctrl.enqueue(chunk);
    },
  });
  const res = await fetch(`${node.url}/v1/vector_stores/vs_1/texts`, {
    method: 'POST',
    headers: { authorization: `Bearer ${caller.key}`, 'content-type': 'application/octet-stream', ...from() },
    body,
    duplex: 'half',
  } as RequestInit).catch((err: Error) => err);
  if (!(res instanceof Error)) {
    // The node may also reset the connection once it answered; when the answer arrives it is a 413.
    assert.equal(res.status, 413);
    assert.equal((await res.json()).error.code, 'payload_too_large');
  }
  assert.ok(main.requests.every((r) => r.path !== '/v1/vector_stores/vs_1/texts'), 'the backend never got the request whole');
});

test('what the backend sees: no credentials or hop-by-hop headers, our request id and the caller ids; client headers otherwise unchanged', { timeout: 60_000 }, async () => {
  main.clear();
  const r = await call('/v1/files?limit=2', {
    headers: {
      'x-api-key': caller.key,
      'api-key': caller.key,
      'x-tollgate-key-id': 'key_spoofed',
      'x-tollgate-org-id': 'org_spoofed',
      'x-request-id': 'client-chosen',
      'x-custom': 'kept',
      'accept-language': 'fr',
      'proxy-authorization': 'Basic Zm9vOmJhcg==',
    },
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(main.requests.length, 1);
  const got = main.requests[0];
  assert.equal(got.path, '/v1/files?limit=2');
  const h = got.headers;
  for (const name of ['authorization', 'x-api-key', 'api-key', 'proxy-authorization']) assert.equal(h[name], undefined, `${name} is not forwarded`);
  assert.ok(!JSON.stringify(got.rawHeaders).includes(caller.key), 'the key appears in no header the backend sees');
  assert.equal(h['x-tollgate-key-id'], caller.keyId);
  assert.equal(h['x-tollgate-project-id'], caller.projectId);
  assert.equal(h['x-tollgate-org-id'], caller.orgId);
  assert.match(String(h['x-request-id']), /^\S+$/);
  assert.notEqual(h['x-request-id'], 'client-chosen');
  assert.equal(h['x-custom'], 'kept');
  assert.equal(h['accept-language'], 'fr');
  // Exactly one line of each gateway header.
  for (const name of ['x-tollgate-key-id', 'x-tollgate-org-id', 'x-request-id', 'x-forwarded-for']) {
    assert.equal(got.rawHeaders.filter((_, i) => i % 2 === 0 && got.rawHeaders[i].toLowerCase() === name).length, 1, name);
  }
});

test('a request body streams to the backend with its method and content-length unchanged', { timeout: 60_000 }, async () => {
  const payload = Buffer.alloc(3 * 1024 * 1024 + 7, 0x63);
  const r = await call('/v1/files/upload', { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: payload });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.bytes, payload.length);
  const got = main.requests.at(-1)!;
  assert.equal(got.method, 'POST');
  assert.equal(got.headers['content-length'], String(payload.length));
});

test('tollgate config reload changes backends without dropping a request in flight', { timeout: 60_000 }, async () => {
  main.clear();
  // A download held open by the current backend.
  const inflight = fetch(`${node.url}/v1/files/held`, { headers: { authorization: `Bearer ${caller.key}`, ...from() } });
  await main.waitForRequests(1);
  const res = await inflight;
  assert.equal(res.headers.get('x-backend'), 'main');
  const reader = res.body!.getReader();
  const first = await reader.read();
  assert.equal(Buffer.from(first.value!).toString(), 'first chunk\n');

  writeFileSync(cp.configPath!, gatewayConfig({ files: [second.baseUrl] }));
  const reload = await runCliAsync(cp, cp.secrets.operatorToken, ['config', 'reload']);
  assert.equal(reload.code, 0, reload.stderr);
  // New requests go to the new backend as soon as the node has the new config.
  const deadline = Date.now() + 10_000;
  let now = await call('/v1/files');
  while (now.headers.get('x-backend') !== 'second' && Date.now() < deadline) now = await call('/v1/files');
  assert.equal(now.headers.get('x-backend'), 'second');

  // The request in flight on the old backend finishes whole.
  main.release();
  let rest = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    rest += Buffer.from(value).toString();
  }
  assert.equal(rest, 'last chunk\n');
});

test('/v1/pdf HTML with a remote reference is refused with 400 and a Shape C detail naming it, before the backend sees it', { timeout: 60_000 }, async () => {
  main.clear();
  const refused = await call('/v1/pdf/render', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ html: '<p>Hi</p><IMG SRC = "HTTPS://tracker.example/p.gif">' }) });
  assert.equal(refused.status, 400, refused.text);
  assert.deepEqual(Object.keys(refused.json), ['detail']);
  assert.equal(typeof refused.json.detail, 'string');
  assert.match(refused.json.detail, /img src/);
  assert.match(refused.json.detail, /HTTPS:\/\/tracker\.example\/p\.gif/);
  const asHtml = await call('/v1/pdf', { method: 'POST', headers: { 'content-type': 'text/html' }, body: '<style>@import "//cdn.example/x.css";</style>' });
  assert.equal(asHtml.status, 400);
  assert.match(asHtml.json.detail, /@import/);
  assert.equal(main.requests.length, 0, 'the backend saw neither');

  // Local references pass, and the backend gets the body unchanged.
  const html = '<img src="data:image/png;base64,AAAA"><a href="#top">top</a><img src="img/a.png">';
  const ok = await call('/v1/pdf/render', { method: 'POST', headers: { 'content-type': 'text/html' }, body: html });
  assert.equal(ok.status, 200, ok.text);
  assert.equal(main.requests.length, 1);
  assert.equal(main.requests[0].body, html);
  assert.equal(main.requests[0].headers['content-length'], String(Buffer.byteLength(html)));
});

test('/v1/pdf bodies the guard cannot read (compressed, or in an encoding that hides the markup) never reach the backend with a remote reference', { timeout: 60_000 }, async () => {
  // Before: a gzip body with `Content-Encoding: gzip`, and an HTML document in UTF-16, were forwarded
  // unread: the guard scanned the compressed or UTF-16 bytes as UTF-8 and found nothing.
  main.clear();
  const html = '<p>Hi</p><img src="https://tracker.example/p.gif">';
  const gz = await call('/v1/pdf/render', { method: 'POST', headers: { 'content-type': 'text/html', 'content-encoding': 'gzip' }, body: gzipSync(html) });
  assert.equal(gz.status, 400, gz.text);
  assert.deepEqual(Object.keys(gz.json), ['detail']);
  assert.match(gz.json.detail, /Content-Encoding/);
  const utf16 = await call('/v1/pdf/render', { method: 'POST', headers: { 'content-type': 'text/html; charset=utf-16' }, body: Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(html, 'utf16le')]) });
  assert.equal(utf16.status, 400, utf16.text);
  assert.match(utf16.json.detail, /tracker\.example/);
  assert.equal(main.requests.length, 0, 'the backend saw neither');
  // `identity` is no encoding: such a body is read and passes when it is local.
  const ok = await call('/v1/pdf/render', { method: 'POST', headers: { 'content-type': 'text/html', 'content-encoding': 'identity' }, body: '<p>ok</p>' });
  assert.equal(ok.status, 200, ok.text);
});
