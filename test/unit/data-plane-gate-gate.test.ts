// The gate (data-plane/gate/gate.ts) against scripted node state: for every pair of failing conditions,
// which refusal comes first, for HTTP requests and for WebSocket upgrades alike; the differences
// between the two entrances exactly as gate/entrances.ts declares them; and what the node has once
// (the unknown-key sampler, the request-id counter).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { HttpResponse } from 'uWebSockets.js';
import { markDrainStarted } from '../../data-plane/drain.js';
import { HTTP, UPGRADE, type Entrance } from '../../data-plane/gate/entrances.js';
import { Gate, type GateDeps } from '../../data-plane/gate/gate.js';
import { ApiRequest } from '../../data-plane/gate/api-request.js';
import { Reply } from '../../data-plane/request/reply.js';
import { UnknownKeySampler } from '../../data-plane/request/request-log.js';
import { familyOf } from '../../data-plane/routing/path-families.js';
import { RouteTable } from '../../data-plane/routing/routes.js';

/** A uWS HttpResponse that records the answer. */
class FakeRes {
  status = '';
  body = '';
  cork(fn: () => void) {
    fn();
    return this;
  }
  writeStatus(s: string) {
    this.status = s;
    return this;
  }
  writeHeader() {
    return this;
  }
  end(body?: string) {
    this.body = body ?? '';
    return this;
  }
  tryEnd(body: Uint8Array | string) {
    this.body = typeof body === 'string' ? body : Buffer.from(body).toString();
    return [true, true];
  }
  getWriteOffset() {
    return 0;
  }
  onAborted() {
    return this;
  }
  onWritable() {
    return this;
  }
  pause() {}
  resume() {}
  close() {
    return this;
  }
}

const GOOD = 'sk-tollgate-good';
const BLOCKED = 'sk-tollgate-blocked';
const SPENT = 'sk-tollgate-spent';
const keyOf = (id: string, org: { blocked: boolean; blockedReason: string }) => ({ keyId: id, keyHash: id, orgId: `org-${id}`, projectId: 'p', org: { ...org, ownerAccountId: 'a', tier: 'free' }, limits: {} });
const KEYS: Record<string, unknown> = {
  [GOOD]: keyOf('good', { blocked: false, blockedReason: '' }),
  [BLOCKED]: keyOf('blocked', { blocked: true, blockedReason: 'balance_exhausted' }),
  [SPENT]: keyOf('spent', { blocked: false, blockedReason: '' }),
};

interface World {
  ready: boolean;
  edgeOk: boolean;
  stale: boolean;
}

function node(world: World) {
  const logged: unknown[] = [];
  const deps = {
    holder: {
      get ready() {
        return world.ready;
      },
      current: {
        lookup: (_p: Buffer, presented: string) => KEYS[presented],
        tombstone: () => undefined,
        view: { trustedProxies: [], routes: new RouteTable([]) },
      },
    },
    pepper: Buffer.alloc(32),
    clock: { now: () => 1_000_000 },
    edge: { take: () => (world.edgeOk ? { ok: true, retryAfterSec: 0 } : { ok: false, retryAfterSec: 7 }) },
    keyBudgets: { headers: () => null },
    leases: { canSpend: (orgId: string) => (orgId === 'org-spent' ? 'no' : 'yes') },
    reporter: { log: (row: unknown) => logged.push(row), touch() {} },
    isStale: () => world.stale,
    instanceId: 'n1',
  } as unknown as GateDeps;
  return { gate: new Gate(deps), logged };
}

interface Attempt {
  path: string;
  authorization: string;
  protocol: string;
  contentLength: number;
}

/** Runs the gate on one attempt; answers what the client got: `status code-or-type`, or `passed`. */
function run(gate: Gate, entrance: Entrance, a: Attempt): string {
  const res = new FakeRes();
  const r = new ApiRequest(entrance, res as unknown as HttpResponse, new Reply(res as unknown as HttpResponse), familyOf(a.path));
  r.method = 'GET';
  r.path = a.path;
  r.authorization = a.authorization;
  r.protocol = a.protocol;
  r.contentLength = a.contentLength;
  r.ip = '10.0.0.1';
  if (!gate.pass(r) || !gate.route(r)) {
    const body = JSON.parse(res.body);
    return `${res.status.split(' ')[0]} ${body.error.type ?? body.error.code}`;
  }
  return 'passed';
}

/** The failing conditions the gate checks, in the order it checks them; each one alone gives `answer`. */
type Condition = { name: string; answer: string; apply(w: World, a: Attempt): void; exclusive?: string };
const ORDER: Condition[] = [
  { name: 'not ready', answer: '503 api_error', apply: (w) => (w.ready = false) },
  { name: 'edge budget spent', answer: '429 api_error', apply: (w) => (w.edgeOk = false) },
  { name: 'bad path', answer: '400 bad_path', apply: (_w, a) => (a.path = '/v1/realtime/a%2Fb'), exclusive: 'path' },
  { name: 'no credential', answer: '401 authentication_error', apply: (_w, a) => (a.authorization = ''), exclusive: 'key' },
  { name: 'malformed credential', answer: '401 authentication_error', apply: (_w, a) => (a.authorization = 'Basic abc'), exclusive: 'key' },
  { name: 'unknown key', answer: '401 authentication_error', apply: (_w, a) => (a.authorization = 'Bearer sk-tollgate-unknown'), exclusive: 'key' },
  { name: 'stale node', answer: '401 authentication_error', apply: (w) => (w.stale = true) },
  { name: 'organisation blocked', answer: '401 insufficient_quota', apply: (_w, a) => (a.authorization = `Bearer ${BLOCKED}`), exclusive: 'key' },
  { name: 'no money', answer: '401 insufficient_quota', apply: (_w, a) => (a.authorization = `Bearer ${SPENT}`), exclusive: 'key' },
  { name: 'no such endpoint', answer: '404 not_found', apply: (_w, a) => (a.path = '/v1/realtime/nope'), exclusive: 'path' },
];

