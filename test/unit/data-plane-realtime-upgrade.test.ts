// A client upgraded asynchronously (realtime/gateway.ts, once its upstream is open), against the real
// uWS build the node runs. That build's `HttpResponse.cork` checks, after its callback, whether the
// response asked to close its connection, reading the response's state where the upgrade freed it
// (uNetworking/uWebSockets pull request 1929, fixed upstream after this version): memory allocated
// again inside the callback could read as "close", and the new socket was shut at once, the client
// seeing a bare 1006 and no event (the flaky realtime tests). Here the session's start allocates
// native memory of the size the upgrade frees on this build (glibc hands the freed piece to the next
// allocation of its size), holding bytes that read as "close": in the registry of open streams and
// in the upstream link's `resume`. Before the fix the session started inside the cork, and every
// client here got a bare 1006; now nothing of the session runs inside it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import uWS from 'uWebSockets.js';
import WebSocket from 'ws';
import { RealtimeGateway } from '../../data-plane/realtime/gateway.js';
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

test('a client upgraded after its upstream opened gets its greeting, whatever the session allocates as it starts', async () => {
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
    kept.length = 0;
  }
});
