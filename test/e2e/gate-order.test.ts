// The order of checks is one for HTTP requests and WebSocket upgrades (docs/design.md#the-gate): for
// each failing condition alone, and for each pair of them, a real node answers a plain HTTP request and
// a WebSocket upgrade to the same path with the same refusal, the earlier check's. Where the two
// entrances differ on purpose (data-plane/gate/entrances.ts), the difference is checked as declared.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { minuteStart, rawRequest, setClock } from '../helpers/http.js';
import type { DataPlane } from '../helpers/processes.js';
import { attemptRealtime, isRefusal } from '../helpers/realtime.js';

let node: DataPlane;
let blockedKey = '';
let goodKey = '';
/** A loopback address whose realtime edge budget (60 attempts a minute) is spent. */
const SPENT_IP = '127.0.2.1';

const gw = gatewayFixture({ node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } } }, async (g) => {
  node = g.node;
  // The node's clock stands still during the file, so no edge window rolls over under a slow machine.
  await setClock(node.adminUrl!, { now_ms: minuteStart() + 5_000 });
  // A paid organisation with no credit has nothing to spend.
  blockedKey = (await g.fundedKey({ tier: 'paid' })).key;
  goodKey = (await g.fundedKey({ tier: 'free' })).key;
});

interface Attempt {
  path: string;
  /** The Authorization header, or null for none. */
  authorization: string | null;
  ip: string;
  protocol?: string;
}

let nextIp = 0;
/** A loopback address of its own for each attempt, so no attempt counts in another's edge budgets. */
function freshIp(): string {
  nextIp++;
  return `127.0.${3 + Math.floor(nextIp / 250)}.${1 + (nextIp % 250)}`;
}

/** What the client was told: `status type` (the 'openai' shape) or `status code` (the 'gateway' shape), or `101`. */
function answerOf(status: number, body: any): string {
  if (status === 101) return '101';
  return `${status} ${body?.error?.type ?? body?.error?.code}`;
}

async function overHttp(a: Attempt): Promise<string> {
  const lines = [`GET ${a.path}?model=demo-realtime HTTP/1.1`, 'Host: gate'];
  if (a.authorization !== null) lines.push(`Authorization: ${a.authorization}`);
  if (a.protocol) lines.push(`Sec-WebSocket-Protocol: ${a.protocol}`);
  const res = await rawRequest(node.address, `${lines.join('\r\n')}\r\n\r\n`, undefined, { localAddress: a.ip });
  const text = res.text.slice(res.text.indexOf('\r\n\r\n') + 4);
  return answerOf(res.status, JSON.parse(text));
}

async function asUpgrade(a: Attempt): Promise<string> {
  const headers: Record<string, string> = {};
  if (a.authorization !== null) headers.authorization = a.authorization;
  const r = await attemptRealtime(node.address, { path: a.path, headers, localAddress: a.ip, protocols: a.protocol ? [a.protocol] : [] });
  if (!isRefusal(r)) {
    r.ws.close();
    return '101';
  }
  return answerOf(r.status, r.body);
}

/** The failing conditions the test can make, in the order the gate checks them, with what each alone gets. */
interface Condition {
  name: string;
  answer: string;
  apply(a: Attempt): void;
  /** Conditions on the same part of the request cannot hold together. */
  exclusive?: 'path' | 'key';
}
const ORDER: Condition[] = [
  { name: 'edge budget spent', answer: '429 api_error', apply: (a) => (a.ip = SPENT_IP) },
  { name: 'bad path', answer: '400 bad_path', apply: (a) => (a.path = '/v1/realtime/a%2Fb'), exclusive: 'path' },
  { name: 'no credential', answer: '401 authentication_error', apply: (a) => (a.authorization = null), exclusive: 'key' },
  { name: 'malformed credential', answer: '401 authentication_error', apply: (a) => (a.authorization = 'Basic abc'), exclusive: 'key' },
  { name: 'unknown key', answer: '401 authentication_error', apply: (a) => (a.authorization = 'Bearer sk-tollgate-doesnotexist0000000000000000000000000'), exclusive: 'key' },
  { name: 'organisation blocked', answer: '401 insufficient_quota', apply: (a) => (a.authorization = `Bearer ${blockedKey}`), exclusive: 'key' },
  { name: 'no such endpoint', answer: '404 not_found', apply: (a) => (a.path = '/v1/realtime/nope'), exclusive: 'path' },
];

