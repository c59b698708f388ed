// The admin listener: a second tiny uWS app. GET /healthz (process up), GET /readyz (200 once the first
// snapshot is applied and while not draining, else 503), GET /metrics (Prometheus text), GET /stats/lease-waits (latency added by waiting for leases), GET /stats/leases (whether the control plane knows what this node used of its leases). TEST-ONLY: when the node runs with TOLLGATE_TEST_CLOCK=1, POST
// /test/clock with {"now_ms": N} or {"advance_ms": N} sets or advances the node's manual clock, so
// tests can cross minute windows without waiting. Without that switch the route does not exist.
import uWS, { type TemplatedApp } from 'uWebSockets.js';
import type { ManualClock } from '../limits/clock.js';
import { METRICS_CONTENT_TYPE, scrape } from '../metrics.js';
import { Reply } from '../request/reply.js';
import { logBug } from '../log.js';
import { collectBody } from '../request/request-body.js';

const TEXT = [['content-type', 'text/plain; charset=utf-8']] as const;
const JSON_TYPE = [['content-type', 'application/json']] as const;

export function createAdminApp(isReady: () => boolean, testClock: ManualClock | null, leaseWaits?: (reset: boolean) => unknown, leaseState?: () => unknown): TemplatedApp {
  const app = uWS.App();
  // What waiting for leases added to the requests that waited (count, percentiles): for benchmarks.
  // `?reset=1` starts a fresh measurement after answering.
  app.get('/stats/lease-waits', (res, req) => {
    const reset = req.getQuery('reset') === '1';
    res.writeHeader('content-type', 'application/json').end(JSON.stringify(leaseWaits?.(reset) ?? {}));
  });
  app.get('/stats/leases', (res) => {
    res.writeHeader('content-type', 'application/json').end(JSON.stringify(leaseState?.() ?? {}));
  });
  app.get('/metrics', (res) => {
    const reply = new Reply(res);
    scrape().then(
      (text) => reply.send(200, [['content-type', METRICS_CONTENT_TYPE]], text),
      (err) => {
        logBug(err);
        reply.send(500, TEXT, 'metrics failed\n');
      },
    );
  });
  app.get('/healthz', (res) => {
    res.end('ok\n');
  });
  app.get('/readyz', (res) => {
    if (isReady()) res.end('ready\n');
    else res.writeStatus('503 Service Unavailable').end('not ready\n');
  });
  if (testClock) {
    app.post('/test/clock', (res, req) => {
      const length = Number(req.getHeader('content-length') || -1);
      const reply = new Reply(res);
      collectBody(res, reply, 4096, length, (err, raw) => {
        try {
          if (err) return reply.send(413, TEXT, 'too large\n', true);
          const body = JSON.parse(raw.toString('utf8')) as { now_ms?: unknown; advance_ms?: unknown };
          if (typeof body.now_ms === 'number') testClock.set(body.now_ms);
          else if (typeof body.advance_ms === 'number') testClock.advance(body.advance_ms);
          else return reply.send(400, TEXT, 'expected {"now_ms": N} or {"advance_ms": N}\n');
          reply.send(200, JSON_TYPE, JSON.stringify({ now_ms: testClock.now() }));
        } catch (e) {
          if (!(e instanceof SyntaxError)) logBug(e);
          reply.send(400, TEXT, 'expected {"now_ms": N} or {"advance_ms": N}\n');
        }
      });
    });
  }
  app.any('/*', (res) => {
    res.writeStatus('404 Not Found').end('not found\n');
  });
  return app;
}
