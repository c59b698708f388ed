// The small HTTP load balancer `npm run cluster` puts in front of its nodes, so the three-node setup
// runs on a machine without nginx or haproxy (compose.yaml uses nginx). Round robin over the nodes;
// each request carries X-Forwarded-For with the client's address appended (the nodes list this
// balancer in trusted_proxies); a node that refuses the connection is skipped for a few seconds and
// the request goes to the next one, body untouched (the body is read only once a node accepted the
// connection). WebSocket upgrades are passed through the same way. For local clusters and tests,
// not a production edge: it has no TLS, no timeouts of its own, no connection limits.
import { request as httpRequest, Agent, createServer, type IncomingMessage, type OutgoingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';

/** How long a node that refused a connection is left out of the rotation. */
const DEAD_MS = 2000;

interface Backend {
  host: string;
  port: number;
  deadUntil: number;
}

/** Connection errors that mean the node never saw the request, so another node may take it. */
const RETRYABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT']);

const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade'];

export interface LoadBalancer {
  server: Server;
  /** HOST:PORT it listens on. */
  address: string;
  close(): Promise<void>;
}

function forwardedFor(req: IncomingMessage): string {
  const peer = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
  const prior = req.headers['x-forwarded-for'];
  const list = Array.isArray(prior) ? prior.join(', ') : prior;
  return list ? `${list}, ${peer}` : peer;
}

export async function startLoadBalancer(opts: { listen: string; backends: string[]; log?: (line: string) => void }): Promise<LoadBalancer> {
  const log = opts.log ?? ((l: string) => console.log(l));
  const backends: Backend[] = opts.backends.map((b) => {
    const i = b.lastIndexOf(':');
    return { host: b.slice(0, i).replace(/^\[(.*)\]$/, '$1'), port: Number(b.slice(i + 1)), deadUntil: 0 };
  });
  const agent = new Agent({ keepAlive: true, maxSockets: 256 });
  let next = 0;

  /** The next live node in turn, skipping `tried`; a dead one only when every node is dead. */
  function pick(tried: Set<Backend>): Backend | null {
    const now = Date.now();
    for (const wantLive of [true, false]) {
      for (let i = 0; i < backends.length; i++) {
        const b = backends[(next + i) % backends.length];
        if (tried.has(b) || (wantLive && b.deadUntil > now)) continue;
        next = (backends.indexOf(b) + 1) % backends.length;
        return b;
      }
    }
    return null;
  }

  function markDead(b: Backend, why: string): void {
    if (b.deadUntil <= Date.now()) log(`load balancer: ${b.host}:${b.port} unreachable (${why}); skipped for ${DEAD_MS / 1000} s`);
    b.deadUntil = Date.now() + DEAD_MS;
  }

  function headersFor(req: IncomingMessage): OutgoingHttpHeaders {
    const headers: OutgoingHttpHeaders = { ...req.headers };
    for (const h of HOP_BY_HOP) delete headers[h];
    headers['x-forwarded-for'] = forwardedFor(req);
    headers['x-forwarded-proto'] = 'http';
    return headers;
  }

  function proxy(req: IncomingMessage, res: ServerResponse, tried: Set<Backend>): void {
    const b = pick(tried);
    if (!b) {
      res.writeHead(502, { 'content-type': 'application/json' }).end('{"error":{"code":"upstream_unreachable","message":"no gateway node is reachable"}}');
      return;
    }
    tried.add(b);
    let connected = false;
    const out = httpRequest({ host: b.host, port: b.port, method: req.method, path: req.url, headers: headersFor(req), agent });
    out.on('socket', (s: Socket) => {
      const go = () => {
        connected = true;
        req.pipe(out);
      };
      if (s.connecting) s.once('connect', go);
      else go();
    });
    out.on('response', (upstream) => {
      const raw: string[] = [];
      for (let i = 0; i < upstream.rawHeaders.length; i += 2) {
        if (!HOP_BY_HOP.includes(upstream.rawHeaders[i].toLowerCase())) raw.push(upstream.rawHeaders[i], upstream.rawHeaders[i + 1]);
      }
      res.writeHead(upstream.statusCode ?? 502, raw);
      upstream.pipe(res);
      upstream.on('error', () => res.destroy());
    });
    out.on('error', (err: NodeJS.ErrnoException) => {
      if (!connected && RETRYABLE.has(err.code ?? '')) {
        markDead(b, err.code!);
        proxy(req, res, tried);
      } else if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'application/json' }).end('{"error":{"code":"upstream_unreachable","message":"the gateway node failed"}}');
      } else res.destroy();
    });
    res.on('close', () => {
      if (!res.writableFinished) out.destroy();
    });
  }

  function tunnel(req: IncomingMessage, client: Socket, head: Buffer, tried: Set<Backend>): void {
    const b = pick(tried);
    if (!b) {
      client.destroy();
      return;
    }
    tried.add(b);
    const upstream = connect({ host: b.host, port: b.port });
    let connected = false;
    upstream.once('error', (err: NodeJS.ErrnoException) => {
      if (!connected && RETRYABLE.has(err.code ?? '')) {
        markDead(b, err.code!);
        tunnel(req, client, head, tried);
      } else client.destroy();
    });
    upstream.once('connect', () => {
      connected = true;
      const headers = { ...req.headers, 'x-forwarded-for': forwardedFor(req) };
      const lines = [`${req.method} ${req.url} HTTP/1.1`];
      for (const [k, v] of Object.entries(headers)) for (const one of Array.isArray(v) ? v : [v]) if (one !== undefined) lines.push(`${k}: ${one}`);
      upstream.write(`${lines.join('\r\n')}\r\n\r\n`);
      if (head.length > 0) upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
      upstream.on('error', () => client.destroy());
      client.on('error', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
      client.on('close', () => upstream.destroy());
    });
  }

  const server = createServer((req, res) => proxy(req, res, new Set()));
  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => tunnel(req, socket, head, new Set()));
  server.on('clientError', (_err, socket: Socket) => socket.destroy());
  // Node closes idle keep-alive connections after 5 s, about when clients (undici: 4 s) stop reusing
  // them: on a busy machine a request can go out on a connection the balancer is closing ("other side
  // closed"). Idle connections stay open a minute, like nginx's default; clients close them first.
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;

  const i = opts.listen.lastIndexOf(':');
  const host = opts.listen.slice(0, i).replace(/^\[(.*)\]$/, '$1');
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(Number(opts.listen.slice(i + 1)), host, () => resolve());
  });
  const port = (server.address() as { port: number }).port;
  return {
    server,
    address: `${opts.listen.slice(0, i)}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        agent.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
