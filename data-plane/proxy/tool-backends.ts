// The node's tool backends: one undici Pool per backend base URL (keep-alive, the configured connect
// timeout), a round-robin choice over the URLs of a prefix, and passive health: a URL that refused a
// connection or timed out is skipped for a while and then tried again. State is keyed by URL, so it
// survives config reloads; a pool no longer used is closed gracefully (it waits for its requests).
import { Pool } from 'undici';
import { UPSTREAM_KEEP_ALIVE_MS } from './upstream-keep-alive.js';
import type { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';

/** Skipped this long after a first failure, doubling with each failure in a row, up to the max. */
export const HEALTH_COOLDOWN_MS = 2_000;
export const HEALTH_COOLDOWN_MAX_MS = 30_000;
const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Pools idle this long with nothing in flight are closed (a reload removed their URL, or just quiet). */
const POOL_IDLE_CLOSE_MS = 10 * 60_000;

export interface Upstream {
  /** The configured base URL; never shown to clients. */
  readonly baseUrl: string;
  readonly pool: Pool;
  readonly connectTimeoutMs: number;
  /** Path of the base URL without its trailing slash, prepended to the client's path. */
  readonly basePath: string;
  inFlight: number;
  lastUsedMs: number;
  /** Failures in a row; 0 when healthy. */
  failures: number;
  /** Skipped until this time after failures. */
  downUntilMs: number;
}

export class ToolBackends {
  private readonly upstreams = new Map<string, Upstream>();
  /** Round-robin position per prefix (kept across reloads: only fairness depends on it). */
  private readonly cursor = new Map<string, number>();
  private readonly sweeper: NodeJS.Timeout;

  constructor() {
    this.sweeper = setInterval(() => this.sweep(), 60_000);
    this.sweeper.unref();
  }

  /** The base URLs of a backend entry (older control planes send only base_url). */
  static urlsOf(b: ToolBackend): readonly string[] {
    return b.baseUrls.length > 0 ? b.baseUrls : [b.baseUrl];
  }

  /**
   * The URLs to try for one request, in order: healthy ones from the round-robin position on, then
   * those cooling down (soonest back first), so a request is never refused just because every URL
   * failed recently.
   */
  order(b: ToolBackend): Upstream[] {
    const urls = ToolBackends.urlsOf(b);
    const start = this.cursor.get(b.prefix) ?? 0;
    this.cursor.set(b.prefix, (start + 1) % urls.length);
    const now = this.clockNow();
    const healthy: Upstream[] = [];
    const cooling: Upstream[] = [];
    for (let i = 0; i < urls.length; i++) {
      const u = this.upstream(urls[(start + i) % urls.length], b);
      (u.downUntilMs > now ? cooling : healthy).push(u);
    }
    if (cooling.length > 1) cooling.sort((x, y) => x.downUntilMs - y.downUntilMs);
    return cooling.length === 0 ? healthy : healthy.concat(cooling);
  }

  /** The URL answered (any status): healthy again. */
  markUp(u: Upstream): void {
    u.failures = 0;
    u.downUntilMs = 0;
  }

  /** The URL refused, reset or timed out before answering: skip it for a while. */
  markDown(u: Upstream): void {
    u.failures = Math.min(u.failures + 1, 16);
    u.downUntilMs = this.clockNow() + Math.min(HEALTH_COOLDOWN_MAX_MS, HEALTH_COOLDOWN_MS * 2 ** (u.failures - 1));
  }

  /** Whether a URL is being skipped (for tests and stats). */
  isDown(baseUrl: string): boolean {
    const u = this.upstreams.get(baseUrl);
    return !!u && u.downUntilMs > this.clockNow();
  }

  async close(): Promise<void> {
    clearInterval(this.sweeper);
    await Promise.allSettled([...this.upstreams.values()].map((u) => u.pool.destroy()));
    this.upstreams.clear();
  }

  private upstream(baseUrl: string, b: ToolBackend): Upstream {
    const connectTimeout = b.connectTimeoutMs > 0 ? b.connectTimeoutMs : DEFAULT_CONNECT_TIMEOUT_MS;
    let u = this.upstreams.get(baseUrl);
    if (!u || u.connectTimeoutMs !== connectTimeout) {
      const url = new URL(baseUrl);
      // No cap on connections (as for model upstreams): a download or event stream holds its connection
      // as long as it lasts, and a request queued behind a cap waits with no timeout, so one caller's
      // streams would hold up everyone's. The keys' parallel limits bound what is in flight.
      const pool = new Pool(url.origin, { connections: null, pipelining: 1, keepAliveTimeout: UPSTREAM_KEEP_ALIVE_MS, connectTimeout });
      // A reload changed the connect timeout: a new pool; the old one finishes what it carries, then closes.
      if (u) u.pool.close().catch(() => {});
      u = { baseUrl, pool, connectTimeoutMs: connectTimeout, basePath: url.pathname.replace(/\/+$/, ''), inFlight: 0, lastUsedMs: 0, failures: u?.failures ?? 0, downUntilMs: u?.downUntilMs ?? 0 };
      this.upstreams.set(baseUrl, u);
    }
    u.lastUsedMs = this.clockNow();
    return u;
  }

  private sweep(): void {
    const now = this.clockNow();
    for (const [id, u] of this.upstreams) {
      if (u.inFlight === 0 && now - u.lastUsedMs > POOL_IDLE_CLOSE_MS) {
        this.upstreams.delete(id);
        u.pool.close().catch(() => {});
      }
    }
  }

  // Health and pool idleness use wall time: the test clock moves minute windows, not socket timeouts.
  private clockNow(): number {
    return Date.now();
  }
}