function attempt(conditions: Condition[]): { world: World; a: Attempt } {
  const world: World = { ready: true, edgeOk: true, stale: false };
  const a: Attempt = { path: '/v1/realtime', authorization: `Bearer ${GOOD}`, protocol: '', contentLength: -1 };
  for (const c of conditions) c.apply(world, a);
  return { world, a };
}

test('each condition alone gives its refusal, the same for HTTP and upgrades', () => {
  for (const c of ORDER) {
    for (const entrance of [HTTP, UPGRADE]) {
      const { world, a } = attempt([c]);
      assert.equal(run(node(world).gate, entrance, a), c.answer, `${c.name} (${entrance.name})`);
    }
  }
  const { world, a } = attempt([]);
  assert.equal(run(node(world).gate, HTTP, a), 'passed');
  assert.equal(run(node(world).gate, UPGRADE, a), 'passed');
});

test('for every pair of failing conditions the earlier check answers, for HTTP and upgrades alike', () => {
  let pairs = 0;
  for (let i = 0; i < ORDER.length; i++) {
    for (let j = i + 1; j < ORDER.length; j++) {
      const [first, second] = [ORDER[i], ORDER[j]];
      if (first.exclusive && first.exclusive === second.exclusive) continue;
      // Applied in both orders: which refusal wins never depends on how the attempt was put together.
      for (const conditions of [[first, second], [second, first]]) {
        const answers = [HTTP, UPGRADE].map((entrance) => {
          const { world, a } = attempt(conditions);
          return run(node(world).gate, entrance, a);
        });
        assert.deepEqual(answers, [first.answer, first.answer], `${first.name} before ${second.name}`);
      }
      pairs++;
    }
  }
  assert.ok(pairs >= 25, `${pairs} pairs`);
});

test('the declared differences: a key in a subprotocol and session memory refuse upgrades only; the body cap applies to HTTP only', () => {
  const subprotocol = attempt([]);
  subprotocol.a.protocol = `realtime, openai-insecure-api-key.${GOOD}`;
  assert.equal(run(node(subprotocol.world).gate, UPGRADE, subprotocol.a), '401 authentication_error');
  assert.equal(run(node(subprotocol.world).gate, HTTP, subprotocol.a), 'passed');
  // Refused before the credential is read: even with no credential, it is this refusal's message.
  const { gate } = node(subprotocol.world);
  const res = new FakeRes();
  const r = new ApiRequest(UPGRADE, res as unknown as HttpResponse, new Reply(res as unknown as HttpResponse), familyOf('/v1/realtime'));
  Object.assign(r, { method: 'GET', path: '/v1/realtime', protocol: 'openai-insecure-api-key.x', ip: '10.0.0.1' });
  gate.pass(r);
  assert.match(JSON.parse(res.body).error.message, /Sec-WebSocket-Protocol/);

  const big = attempt([]);
  big.a.contentLength = 33 * 1024 * 1024;
  assert.equal(run(node(big.world).gate, HTTP, big.a), '413 invalid_request_error');
  assert.equal(run(node(big.world).gate, UPGRADE, big.a), 'passed');
  // After the edge budgets, before path sanity.
  const bigBad = attempt([ORDER[2]]);
  bigBad.a.contentLength = 33 * 1024 * 1024;
  assert.equal(run(node(bigBad.world).gate, HTTP, bigBad.a), '413 invalid_request_error');
  const bigEdge = attempt([ORDER[1]]);
  bigEdge.a.contentLength = 33 * 1024 * 1024;
  assert.equal(run(node(bigEdge.world).gate, HTTP, bigEdge.a), '429 api_error');

  const full = attempt([]);
  const n = node(full.world);
  n.gate.sessionMemory = { full: true };
  assert.equal(run(n.gate, UPGRADE, full.a), '503 api_error');
  assert.equal(run(n.gate, HTTP, full.a), 'passed');
});

test('one unknown-key sampler and one request-id counter per node, shared by HTTP and upgrades', () => {
  const { world, a } = attempt([ORDER[5]]);
  const { gate, logged } = node(world);
  // The clock stands still: only the burst is logged, whichever entrance the attempts came through.
  for (let i = 0; i < UnknownKeySampler.BURST; i++) run(gate, i % 2 ? HTTP : UPGRADE, a);
  assert.equal(logged.length, UnknownKeySampler.BURST);
  run(gate, HTTP, a);
  run(gate, UPGRADE, a);
  assert.equal(logged.length, UnknownKeySampler.BURST, 'the bucket is empty for both entrances');
  const ids = new Set((logged as Array<{ requestId: string }>).map((row) => row.requestId));
  assert.equal(ids.size, UnknownKeySampler.BURST, 'request ids never repeat across entrances');
  for (const id of ids) assert.match(id, /^n1-[0-9a-z]+$/);
});

test('a draining node refuses upgrades right after readiness, and still serves HTTP', () => {
  // (Last in this file: the drain flag is the process's, and it stays set.)
  markDrainStarted();
  const edge = attempt([ORDER[1]]);
  assert.equal(run(node(edge.world).gate, UPGRADE, edge.a), '503 api_error');
  assert.equal(run(node(edge.world).gate, HTTP, edge.a), '429 api_error');
  const notReady = attempt([ORDER[0]]);
  assert.equal(run(node(notReady.world).gate, UPGRADE, notReady.a), '503 api_error');
  const ok = attempt([]);
  assert.equal(run(node(ok.world).gate, HTTP, ok.a), 'passed');
});