function attempt(conditions: Condition[]): Attempt {
  const a: Attempt = { path: '/v1/realtime', authorization: `Bearer ${goodKey}`, ip: freshIp() };
  for (const c of conditions) c.apply(a);
  return a;
}

/** Both entrances' answers to one attempt (each from an address of its own, unless the condition picks one). */
async function both(conditions: Condition[]): Promise<[string, string]> {
  return [await overHttp(attempt(conditions)), await asUpgrade(attempt(conditions))];
}

test('spend the edge budget of one address (60 realtime attempts a minute, HTTP and upgrades alike)', async () => {
  const statuses: string[] = [];
  for (let i = 0; i < 30; i++) {
    statuses.push(await overHttp({ path: '/v1/realtime', authorization: 'Bearer sk-tollgate-unknown', ip: SPENT_IP }));
    statuses.push(await asUpgrade({ path: '/v1/realtime', authorization: 'Bearer sk-tollgate-unknown', ip: SPENT_IP }));
  }
  assert.deepEqual(new Set(statuses), new Set(['401 authentication_error']));
  assert.deepEqual(await both([ORDER[0]]), ['429 api_error', '429 api_error']);
});

test('with nothing wrong, both pass the gate: HTTP gets the realtime endpoint’s 400, the upgrade opens', async () => {
  assert.deepEqual(await both([]), ['400 invalid_request_error', '101']);
});

test('each failing condition alone: the same refusal over HTTP and as an upgrade', async () => {
  for (const c of ORDER) assert.deepEqual(await both([c]), [c.answer, c.answer], c.name);
});

test('each pair of failing conditions: the earlier check answers, over HTTP and as an upgrade alike', async () => {
  let pairs = 0;
  for (let i = 0; i < ORDER.length; i++) {
    for (let j = i + 1; j < ORDER.length; j++) {
      const [first, second] = [ORDER[i], ORDER[j]];
      if (first.exclusive && first.exclusive === second.exclusive) continue;
      assert.deepEqual(await both([first, second]), [first.answer, first.answer], `${first.name} before ${second.name}`);
      pairs++;
    }
  }
  assert.equal(pairs, 14);
});

test('declared difference: a key offered as a subprotocol refuses an upgrade before the credential is read; HTTP ignores the header', async () => {
  const protocol = `openai-insecure-api-key.${goodKey}`;
  // Even without an Authorization header, and even ahead of a blocked organisation.
  assert.equal(await asUpgrade({ path: '/v1/realtime', authorization: null, ip: freshIp(), protocol }), '401 authentication_error');
  const r = await attemptRealtime(node.address, { key: blockedKey, localAddress: freshIp(), protocols: [protocol] });
  assert.ok(isRefusal(r));
  assert.match(r.body.error.message, /Sec-WebSocket-Protocol/);
  assert.equal(await overHttp({ path: '/v1/realtime', authorization: `Bearer ${goodKey}`, ip: freshIp(), protocol }), '400 invalid_request_error');
  // Behind the edge budget and path sanity, as every credential check.
  assert.equal(await asUpgrade({ path: '/v1/realtime', authorization: null, ip: SPENT_IP, protocol }), '429 api_error');
  assert.equal(await asUpgrade({ path: '/v1/realtime/a%2Fb', authorization: null, ip: freshIp(), protocol }), '400 bad_path');
});
