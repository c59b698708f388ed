// The control plane's admin listener (--admin-listen): plain HTTP, GET only. /healthz: the process
// answers. /readyz: 200 while the control plane serves (database open, gRPC listening, not stopping),
// else 503. /metrics: Prometheus text. Nothing here needs or accepts a credential: bind it to a
// private address.
import { createServer, type Server } from 'node:http';
import { isReady, METRICS_CONTENT_TYPE, scrape } from './metrics.js';

export function createAdminServer(onError: (err: Error) => void): Server {
  return createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const text = (status: number, body: string) => {
      res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD');
      return text(405, 'method not allowed\n');
    }
    if (path === '/healthz') return text(200, 'ok\n');
    if (path === '/readyz') return isReady() ? text(200, 'ready\n') : text(503, 'not ready\n');
    if (path === '/metrics') {
      scrape().then(
        (body) => {
          res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPE });
          res.end(body);
        },
        (err: Error) => {
          onError(err);
          text(500, 'metrics failed\n');
        },
      );
      return;
    }
    text(404, 'not found\n');
  });
}

/** Listens on HOST:PORT and resolves with the bound port. */
export function listenAdmin(server: Server, hostPort: string): Promise<{ host: string; port: number }> {
  const i = hostPort.lastIndexOf(':');
  const host = hostPort.slice(0, i).replace(/^\[(.*)\]$/, '$1');
  const port = Number(hostPort.slice(i + 1));
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      const a = server.address();
      resolve({ host, port: typeof a === 'object' && a ? a.port : port });
    });
  });
}
