// A TCP peer that takes every connection and never answers: what a control plane's machine that has
// gone away looks like to a client whose connect has no timeout of its own (grpc-js).
import net from 'node:net';

/** Listens on a free loopback port until the test ends; returns the port. */
export async function silentPeer(t: { after(fn: () => unknown): void }): Promise<number> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    for (const s of sockets) s.destroy();
    server.close();
  });
  return (server.address() as net.AddressInfo).port;
}
