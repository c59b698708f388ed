// A client upgraded asynchronously (once its upstream is open) must not be upgraded inside its own
// response's `cork`: uWS v20.30's `HttpResponse.cork`, after its callback, reads the response's state
// where the upgrade shrank the socket in place (uNetworking/uWebSockets pull request 1929, fixed upstream
// after this version). Whatever the process allocated meanwhile (uWS.js's own `open` wrapper, a V8
// collection) can read there as "close this connection", and the new WebSocket is shut at once: the
// client sees a bare 1006. Upgrading outside any cork is safe, but uWS.js prints a warning for every
// write made outside a cork callback.
//
// The anchor is the way out uWS's author gave (uNetworking/uWebSockets issue 1583: upgrade uncorked):
// one idle HTTP request of the node's own, on a private unix socket, held open. While it is corked, no
// other socket can be, so the client's `res.cork` runs its callback directly (no state read after it,
// and uWS.js counts it as a cork callback, so no warning); the anchor's own cork, after, reads the
// anchor's live state, which is pending. test/unit/data-plane-realtime-upgrade.test.ts.
import { randomBytes } from 'node:crypto';
import { unlinkSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import uWS, { type HttpResponse, type us_listen_socket } from 'uWebSockets.js';
import { log } from '../log.js';

const FIRST_RETRY_MS = 1000;
const LAST_RETRY_MS = 60_000;

export class CorkAnchor {
  /** One private uWS app for every attempt (uWS apps live as long as the process). */
  private readonly app = uWS.App();
  private res: HttpResponse | null = null;
  private client: net.Socket | null = null;
  /** The path the current attempt's request names; any other request is shut. */
  private token = '';
  private attempt: { settle(): void; lost(why: string): void } | null = null;
  private stopped = false;
  private retry: NodeJS.Timeout | null = null;
  /** Attempts lost in a row (only the first is logged; each waits twice as long, up to a minute). */
  private failures = 0;
  /** Resolves once the anchor first holds its request, or failed to (then upgrades run as before). */
  readonly ready: Promise<void>;

  constructor() {
    this.app.get('/*', (res, req) => {
      const attempt = this.attempt;
      if (!attempt || this.res || req.getUrl() !== `/${this.token}`) return void res.close();
      res.onAborted(() => attempt.lost('the anchor request was aborted'));
      this.res = res;
      this.failures = 0;
      attempt.settle();
    });
    this.app.any('/*', (res) => void res.close());
    this.ready = new Promise((resolve) => this.open(resolve));
  }

  /** Runs `fn` while the anchor is corked, or plainly while it has none. */
  run(fn: () => void): void {
    const res = this.res;
    if (res) res.cork(fn);
    else fn();
  }

  get held(): boolean {
    return this.res !== null;
  }

  stop(): void {
    this.stopped = true;
    if (this.retry) clearTimeout(this.retry);
    this.client?.destroy();
    this.client = null;
  }

  private open(ready: () => void = () => {}): void {
    this.token = randomBytes(16).toString('hex');
    // Named apart from the token: the folder may be listed by anyone, the token is the only key.
    const path = join(tmpdir(), `tollgate-anchor-${process.pid}-${randomBytes(6).toString('hex')}.sock`);
    let listening: us_listen_socket | null = null;
    let over = false;
    // Once the request is held, or the attempt failed: nobody else may connect.
    const closeListener = (): void => {
      if (listening) uWS.us_listen_socket_close(listening);
      listening = null;
      try {
        unlinkSync(path);
      } catch {
        // Already gone.
      }
    };
    const attempt = {
      settle: (): void => {
        closeListener();
        ready();
      },
      // This attempt is over (once): the next one starts later, unless the node stops.
      lost: (why: string): void => {
        if (over) return;
        over = true;
        if (this.attempt === attempt) {
          this.attempt = null;
          this.res = null;
        }
        attempt.settle();
        if (this.stopped) return;
        if (this.failures === 0) log.warn({ reason: why }, 'cork anchor lost: WebSocket upgrades after an upstream opened run in their own cork until it is back');
        const wait = Math.min(LAST_RETRY_MS, FIRST_RETRY_MS * 2 ** this.failures++);
        this.retry = setTimeout(() => this.open(), wait);
        this.retry.unref();
      },
    };
    this.attempt = attempt;
    this.app.listen_unix((socket) => {
      if (!socket) return attempt.lost(`could not listen on ${path}`);
      listening = socket;
      const client = net.connect({ path });
      this.client = client;
      client.unref();
      client.on('error', () => {});
      client.on('close', () => {
        if (this.client === client) this.client = null;
        attempt.lost('the anchor connection closed');
      });
      client.write(`GET /${this.token} HTTP/1.1\r\nHost: anchor\r\n\r\n`);
    }, path);
  }
}
