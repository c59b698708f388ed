// The node's Prometheus metrics (prom-client), served on the admin listener only (GET /metrics).
//
// Hot path: a finished response costs one Map lookup chain to a pre-bound counter child and two
// histogram observations on pre-bound children (resolved once per family, status and reason, then
// cached), plus two performance.now() readings taken by Reply. Everything that is a state rather than
// an event (sync, journal depth, edge windows, open streams) is read only when scraped, through a
// source registered once at start.
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { PathFamily } from './routing/path-families.js';

export const registry = new Registry();

const requests = new Counter({
  name: 'tollgate_node_requests_total',
  help: 'Responses by route family, HTTP status and refusal reason (the error code; "none" when the gateway refused nothing).',
  labelNames: ['family', 'status', 'reason'] as const,
  registers: [registry],
});

// Buckets from 0.5 ms: the gateway's own work is sub-millisecond; upstream times reach minutes.
const addedLatency = new Histogram({
  name: 'tollgate_node_added_latency_seconds',
  help: "Time the gateway itself added before the response started: from the request's arrival to the upstream call (or to its own answer when no upstream was called), including reading a JSON body.",
  labelNames: ['family'] as const,
  buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
  registers: [registry],
});

const upstreamTime = new Histogram({
  name: 'tollgate_node_upstream_seconds',
  help: 'Time from the upstream call to its response headers (time to first byte of the provider or tool backend), for calls that did not fail.',
  labelNames: ['family'] as const,
  buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
  registers: [registry],
});

const upstreamErrors = new Counter({
  name: 'tollgate_node_upstream_errors_total',
  help: 'Upstream calls that failed: unreachable, reset, timed out, or broke off in the middle of a response.',
  labelNames: ['family'] as const,
  registers: [registry],
});

let inflight = 0;
new Gauge({
  name: 'tollgate_node_inflight_requests',
  help: 'HTTP requests received and not yet answered in full.',
  registers: [registry],
  collect() {
    this.set(inflight);
  },
});

/** Open long-lived responses and sockets by kind: `sse` (streamed responses), `realtime` (WebSockets). */
const openStreamCounts = new Map<string, number>([
  ['sse', 0],
  ['realtime', 0],
]);
new Gauge({
  name: 'tollgate_node_open_streams',
  help: 'Open streamed responses (kind="sse") and realtime sockets (kind="realtime").',
  labelNames: ['kind'] as const,
  registers: [registry],
  collect() {
    for (const [kind, n] of openStreamCounts) this.set({ kind }, n);
  },
});

/**
 * A counter of open streams or sockets of one kind, for code that owns such connections (realtime:
 * call `opened()` on open and `closed()` exactly once on close).
 */
export function openStreamGauge(kind: string): { opened(): void; closed(): void } {
  if (!openStreamCounts.has(kind)) openStreamCounts.set(kind, 0);
  return {
    opened: () => void openStreamCounts.set(kind, openStreamCounts.get(kind)! + 1),
    closed: () => void openStreamCounts.set(kind, openStreamCounts.get(kind)! - 1),
  };
}
const sseStreams = openStreamGauge('sse');

// ---- states read at scrape time --------------------------------------------------------------

export interface SyncState {
  connected: boolean;
  appliedVersion: number;
  /** Seconds since the node lost the control plane (its state may be that old); 0 while connected. */
  lagSeconds: number;
}

let syncSource: () => SyncState = () => ({ connected: false, appliedVersion: 0, lagSeconds: 0 });
let journalDepthSource: () => number = () => 0;
let edgeWindowsSource: () => number = () => 0;

/** Where the sync gauges read from (main.ts wires the sync client and state holder). */
export function setSyncSource(fn: () => SyncState): void {
  syncSource = fn;
}

/** Where the journal-depth gauge reads from: usage reports not yet acknowledged by the control plane. */
export function setJournalDepthSource(fn: () => number): void {
  journalDepthSource = fn;
}

/** Where the edge-windows gauge reads from (the edge budgets' tracked windows). */
export function setEdgeWindowsSource(fn: () => number): void {
  edgeWindowsSource = fn;
}

