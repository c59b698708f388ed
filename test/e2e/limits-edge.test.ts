// Edge budgets per client IP and body caps, over HTTP against a real node whose clock is injected.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { gatewayFixture, assertShapeA } from '../helpers/gateway-fixture.js';
import { type DataPlane } from '../helpers/processes.js';
import { bearer, minuteStart, rawRequest, request, setClock } from '../helpers/http.js';

let node: DataPlane;
let clock = 0;

gatewayFixture({ node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } } }, async (gw) => {
  node = gw.node;
  clock = minuteStart() + 5_000;
  await setClock(node.adminUrl!, { now_ms: clock });
});

/** Moves the node's clock past every open edge window so each test starts fresh. */
async function freshWindows(): Promise<void> {
  clock += 61_000;
  await setClock(node.adminUrl!, { now_ms: clock });
}

function assertEdge429(res: { status: number; headers: Headers; body: any }, retryAfter: number): void {
  // Shape A without `param`: type api_error, code "429".
  assertShapeA(res, 429, { type: 'api_error', param: 'absent' });
  assert.equal(res.headers.get('retry-after'), String(retryAfter));
}

test('the 13th credential-less request in a window is refused, retry-after counts down, the window resets', async () => {
  await freshWindows();
  for (let i = 0; i < 12; i++) {
    const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: {} });
    assert.equal(res.status, 401, `request ${i + 1} passes the edge and is refused by the gateway`);
  }
  assertEdge429(await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: {} }), 60);
  await setClock(node.adminUrl!, { advance_ms: 20_000 });
  assertEdge429(await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: {} }), 40);
  await setClock(node.adminUrl!, { advance_ms: 39_500 });
  assertEdge429(await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: {} }), 1);
  await setClock(node.adminUrl!, { advance_ms: 500 });
  const reset = await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: {} });
  assert.equal(reset.status, 401, 'a new window admits again');
  clock += 60_000;
});

test('any of Authorization, x-api-key or api-key counts as presenting a credential (600 per minute)', async () => {
  for (const header of ['authorization', 'x-api-key', 'api-key']) {
    await freshWindows();
    for (let i = 0; i < 13; i++) {
      const res = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { [header]: 'Bearer nope' }, json: {} });
      assert.equal(res.status, 401, `${header}: request ${i + 1} is over the anonymous budget but within the credentialed one`);
    }
  }
  await freshWindows();
  const empty = await Promise.all(
    Array.from({ length: 13 }, () => request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { 'x-api-key': '' }, json: {} })),
  );
  assert.equal(empty.filter((r) => r.status === 429).length, 1, 'an empty header is no credential');
});

test('the credentialed budget refuses the 601st request in a window', async () => {
  await freshWindows();
  for (let i = 0; i < 600; i += 50) {
    const batch = await Promise.all(
      Array.from({ length: 50 }, () => request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer('sk-tollgate-unknown'), json: {} })),
    );
    assert.ok(batch.every((r) => r.status === 401));
  }
  assertEdge429(await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer('sk-tollgate-unknown'), json: {} }), 60);
});

const pathBudgets: Array<[string, string, number]> = [
  ['GET', '/v1/audio/voices', 120],
  ['POST', '/v1/audio/speech', 60],
  ['POST', '/v1/files', 60],
  ['GET', '/v1/models', 120],
  ['POST', '/v1/route', 120],
  // Before: sub-paths of /v1/route and /v1/files-prefixed names were routed as tools but not budgeted as such.
  ['POST', '/v1/route/x', 120],
  ['POST', '/v1/filesystem', 60],
  ['GET', '/v1/models/demo-chat', 120],
  ['GET', '/v1/realtime', 60],
];

for (const [method, path, limit] of pathBudgets) {
  test(`${path} has its own budget of ${limit} per minute on top of the general one`, async () => {
    await freshWindows();
    for (let i = 0; i < limit; i += 20) {
      const n = Math.min(20, limit - i);
      const batch = await Promise.all(
        Array.from({ length: n }, () => request(`${node.url}${path}`, { method, headers: bearer('sk-tollgate-unknown') })),
      );
      assert.ok(batch.every((r) => r.status !== 429), `within ${limit}: ${batch.map((r) => r.status).join(',')}`);
    }
    const over = await request(`${node.url}${path}`, { method, headers: bearer('sk-tollgate-unknown') });
    assertEdge429(over, 60);
    // Another path is still open: only the spent budget refuses.
    const other = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer('sk-tollgate-unknown'), json: {} });
    assert.equal(other.status, 401);
  });
}

const MB = 1024 * 1024;
const caps: Array<[string, number, string]> = [
  ['/v1/chat/completions', 32 * MB, 'A'],
  ['/v1/audio/transcriptions', 200 * MB, 'A'],
  ['/v1/files', 256 * MB, 'B'],
  ['/v1/files/file-1', 256 * MB, 'B'],
  // Before: /v1/filesX was routed to the files backend but capped at 32 MB.
  ['/v1/filesystem', 256 * MB, 'B'],
  ['/v1/pdf', 64 * MB, 'B'],
  ['/v1/route/x', 64 * MB, 'B'],
  ['/v1/models/demo-chat', 64 * MB, 'A'],
];

for (const [path, cap, shape] of caps) {
  test(`a declared body over ${cap / MB} MB on ${path} gets 413 before it is read; ${cap / MB} MB passes the cap`, async () => {
    await freshWindows();
    const addr = node.url.replace('http://', '');
    // The Content-Length lies: no body follows, so only a check made before reading can answer.
    const head = (len: number) =>
      `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-tollgate-unknown\r\nContent-Type: application/json\r\nContent-Length: ${len}\r\n\r\n`;
    const res = await rawRequest(addr, head(cap + 1));
    assert.equal(res.status, 413);
    const body = JSON.parse(res.text.slice(res.text.indexOf('\r\n\r\n') + 4));
    if (shape === 'A') {
      assert.equal(body.error.code, '413');
      assert.equal(typeof body.error.message, 'string');
    } else {
      assert.equal(body.error.code, 'payload_too_large');
    }
    // At the cap the request gets past the edge to the credential check.
    assert.equal((await rawRequest(addr, head(cap))).status, 401);
  });
}
