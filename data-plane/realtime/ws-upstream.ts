// The upstream side of a realtime session: a `ws` client to an OpenAI-compatible realtime URL, with
// the configured credential as `Authorization: Bearer`. The handshake completes before the client is
// upgraded, so an upstream that refuses or cannot be reached becomes a plain HTTP 502 for the client.
// Backpressure: `pause`/`resume` stop and restart reading the upstream's socket (ws pause/resume);
// `bufferedAmount` is what ws holds unsent. A ping every PING_INTERVAL_MS; no pong by the next one
// and the upstream is dropped as lost.
import WebSocket from 'ws';
import type { RealtimeUpstream } from '../../proto/gen/tollgate/v1/sync.js';
import { UpstreamRefused, type UpstreamEvents, type UpstreamLink } from '../proxy/upstream-link.js';

export const PING_INTERVAL_MS = 30_000;

export interface WsUpstreamOptions {
  /** Largest message accepted from the upstream. */
  maxMessageBytes: number;
}

/** The URL a session connects to: `?model=` added unless the configured URL names one. */
export function upstreamUrl(up: RealtimeUpstream, fallbackModel: string): string {
  const u = new URL(up.url);
  if (!u.searchParams.has('model')) u.searchParams.set('model', up.upstreamModel || fallbackModel);
  return u.toString();
}

/**
 * Opens the upstream. `opened` runs once the handshake succeeded (the link paused until the client
 * is upgraded and `events` is set); `failed` once if it did not. `cancel` aborts a handshake.
 */
export function connectWsUpstream(
  up: RealtimeUpstream,
  modelId: string,
  opts: WsUpstreamOptions,
  opened: (link: UpstreamLink) => void,
  failed: (err: UpstreamRefused) => void,
): { cancel(): void } {
  const headers: Record<string, string> = {};
  if (up.upstreamApiKey) headers.authorization = `Bearer ${up.upstreamApiKey}`;
  let settled = false;
  const socket = new WebSocket(upstreamUrl(up, modelId), {
    headers,
    handshakeTimeout: up.connectTimeoutMs > 0 ? up.connectTimeoutMs : 10_000,
    maxPayload: opts.maxMessageBytes,
    perMessageDeflate: false,
    followRedirects: false,
  });
  const fail = (msg: string) => {
    if (settled) return;
    settled = true;
    socket.terminate();
    failed(new UpstreamRefused(msg));
  };
  // The upstream's answer when it refused the upgrade (status only: its body may echo credentials).
  socket.on('unexpected-response', (_req, res) => {
    res.resume();
    fail(`The realtime upstream refused the connection with HTTP ${res.statusCode}.`);
  });
  socket.on('error', (err: NodeJS.ErrnoException) => fail(`The realtime upstream could not be reached (${err.code ?? 'handshake failed'}).`));
  socket.on('close', () => fail('The realtime upstream closed the connection during the handshake.'));
  socket.once('open', () => {
    if (settled) return socket.terminate();
    settled = true;
    socket.removeAllListeners();
    opened(new WsUpstreamLink(socket));
  });
  return {
    cancel() {
      if (settled) return;
      settled = true;
      socket.terminate();
    },
  };
}

class WsUpstreamLink implements UpstreamLink {
  events: UpstreamEvents | null = null;
  private ended = false;
  private waitingPong = false;
  private readonly pinger: NodeJS.Timeout;
  /** Messages that arrived before `events` was set (normally none: the link is paused until then). */
  private early: Array<[Buffer, boolean]> = [];
  /** How the upstream ended before anyone listened (delivered by `resume`). */
  private endedEarly: { code: number; reason: string } | null = null;

  constructor(private readonly socket: WebSocket) {
    socket.pause();
    socket.on('message', (data: Buffer, isBinary: boolean) => {
      if (this.ended) return;
      if (this.events) this.events.message(data, isBinary);
      else this.early.push([data, isBinary]);
    });
    socket.on('pong', () => {
      this.waitingPong = false;
    });
    // An error (a message over the size limit, a bad frame) is followed by 'close': its message is the reason.
    let lastError = '';
    socket.on('error', (err: Error) => (lastError = err.message));
    socket.on('close', (code: number, reason: Buffer) => {
      // ws reports its own refusal of an oversized message as 1006: it is a 1009 (message too big).
      if (code === 1006 && /max payload/i.test(lastError)) code = 1009;
      this.end(code, reason.toString('utf8') || lastError);
    });
    this.pinger = setInterval(() => {
      if (this.waitingPong) {
        this.end(1006, 'upstream stopped answering pings');
        socket.terminate();
        return;
      }
      this.waitingPong = true;
      try {
        socket.ping();
      } catch {
        // closing already; 'close' follows
      }
    }, PING_INTERVAL_MS);
    this.pinger.unref();
  }

  get bufferedAmount(): number {
    return this.socket.bufferedAmount;
  }

  send(data: Buffer, isBinary: boolean): void {
    if (this.ended || this.socket.readyState !== WebSocket.OPEN) return;
    this.socket.send(data, { binary: isBinary });
  }

  pause(): void {
    if (!this.ended) this.socket.pause();
  }

  resume(): void {
    if (this.ended) {
      // Lost between the handshake and the client's upgrade: the session learns it now.
      const early = this.endedEarly;
      this.endedEarly = null;
      if (early && this.events) this.events.closed(early.code, early.reason);
      return;
    }
    if (this.events && this.early.length > 0) {
      const early = this.early;
      this.early = [];
      for (const [d, b] of early) this.events.message(d, b);
    }
    this.socket.resume();
  }

  close(code: number, reason: string): void {
    if (this.ended) return;
    this.ended = true;
    clearInterval(this.pinger);
    try {
      this.socket.close(closeCodeForUpstream(code), reason.slice(0, 120));
    } catch {
      this.socket.terminate();
    }
    // A peer that never answers the close frame is not waited for.
    setTimeout(() => this.socket.terminate(), 5000).unref();
  }

  private end(code: number, reason: string): void {
    if (this.ended) return;
    this.ended = true;
    clearInterval(this.pinger);
    if (this.events) this.events.closed(code, reason);
    else this.endedEarly = { code, reason };
  }
}

/** ws refuses to send reserved codes (1005, 1006, ...): those become 1000. */
function closeCodeForUpstream(code: number): number {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999) ? code : 1000;
}