new Gauge({
  name: 'tollgate_node_sync_connected',
  help: '1 while the sync stream to the control plane is up, else 0.',
  registers: [registry],
  collect() {
    this.set(syncSource().connected ? 1 : 0);
  },
});
new Gauge({
  name: 'tollgate_node_sync_applied_version',
  help: 'The state version this node serves from (0 before its first snapshot).',
  registers: [registry],
  collect() {
    this.set(syncSource().appliedVersion);
  },
});
new Gauge({
  name: 'tollgate_node_sync_lag_seconds',
  help: 'Seconds since the node lost the control plane, so how old its state may be; 0 while connected.',
  registers: [registry],
  collect() {
    this.set(syncSource().lagSeconds);
  },
});
new Gauge({
  name: 'tollgate_node_journal_depth',
  help: 'Usage reports not yet acknowledged by the control plane (unacknowledged usage).',
  registers: [registry],
  collect() {
    this.set(journalDepthSource());
  },
});
new Gauge({
  name: 'tollgate_node_edge_windows',
  help: 'Per-IP edge budget windows currently tracked (all budgets).',
  registers: [registry],
  collect() {
    this.set(edgeWindowsSource());
  },
});

let draining = false;
new Gauge({
  name: 'tollgate_node_draining',
  help: '1 once the node received SIGTERM and drains its in-flight requests, else 0.',
  registers: [registry],
  collect() {
    this.set(draining ? 1 : 0);
  },
});
export function markDraining(): void {
  draining = true;
}

// ---- the hot path ----------------------------------------------------------------------------

/** What Reply knows about a response when it ends (reply.ts). */
export interface ReplyMeter {
  family: PathFamily | null;
  status: number;
  reason: string;
  startedAt: number;
  upstreamAt: number;
  headAt: number;
  upstreamError: boolean;
  aborted: boolean;
}

type CounterChild = ReturnType<typeof requests.labels>;
type HistogramChild = ReturnType<typeof addedLatency.labels>;

interface FamilyChildren {
  byStatus: Map<number, Map<string, CounterChild>>;
  added: HistogramChild;
  upstream: HistogramChild;
  upstreamErrors: ReturnType<typeof upstreamErrors.labels>;
}

const families = new Map<PathFamily, FamilyChildren>();

function childrenOf(family: PathFamily): FamilyChildren {
  let c = families.get(family);
  if (!c) {
    c = {
      byStatus: new Map(),
      added: addedLatency.labels(family.name),
      upstream: upstreamTime.labels(family.name),
      upstreamErrors: upstreamErrors.labels(family.name),
    };
    families.set(family, c);
  }
  return c;
}

function requestChild(c: FamilyChildren, family: PathFamily, status: number, reason: string): CounterChild {
  let byReason = c.byStatus.get(status);
  if (!byReason) {
    byReason = new Map();
    c.byStatus.set(status, byReason);
  }
  let child = byReason.get(reason);
  if (!child) {
    child = requests.labels(family.name, String(status), reason);
    byReason.set(reason, child);
  }
  return child;
}

/** A request arrived (its Reply will call `recordReply` when it ends). */
export function requestStarted(): void {
  inflight++;
}

/** A streamed (chunked) response started. */
export function streamStarted(): void {
  sseStreams.opened();
}

export function streamEnded(): void {
  sseStreams.closed();
}

/** Counts one finished response of the API listener. */
export function recordReply(r: ReplyMeter): void {
  inflight--;
  const family = r.family!;
  const c = childrenOf(family);
  // The client went away before anything was sent: 499, as nginx logs it.
  const status = r.status === 0 ? 499 : r.status;
  requestChild(c, family, status, r.reason || 'none').inc();
  if (r.upstreamError) c.upstreamErrors.inc();
  if (r.headAt === 0) return;
  if (r.upstreamAt > 0) {
    c.added.observe((r.upstreamAt - r.startedAt) / 1000);
    // Failed calls are counted as upstream errors, not timed.
    if (!r.upstreamError && r.headAt >= r.upstreamAt) c.upstream.observe((r.headAt - r.upstreamAt) / 1000);
  } else {
    c.added.observe((r.headAt - r.startedAt) / 1000);
  }
}

/** The Prometheus text exposition. */
export function scrape(): Promise<string> {
  return registry.metrics();
}

export const METRICS_CONTENT_TYPE = registry.contentType;
