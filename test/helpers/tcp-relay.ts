// A TCP relay for tests that cut a node off from the control plane: the node connects through it,
// `cut` ends every connection and refuses new ones, `restore` accepts them again. `hold` leaves one
// connection half-open, as a lost network does: nothing passes any more and its client is never told.
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface TcpRelay {
  /** HOST:PORT to connect through. */
  address: string;
  /** Ends every connection and refuses new ones. */
  cut(): void;
  /** Accepts connections again. */
  restore(): void;
  /** The local ports of the relay's connections to the target (what the target sees as client ports). */
  targetPorts(): number[];
  /** The connection whose target side has local port `port` passes nothing more, and its client is never told. */
  hold(port: number): void;
  close(): Promise<void>;
}

/** A relay on a free loopback port to `target` (HOST:PORT). */
export async function startTcpRelay(target: string): Promise<TcpRelay> {
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  const sockets = new Set<Socket>();
  const pairs = new Set<{ client: Socket; upstream: Socket }>();
  const held = new Set<Socket>();
  let open = true;
  const server: Server = createServer((client) => {
    if (!open) return client.destroy();
    const upstream = connect(port, host);
    const pair = { client, upstream };
    pairs.add(pair);
    upstream.on('close', () => pairs.delete(pair));
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    client.pipe(upstream).pipe(client);
    // One side gone, whatever way (a process killed with unread data resets its socket, and pipe does
    // not end the other side on an error): the other goes too, as a direct connection would. Not for a
    // held connection, whose client stays open and silent.
    client.on('close', () => {
      if (!held.has(client)) upstream.destroy();
    });
    upstream.on('close', () => {
      if (!held.has(client)) client.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    address: `127.0.0.1:${(server.address() as { port: number }).port}`,
    cut() {
      open = false;
      for (const s of sockets) s.destroy();
    },
    restore() {
      open = true;
    },
    targetPorts: () => [...pairs].map((p) => p.upstream.localPort ?? 0),
    hold(localPort) {
      for (const p of pairs) {
        if (p.upstream.localPort !== localPort) continue;
        p.client.unpipe(p.upstream);
        p.upstream.unpipe(p.client);
        p.client.pause();
        // The target's side may close; the client's stays open and silent.
        p.upstream.removeAllListeners('end');
        p.upstream.resume();
        sockets.delete(p.client);
        held.add(p.client);
      }
    },
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve());
        // Held connections too: the server's close waits for every connection to end.
        for (const s of [...sockets, ...held]) s.destroy();
      }),
  };
}
