// Sends the outbox: each pending delivery whose time has come, signed afresh per attempt with the
// event's stable webhook-id. A 2xx delivers it; anything else (status, refused connection, timeout)
// schedules the next attempt with exponential backoff and jitter, until the delivery's retry window
// (24 h) closes: then the delivery fails and its destination is paused (held deliveries wait, nothing
// is dropped) and reported, until a successful `tollgate webhooks test` resumes it. The clock, the
// randomness and the timer are injected, so the schedule is tested without waiting.
import { request } from 'undici';
import type { Db } from '../store/db.js';
import type { WebhookDestination, WebhookSettings } from '../gateway-config/webhook-config.js';
import { redactedUrl } from '../gateway-config/webhook-url.js';
import { signWebhook } from './webhook-signer.js';
import { dueDeliveries, markAttemptFailed, markDelivered, nextDueAtMs, pauseDestination, pruneHeld, pruneOutbox, resumeDestination, type DeliveryRow } from './webhook-outbox.js';

export const RETRY_WINDOW_MS = 24 * 3_600_000;
/** No single wait is longer than this, so a destination that recovers is found within it. */
export const MAX_BACKOFF_MS = 4 * 3_600_000;
const SEND_TIMEOUT_MS = 10_000;
const BATCH = 32;
/** Delivered events and old marks are forgotten after this. */
const OUTBOX_RETENTION_MS = 90 * 86_400_000;
/** A paused destination's held deliveries: at most this old, and at most this many (the newest). */
export const HELD_MAX_AGE_MS = 30 * 86_400_000;
export const HELD_MAX_COUNT = 10_000;

export interface Timers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

export interface WebhookDispatcherOptions {
  now(): number;
  settings(): WebhookSettings;
  /** In [0, 1): the jitter. */
  random?(): number;
  timers?: Timers;
  /** How long to wait for a destination's answer. */
  sendTimeoutMs?: number;
  log?(line: string, fields?: Record<string, unknown>): void;
  /** Bounds of what a paused destination holds (HELD_MAX_AGE_MS, HELD_MAX_COUNT). */
  heldMaxAgeMs?: number;
  heldMaxCount?: number;
}

export interface SendResult {
  ok: boolean;
  status: number;
  error: string;
}

/**
 * The delay before attempt `attempt + 1` after `attempt` failed ones: initial × 2^(attempt−1), at most
 * MAX_BACKOFF_MS, scaled by a jitter in [0.5, 1) so that many deliveries do not retry in step.
 */
export function backoffMs(initialMs: number, failedAttempts: number, random: number): number {
  const base = Math.min(MAX_BACKOFF_MS, initialMs * 2 ** Math.min(30, Math.max(0, failedAttempts - 1)));
  return Math.max(1, Math.floor(base * (0.5 + random / 2)));
}

/** Sends one signed request; never throws. */
export async function sendWebhook(dest: Pick<WebhookDestination, 'url' | 'secret'>, id: string, atMs: number, body: string, timeoutMs = SEND_TIMEOUT_MS): Promise<SendResult> {
  const headers = { 'content-type': 'application/json', 'user-agent': 'tollgate-webhooks/1', ...signWebhook(dest.secret, id, atMs, body) };
  try {
    const res = await request(dest.url, { method: 'POST', headers, body, headersTimeout: timeoutMs, bodyTimeout: timeoutMs, maxRedirections: 0 } as Parameters<typeof request>[1]);
    // The body is not ours to read beyond what frees the connection.
    await res.body.dump({ limit: 64 * 1024 }).catch(() => undefined);
    const ok = res.statusCode >= 200 && res.statusCode < 300;
    return { ok, status: res.statusCode, error: ok ? '' : `HTTP ${res.statusCode}` };
  } catch (err) {
    const e = err as { code?: string; message?: string };
    return { ok: false, status: 0, error: e.code ?? e.message ?? 'request failed' };
  }
}

export class WebhookDispatcher {
  private timer: unknown = null;
  private timerAt = Infinity;
  private running: Promise<void> | null = null;
  private again = false;
  private stopped = false;
  private readonly timers: Timers;
  private readonly random: () => number;
  private readonly log: (line: string, fields?: Record<string, unknown>) => void;

  constructor(
    private readonly db: Db,
    private readonly opts: WebhookDispatcherOptions,
  ) {
    this.timers = opts.timers ?? { set: (fn, ms) => setTimeout(fn, ms).unref(), clear: (h) => clearTimeout(h as NodeJS.Timeout) };
    this.random = opts.random ?? Math.random;
    this.log = opts.log ?? ((l) => console.error(l));
  }

