// A TCP relay for tests that cut a node off from the control plane: the node connects through it,
// `cut` ends every connection and refuses new ones, `restore` accepts them again.
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface TcpRelay {
  /** HOST:PORT to connect through. */
  address: string;
  /** Ends every connection and refuses new ones. */
  cut(): void;
  /** Accepts connections again. */
  restore(): void;
  close(): Promise<void>;
}

/** A relay on a free loopback port to `target` (HOST:PORT). */
export async function startTcpRelay(target: string): Promise<TcpRelay> {
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  const sockets = new Set<Socket>();
  let open = true;
  const server: Server = createServer((client) => {
    if (!open) return client.destroy();
    const upstream = connect(port, host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    client.pipe(upstream).pipe(client);
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
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
