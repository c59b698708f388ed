// Edge budgets: requests per client IP, before any credential is looked at (spec, Limits → Edge).
// Pure and I/O-free: the HTTP layer passes the client IP, the raw path and whether a credential was
// presented, and turns a refusal into 429 + `retry-after`.
//
// Decisions (docs/design.md#edge-window, docs/design.md#how-edge-budgets-combine):
// - Window: per IP and per budget, a fixed 60-second window that starts at the first request counted
//   in it; `retry-after` is the seconds left in that window, rounded up, at least 1.
// - Combination: a request is counted in every budget that matches it (the general anonymous or
//   credentialed budget plus any path budget) and is refused if any of them is spent. All matching
//   budgets are checked before any is counted, so a refused request consumes nothing.
// - Client: an IPv4 address, or the /64 of an IPv6 address (edgeClientOf, docs/hardening.md): one
//   host can use any address of its /64, so every address of it shares one window.
import { edgeClientOf } from '../../proto/lib/ip.js';
import { type Clock } from './clock.js';
import { Fifo } from './fifo.js';
import { familyOf, type PathFamily } from '../routing/path-families.js';

export const EDGE_WINDOW_MS = 60_000;

export type EdgeBudgetName = 'anonymous' | 'credentialed' | 'voices' | 'audio' | 'files' | 'group120' | 'realtime';

/** Requests per window, per IP, for each budget (the spec's edge table). */
export const EDGE_BUDGET_LIMITS: Readonly<Record<EdgeBudgetName, number>> = Object.freeze({
  anonymous: 12, // /v1/* with no credential presented
  credentialed: 600, // /v1/* with a credential presented, valid or not
  voices: 120, // /v1/audio/voices
  audio: 60, // /v1/audio/* other than voices
  files: 60, // /v1/files*
  group120: 120, // /v1/models, /v1/pdf*, /v1/skills*, /v1/mcp*, /v1/vector_stores*, /v1/sandbox/*, /v1/route
  realtime: 60, // /v1/realtime* connection attempts
});

export interface EdgeVerdict {
  ok: boolean;
  /** 0 when ok; otherwise the largest seconds-left among the spent budgets (at least 1). */
  retryAfterSec: number;
  /** When refused: the spent budget that set `retryAfterSec`. */
  budget?: string;
}

// Which budgets and which body cap a path has is the path family's (routing/path-families.ts), the
// one classifier the router uses too.

/**
 * Every edge budget a request counts in: the general anonymous or credentialed budget of `/v1/*` plus
 * the family's own budget, if any. Paths outside `/v1` (e.g. a health check) have none. `path` is the
 * raw path; a query, if left on, is ignored.
 */
export function matchEdgeBudgets(path: string | PathFamily, hasCredential: boolean): readonly EdgeBudgetName[] {
  // The gate passes the family it computed once per request (gate/api-request.ts).
  const f = typeof path === 'string' ? familyOf(path) : path;
  // Built once per family (the lists are frozen and shared).
  let lists = BUDGETS_OF_FAMILY.get(f);
  if (lists === undefined) {
    const of = (general: EdgeBudgetName): readonly EdgeBudgetName[] => Object.freeze(!f.generalBudget ? [] : f.pathBudget === null ? [general] : [general, f.pathBudget]);
    lists = [of('anonymous'), of('credentialed')];
    BUDGETS_OF_FAMILY.set(f, lists);
  }
  return lists[hasCredential ? 1 : 0];
}

const BUDGETS_OF_FAMILY = new Map<PathFamily, readonly [readonly EdgeBudgetName[], readonly EdgeBudgetName[]]>();

/**
 * The body cap of a path, in bytes: 200 MiB audio (not voices), 256 MiB files, 64 MiB the 120 group,
 * otherwise 32 MiB (general /v1/*, voices and realtime, which the spec gives no cap of their own).
 */
export function bodyCapBytes(path: string): number {
  return familyOf(path).bodyCapBytes;
}

/** A non-empty `Authorization`, `x-api-key` or `api-key` header value counts as presenting a credential. */
export function presentsCredential(authorization?: string, xApiKey?: string, apiKey?: string): boolean {
  return nonEmpty(authorization) || nonEmpty(xApiKey) || nonEmpty(apiKey);
}

function nonEmpty(v: string | undefined): boolean {
  return v !== undefined && v.trim().length > 0;
}

/** The verdict of every admitted request (frozen and shared: no object per request). */
const ADMITTED: EdgeVerdict = Object.freeze({ ok: true, retryAfterSec: 0 });

interface Window {
  ip: string;
  startMs: number;
  count: number;
  /** Set when the window left the map (expired and replaced, or evicted): its queue entry is skipped. */
  dropped: boolean;
}

/** One budget's windows: IP → live window, and the same windows in the order they started. */
interface BudgetWindows {
  byIp: Map<string, Window>;
  byStart: Fifo<Window>;
}

/** At most this many expired windows are dropped per budget per call, so no request pays for a long sweep. */
const SWEEP_STEP = 32;

export const DEFAULT_MAX_TRACKED_IPS = 100_000;

