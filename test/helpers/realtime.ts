// Realtime client helpers for tests (the `ws` package): an attempt that either opens a socket or
// returns the gateway's plain HTTP refusal (status, headers, parsed body), and a socket wrapper that
// collects events and close codes.
import WebSocket from 'ws';

export interface Refusal {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: any;
}

export interface Opened {
  ws: WebSocket;
  /** The 101's headers (the key's rate headers ride on it). */
  headers: Record<string, string | string[] | undefined>;
  session: Session;
}

export interface AttemptOptions {
  key?: string;
  model?: string | null;
  headers?: Record<string, string>;
  protocols?: string[];
  path?: string;
  localAddress?: string;
  /** More to say when a wait on the socket fails (the node's recent output, say). */
  diagnose?: () => string;
}

/** One connection attempt to a node's /v1/realtime. */
export function attemptRealtime(nodeAddress: string, opts: AttemptOptions = {}): Promise<Opened | Refusal> {
  const model = opts.model === undefined ? 'demo-realtime' : opts.model;
  const query = model === null ? '' : `?model=${encodeURIComponent(model)}`;
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.key) headers.authorization = `Bearer ${opts.key}`;
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://${nodeAddress}${opts.path ?? '/v1/realtime'}${query}`, opts.protocols ?? [], { headers, localAddress: opts.localAddress });
    let upgradeHeaders: Opened['headers'] = {};
    // Events are collected from the first one: the gateway may greet before 'open' is handled.
    const session = new Session(ws, opts.diagnose);
    ws.on('upgrade', (res) => (upgradeHeaders = res.headers));
    ws.on('open', () => resolve({ ws, headers: upgradeHeaders, session }));
    ws.on('unexpected-response', (_req, res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => {
        let body: any;
        try {
          body = JSON.parse(text);
        } catch {
          body = text;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body });
      });
    });
    ws.on('error', (err) => reject(err));
  });
}

/** Opens or fails the test with the refusal. */
export async function openRealtime(nodeAddress: string, opts: AttemptOptions = {}): Promise<Opened> {
  const r = await attemptRealtime(nodeAddress, opts);
  if (!('ws' in r)) throw new Error(`expected the socket to open, got ${r.status} ${JSON.stringify(r.body)}`);
  return r;
}

export function isRefusal(r: Opened | Refusal): r is Refusal {
  return !('ws' in r);
}

/** Collects a socket's events and its close. */
export class Session {
  readonly events: any[] = [];
  closeCode: number | null = null;
  closeReason = '';
  closedAt = 0;
  /** The client library's own error, if it failed the connection (a bad frame from the node reads as 1006). */
  error = '';
  private waiters: Array<() => void> = [];

  constructor(
    readonly ws: WebSocket,
    private readonly diagnose?: () => string,
  ) {
    ws.on('message', (d, isBinary) => {
      this.events.push(isBinary ? { binary: d } : JSON.parse(d.toString()));
      this.wake();
    });
    ws.on('close', (code, reason) => {
      this.closeCode = code;
      this.closeReason = reason.toString();
      this.closedAt = Date.now();
      this.wake();
    });
    ws.on('error', (err) => (this.error ||= err.message));
  }

  send(ev: Record<string, unknown>): void {
    this.ws.send(JSON.stringify(ev));
  }

  /** Sends a user message and asks for a response. */
  say(text: string): void {
    this.send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] } });
    this.send({ type: 'response.create' });
  }

  count(type: string): number {
    return this.events.filter((e) => e.type === type).length;
  }

  /** Resolves once `n` events of `type` arrived (rejects when the socket closes first or after `ms`). */
  waitFor(type: string, n = 1, ms = 10_000): Promise<any> {
    return this.until(() => this.count(type) >= n, `${n} × ${type}`, ms, true).then(() => this.events.filter((e) => e.type === type)[n - 1]);
  }

  /** Resolves with the close code once the socket closed (rejects after `ms`). */
  waitClosed(ms = 10_000): Promise<number> {
    return this.until(() => this.closeCode !== null, 'close', ms, false).then(() => this.closeCode!);
  }

  private until(check: () => boolean, what: string, ms: number, failOnClose: boolean): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== probe);
        reject(new Error(`timed out waiting for ${what}; events: ${this.events.map((e) => e.type).join(',')}; close: ${this.closeCode} ${this.closeReason}${this.errorText()}`));
      }, ms);
      const probe = () => {
        if (check()) {
          clearTimeout(timer);
          this.waiters = this.waiters.filter((w) => w !== probe);
          resolve();
        } else if (failOnClose && this.closeCode !== null) {
          clearTimeout(timer);
          this.waiters = this.waiters.filter((w) => w !== probe);
          reject(new Error(`socket closed (${this.closeCode} ${this.closeReason}) before ${what}; events: ${this.events.map((e) => e.type).join(',')}${this.errorText()}`));
        }
      };
      this.waiters.push(probe);
      probe();
    });
  }

  /** The client's error and what `diagnose` says, for a failure message. */
  errorText(): string {
    return `${this.error ? `; client error: ${this.error}` : ''}${this.diagnose ? `\n${this.diagnose()}` : ''}`;
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }
}
