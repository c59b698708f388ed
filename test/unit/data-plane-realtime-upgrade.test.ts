// A client upgraded asynchronously (realtime/gateway.ts, once its upstream is open), against the real
// uWS build the node runs. That build's `HttpResponse.cork` checks, after its callback, whether the
// response asked to close its connection, reading the response's state where the upgrade shrank the
// socket in place (uNetworking/uWebSockets pull request 1929, fixed upstream after this version): memory
// allocated again meanwhile could read as "close", and the new socket was shut at once, the client
// seeing a bare 1006 and no event (the flaky realtime tests). Here native memory of the size the upgrade
// frees on this build (glibc hands the freed piece to the next allocation of its size), holding bytes
// that read as "close", is allocated everywhere a session runs: in uWS's `open` (inside the upgrade, as
// uWS.js's own wrapper and a V8 collection can), in the registry of open streams and in the upstream
// link's `resume`. Before the cork anchor (realtime/cork-anchor.ts) nearly every client here got a bare
// 1006; now the client's cork reads nothing after the upgrade.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import uWS from 'uWebSockets.js';
import WebSocket from 'ws';
import { RealtimeGateway } from '../../data-plane/realtime/gateway.js';
import { RealtimeSession } from '../../data-plane/realtime/session.js';
import { CorkAnchor } from '../../data-plane/realtime/cork-anchor.js';
import { within } from '../helpers/data-plane.js';
import type { UpstreamEvents, UpstreamLink } from '../../data-plane/proxy/upstream-link.js';
import type { ApiRequest } from '../../data-plane/gate/api-request.js';
import type { SocketPlan } from '../../data-plane/endpoints/sockets.js';

const SESSIONS = 20;
/** Native allocations the size of what the upgrade freed, holding bytes that read as "close this connection". */
const kept: Buffer[] = [];
function allocateNative(): void {
  for (let n = 64; n <= 120; n += 8) kept.push(Buffer.allocUnsafeSlow(n).fill(0x10));
}

class GreetingLink implements UpstreamLink {
  events: UpstreamEvents | null = null;
  readonly bufferedAmount = 0;
  private greeted = false;
  send(): void {}
  pause(): void {}
  resume(): void {
    allocateNative();
    if (this.greeted || !this.events) return;
    this.greeted = true;
    // The upstream's greeting arrives a moment later, as over a socket.
    setImmediate(() => this.events?.message(Buffer.from(JSON.stringify({ type: 'session.created' })), false));
  }
  close(): void {}
}

test('a client upgraded after its upstream opened gets its greeting, whatever runs while it is upgraded and as its session starts', async () => {
  // uWS's `open` runs inside the upgrade: allocations there land in what the upgrade freed.
  const attach = RealtimeSession.prototype.attach;
  RealtimeSession.prototype.attach = function (this: RealtimeSession, ws) {
    allocateNative();
    attach.call(this, ws);
  };
  const clock = { now: () => Date.now() };
  const stubTurns = { admitting: false, began() {}, upstreamError() {}, ended: () => 0, extra: () => 0, endAll: () => [], create() {} };
  const gateway = new RealtimeGateway(
    { holder: {} as never, clock: clock as never, openStreams: { add: allocateNative, remove: () => true } as never, keyBudgets: { headers: () => ({ limitTokens: 0, remainingTokens: 0 }) } as never, isStale: () => false },
    {
      upgrade(res: uWS.HttpResponse, req: uWS.HttpRequest, context: uWS.us_socket_context_t) {
        const r = {
          res,
          wsKey: req.getHeader('sec-websocket-key'),
          protocol: req.getHeader('sec-websocket-protocol'),
          extensions: req.getHeader('sec-websocket-extensions'),
          socketContext: context,
          path: '/v1/realtime',
          ip: '127.0.0.1',
          userAgent: 'test',
          key: { keyHash: 'h', orgId: 'o', keyId: 'k', projectId: 'p', limits: {}, org: { blocked: false } },
          ctx: { requestId: 'req_test', complete() {} },
          reply: { extraHeaders: null, rateHeaders: null, requestId: 'req_test', markUpgraded() {} },
        };
        res.onAborted(() => {});
        return r as unknown as ApiRequest;
      },
      pass: () => true,
      route: () => true,
    } as never,
    {
      // As the socket endpoint does: the client is upgraded once its upstream is open, later.
      run(r: ApiRequest) {
        setImmediate(() => gateway.upgrade(r, { model: { id: 'm' }, link: new GreetingLink(), turns: () => stubTurns } as unknown as SocketPlan));
      },
    } as never,
  );
  gateway.endpoint = {} as never;
  const app = uWS.App();
  gateway.register(app);
  await gateway.anchor!.ready;
  assert.ok(gateway.anchor!.held, 'the cork anchor holds its request');
  const listenSocket = await new Promise<uWS.us_listen_socket>((resolve, reject) => app.listen('127.0.0.1', 0, (s) => (s ? resolve(s) : reject(new Error('could not listen')))));
  const port = uWS.us_socket_local_port(listenSocket);
  try {
    const outcomes: string[] = [];
    for (let i = 0; i < SESSIONS; i++) {
      outcomes.push(
        await new Promise<string>((resolve) => {
          const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/realtime?model=m`);
          ws.on('error', () => {});
          ws.on('message', (d) => {
            resolve(JSON.parse(d.toString()).type);
            ws.close(1000);
          });
          ws.on('close', (code) => resolve(`closed ${code} before any event`));
        }),
      );
    }
    assert.deepEqual(outcomes, Array(SESSIONS).fill('session.created'));
  } finally {
    uWS.us_listen_socket_close(listenSocket);
    gateway.stop();
    RealtimeSession.prototype.attach = attach;
    kept.length = 0;
  }
});

test('the cork anchor, lost, is opened again and held; stopped, it lets the process go', async () => {
  const anchor = new CorkAnchor();
  try {
    await anchor.ready;
    assert.ok(anchor.held);
    let ran = 0;
    anchor.run(() => ran++);
    assert.equal(ran, 1);
    // Its connection ends (as a killed peer would): upgrades run in their own cork meanwhile, then it is back.
    (anchor as unknown as { client: import('node:net').Socket }).client.destroy();
    assert.ok(await within(5_000, async () => !anchor.held), 'the loss is seen');
    anchor.run(() => ran++);
    assert.equal(ran, 2, 'without an anchor the callback runs plainly');
    assert.ok(await within(10_000, async () => anchor.held), 'held again');
  } finally {
    anchor.stop();
  }
});