/**
 * Memory: per budget, a Map IP → window plus a FIFO of the windows in the order they started (a new
 * window is queued when it starts, so with a clock that does not go back the queue is ordered by start
 * and expired windows are always at its front). Every `take` drops a few expired windows from the front
 * of the budgets it touches: lazy, amortised O(1), no timers. On top of that, each budget holds at most
 * `maxTrackedIps` windows; starting a window past the cap evicts the oldest one.
 *
 * Trade-off of the cap: when more than `maxTrackedIps` distinct IPs hit one budget within 60 s (a
 * flood), the oldest windows are forgotten early, so an IP whose window was evicted gets a fresh
 * budget: the edge under-counts during such a flood instead of exhausting the node's memory. The
 * default of 100 000 per budget is some tens of MB in the worst case across all seven budgets.
 */
export class EdgeBudgets {
  private readonly maxTrackedIps: number;
  private readonly budgets = new Map<EdgeBudgetName, BudgetWindows>();
  private readonly ipv6Clients = new Map<string, string>();

  constructor(
    private readonly clock: Clock,
    opts: { maxTrackedIps?: number } = {},
  ) {
    this.maxTrackedIps = Math.max(1, Math.floor(opts.maxTrackedIps ?? DEFAULT_MAX_TRACKED_IPS));
    for (const name of Object.keys(EDGE_BUDGET_LIMITS) as EdgeBudgetName[]) {
      this.budgets.set(name, { byIp: new Map(), byStart: new Fifo() });
    }
  }

  /**
   * Counts one request of `clientIp` (canonical text) on `path` in every matching budget, or refuses it
   * without counting. IPv6 addresses count by their /64.
   */
  take(clientIp: string, path: string | PathFamily, hasCredential: boolean): EdgeVerdict {
    const names = matchEdgeBudgets(path, hasCredential);
    if (names.length === 0) return ADMITTED;
    const ip = clientIp.indexOf(':') === -1 ? clientIp : this.ipv6Client(clientIp);
    const now = this.clock.now();

    let retryAfterSec = 0;
    let spent: EdgeBudgetName | undefined;
    for (const name of names) {
      const b = this.budgets.get(name)!;
      sweep(b, now);
      const w = b.byIp.get(ip);
      if (w === undefined || expired(w, now)) continue;
      if (w.count >= EDGE_BUDGET_LIMITS[name]) {
        const secs = secondsLeft(w, now);
        if (secs > retryAfterSec) {
          retryAfterSec = secs;
          spent = name;
        }
      }
    }
    if (spent !== undefined) return { ok: false, retryAfterSec, budget: spent };

    for (const name of names) {
      const b = this.budgets.get(name)!;
      const w = b.byIp.get(ip);
      if (w !== undefined && !expired(w, now)) {
        w.count += 1;
        continue;
      }
      if (w !== undefined) drop(b, w);
      while (b.byIp.size >= this.maxTrackedIps) {
        const oldest = b.byStart.shift();
        if (oldest === undefined) break;
        if (!oldest.dropped) drop(b, oldest);
      }
      const fresh: Window = { ip, startMs: now, count: 1, dropped: false };
      b.byIp.set(ip, fresh);
      b.byStart.push(fresh);
    }
    return ADMITTED;
  }

  /** The /64 of an IPv6 address, remembered (parsing one costs microseconds; a lookup, tens of nanoseconds). */
  private ipv6Client(ip: string): string {
    let client = this.ipv6Clients.get(ip);
    if (client === undefined) {
      // Bounded: past the cap it starts again (a flood of new addresses only costs their parsing).
      if (this.ipv6Clients.size >= this.maxTrackedIps) this.ipv6Clients.clear();
      client = edgeClientOf(ip);
      this.ipv6Clients.set(ip, client);
    }
    return client;
  }

  /** How many windows are held for a budget (or all budgets). For tests and metrics. */
  trackedWindows(budget?: EdgeBudgetName): number {
    if (budget !== undefined) return this.budgets.get(budget)!.byIp.size;
    let n = 0;
    for (const b of this.budgets.values()) n += b.byIp.size;
    return n;
  }

  /** Queue entries held for a budget, live or already dropped. For tests: stays O(tracked windows). */
  queuedWindows(budget: EdgeBudgetName): number {
    return this.budgets.get(budget)!.byStart.size;
  }
}

function drop(b: BudgetWindows, w: Window): void {
  w.dropped = true;
  b.byIp.delete(w.ip);
}

function sweep(b: BudgetWindows, now: number): void {
  for (let steps = 0; steps < SWEEP_STEP; steps++) {
    const w = b.byStart.peek();
    if (w === undefined || (!w.dropped && !expired(w, now))) return;
    b.byStart.shift();
    if (!w.dropped) drop(b, w);
  }
}

function expired(w: Window, now: number): boolean {
  return now - w.startMs >= EDGE_WINDOW_MS;
}

/** Seconds left in a live window, rounded up, between 1 and 60 (also if the clock stepped back). */
function secondsLeft(w: Window, now: number): number {
  const ms = w.startMs + EDGE_WINDOW_MS - now;
  return Math.min(EDGE_WINDOW_MS / 1000, Math.max(1, Math.ceil(ms / 1000)));
}
