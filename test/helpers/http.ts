// Small HTTP helpers for tests: a JSON request with the status, headers and parsed body, the test
// clock of a node (POST /test/clock on its admin listener, enabled by TOLLGATE_TEST_CLOCK=1), and
// raw requests for what fetch will not send (a lying Content-Length).
import { connect, type AddressInfo, type Server } from 'node:net';

export interface HttpResult {
  status: number;
  headers: Headers;
  body: any;
  text: string;
}

export async function request(url: string, init: RequestInit & { json?: unknown } = {}): Promise<HttpResult> {
  const headers = new Headers(init.headers);
  let body = init.body;
  if (init.json !== undefined) {
    headers.set('content-type', 'application/json');
    body = JSON.stringify(init.json);
  }
  const res = await fetch(url, { ...init, headers, body });
  const text = await res.text();
  let parsed: any = undefined;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  return { status: res.status, headers: res.headers, body: parsed, text };
}

export function bearer(key: string): Record<string, string> {
  return { authorization: `Bearer ${key}` };
}

export function chatBody(content = 'Hello', model = 'demo-chat'): unknown {
  return { model, messages: [{ role: 'user', content }] };
}

/** Sets or advances a node's injected clock. */
export async function setClock(adminUrl: string, change: { now_ms?: number; advance_ms?: number }): Promise<void> {
  const res = await fetch(`${adminUrl}/test/clock`, { method: 'POST', body: JSON.stringify(change) });
  if (res.status !== 200) throw new Error(`setting the test clock failed: ${res.status} ${await res.text()}`);
}

/** The start of the current UTC minute, as a clock origin that no test depends on the wall for. */
export function minuteStart(ms = Date.now()): number {
  return Math.floor(ms / 60_000) * 60_000;
}

/**
 * Sends raw bytes and returns the status line and the rest of the response as text (status 0: the
 * server closed the connection without answering). `localAddress` picks the client's address, e.g.
 * 127.0.0.2 to come from a loopback address other than the usual one.
 */
export function rawRequest(hostPort: string, head: string, body?: Buffer, opts: { localAddress?: string } = {}): Promise<{ status: number; text: string }> {
  const [host, port] = [hostPort.slice(0, hostPort.lastIndexOf(':')), Number(hostPort.slice(hostPort.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    const sock = connect({ port, host: host.replace(/^\[|\]$/g, ''), localAddress: opts.localAddress });
    let data = '';
    sock.on('connect', () => {
      sock.write(head);
      if (body) sock.write(body);
    });
    sock.on('data', (c) => {
      data += c.toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(data);
      const headerEnd = data.indexOf('\r\n\r\n');
      if (m && headerEnd >= 0) {
        const cl = /content-length: *(\d+)/i.exec(data.slice(0, headerEnd));
        if (cl && data.length >= headerEnd + 4 + Number(cl[1])) {
          sock.destroy();
          resolve({ status: Number(m[1]), text: data });
        }
      }
    });
    sock.on('error', (e) => (data ? resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(data)?.[1] ?? 0), text: data }) : reject(e)));
    sock.on('close', () => resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(data)?.[1] ?? 0), text: data }));
  });
}

/** Starts `server` listening on a free loopback port (port 0); resolves with the port. */
export async function listenLocal(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}