  /** Looks for due deliveries now (after an event was enqueued, at start, after a resume). */
  kick(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.runDue()
      .then(() => undefined)
      .catch((err: Error) => this.log(`webhooks: dispatch failed: ${err.message}`))
      .finally(() => {
        this.running = null;
        if (this.again) {
          this.again = false;
          this.kick();
        } else void this.schedule();
      });
  }

  /** Resolves when the current pass (if any) is over: for tests and shutdown. */
  async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) this.timers.clear(this.timer);
    this.timer = null;
  }

  private async schedule(): Promise<void> {
    if (this.stopped) return;
    const at = await nextDueAtMs(this.db).catch(() => null);
    if (at === null || this.stopped) return;
    if (this.timer !== null && this.timerAt <= at) return;
    if (this.timer !== null) this.timers.clear(this.timer);
    this.timerAt = at;
    // Capped so a clock change (or a test clock) is noticed within a minute.
    this.timer = this.timers.set(() => {
      this.timer = null;
      this.timerAt = Infinity;
      this.kick();
    }, Math.min(60_000, Math.max(0, at - this.opts.now())));
  }

  /** One pass: sends every delivery due now (in batches), records each outcome. */
  async runDue(): Promise<number> {
    let sent = 0;
    for (;;) {
      const due = await dueDeliveries(this.db, this.opts.now(), BATCH);
      if (due.length === 0 || this.stopped) return sent;
      const byUrl = new Map(this.opts.settings().destinations.map((d) => [redactedUrl(d.url), d]));
      await Promise.all(due.map((d) => this.attempt(d, byUrl.get(d.url))));
      sent += due.length;
      if (due.length < BATCH) return sent;
    }
  }

  private async attempt(d: DeliveryRow, dest: WebhookDestination | undefined): Promise<void> {
    const atMs = this.opts.now();
    const result: SendResult = dest
      ? await sendWebhook(dest, d.event_id, atMs, d.payload, this.opts.sendTimeoutMs)
      : // Removed from the config while deliveries were pending: they fail at their next turn, like any failure.
        { ok: false, status: 0, error: 'destination no longer in the config' };
    const doneAt = this.opts.now();
    if (result.ok) {
      await this.db.tx((tx) => markDelivered(tx, d.event_id, d.url, doneAt, result.status));
      return;
    }
    const failed = d.attempts + 1;
    const next = doneAt + backoffMs(dest?.retryInitialMs ?? 5000, failed, this.random());
    const closes = d.window_start_ms + RETRY_WINDOW_MS;
    const nextAt = dest && next < closes ? next : null;
    await this.db.tx(async (tx) => {
      await markAttemptFailed(tx, d.event_id, d.url, doneAt, result.status, result.error, nextAt);
      if (nextAt === null && dest) {
        await pauseDestination(tx, d.url, doneAt, `event ${d.event_id} (${d.type}) undelivered for 24 h: ${result.error}`);
      }
    });
    if (nextAt === null) {
      this.log(`webhooks: delivery ${d.event_id} (${d.type}) to ${d.url} failed after ${failed} attempts (${result.error})${dest ? '; destination paused until `tollgate webhooks test --url` succeeds' : ''}`, {
        event: 'webhook_failed',
        url: d.url,
        eventId: d.event_id,
        attempts: failed,
      });
    }
  }

  /** A paused destination answered a test: its held deliveries go now. */
  async resume(fullUrl: string): Promise<boolean> {
    const url = redactedUrl(fullUrl);
    const resumed = await this.db.tx((tx) => resumeDestination(tx, url, this.opts.now()));
    if (resumed) {
      this.log(`webhooks: destination ${url} resumed`);
      this.kick();
    }
    return resumed;
  }

  /** Forgets old delivered events and marks, and drops what paused destinations hold past its bounds. */
  async prune(): Promise<number> {
    const now = this.opts.now();
    const dropped = await this.db.tx(async (tx) => {
      const held = await pruneHeld(tx, now - (this.opts.heldMaxAgeMs ?? HELD_MAX_AGE_MS), this.opts.heldMaxCount ?? HELD_MAX_COUNT);
      await pruneOutbox(tx, now - OUTBOX_RETENTION_MS);
      return held;
    });
    let total = 0;
    for (const [url, n] of dropped) {
      total += n;
      this.log(`webhooks: ${n} held deliveries to paused ${url} dropped (older than the hold's age or beyond its count)`, { event: 'webhook_held_dropped', url, dropped: n });
    }
    return total;
  }
}
