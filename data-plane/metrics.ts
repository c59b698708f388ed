// The node's Prometheus metrics (prom-client), served on the admin listener only (GET /metrics).
//
// Hot path: prom-client's own label handling costs microseconds per observation (it validates and
// hashes the labels every time), so per-request events are counted in plain numbers held by cells
// resolved once per family, status and reason and then cached; prom-client takes them when scraped
// (counters through `collect`, latency histograms as registry metrics whose values are read from
// those cells). A response costs a few Map lookups, increments and two bucket searches. States (sync,
// journal depth, edge windows, open streams) are read only when scraped, through sources registered
// once at start.
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Counter, Gauge, Registry, type Metric } from 'prom-client';
import { isDraining } from './drain.js';
import type { PathFamily } from './routing/path-families.js';

export const registry = new Registry();


/**
 * A histogram with one label whose observations are plain array increments; prom-client's registry
 * renders it (its `get()` returns what prom-client's own Histogram returns).
 */
class FastHistogram {
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  private readonly series = new Map<string, HistogramSeries>();

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly labelName: string,
    private readonly bounds: readonly number[],
  ) {
    registry.registerMetric(this as unknown as Metric);
  }

  child(labelValue: string): HistogramSeries {
    let s = this.series.get(labelValue);
    if (!s) {
      s = new HistogramSeries(this.bounds);
      this.series.set(labelValue, s);
    }
    return s;
  }

  get(): { name: string; help: string; type: string; aggregator: string; values: Array<{ metricName: string; labels: Record<string, string | number>; value: number }> } {
    const values: Array<{ metricName: string; labels: Record<string, string | number>; value: number }> = [];
    for (const [labelValue, s] of this.series) {
      let acc = 0;
      for (let i = 0; i < this.bounds.length; i++) {
        acc += s.counts[i];
        values.push({ metricName: `${this.name}_bucket`, labels: { [this.labelName]: labelValue, le: this.bounds[i] }, value: acc });
      }
      values.push({ metricName: `${this.name}_bucket`, labels: { [this.labelName]: labelValue, le: '+Inf' }, value: s.count });
      values.push({ metricName: `${this.name}_sum`, labels: { [this.labelName]: labelValue }, value: s.sum });
      values.push({ metricName: `${this.name}_count`, labels: { [this.labelName]: labelValue }, value: s.count });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }
}

class HistogramSeries {
  /** Per bucket (not cumulative); the last slot counts what is above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;

  constructor(private readonly bounds: readonly number[]) {
    this.counts = new Float64Array(bounds.length + 1);
  }

  observe(v: number): void {
    const b = this.bounds;
    let i = 0;
    while (i < b.length && v > b[i]) i++;
    this.counts[i]++;
    this.sum += v;
    this.count++;
  }
}

// Buckets from 0.5 ms: the gateway's own work is sub-millisecond; upstream times reach minutes.
const addedLatency = new FastHistogram(
  'tollgate_node_added_latency_seconds',
  "Time the gateway itself added before the response started: from the request's arrival to the upstream call (or to its own answer when no upstream was called), including reading a JSON body.",
  'family',
  [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
);

const upstreamTime = new FastHistogram(
  'tollgate_node_upstream_seconds',
  'Time from the upstream call to its response headers (time to first byte of the provider or tool backend), for calls that did not fail.',
  'family',
  [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
);

/** A counter child and the plain count behind it, pushed into prom-client when scraped. */
interface CountCell {
  child: { inc(value?: number): void };
  n: number;
  pushed: number;
}
const requestCells: CountCell[] = [];
const upstreamErrorCells: CountCell[] = [];

function pushCells(cells: readonly CountCell[]): void {
  for (const c of cells) {
    if (c.n > c.pushed) {
      c.child.inc(c.n - c.pushed);
      c.pushed = c.n;
    }
  }
}

const requests = new Counter({
  name: 'tollgate_node_requests_total',
  help: 'Responses by route family, HTTP status and refusal reason (the error code; "none" when the gateway refused nothing).',
  labelNames: ['family', 'status', 'reason'] as const,
  registers: [registry],
  collect() {
    pushCells(requestCells);
  },
});

const upstreamErrors = new Counter({
  name: 'tollgate_node_upstream_errors_total',
  help: 'Upstream calls that failed: unreachable, reset, timed out, or broke off in the middle of a response.',
  labelNames: ['family'] as const,
  registers: [registry],
  collect() {
    pushCells(upstreamErrorCells);
  },
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

let ownerRecordsSource: () => { records: number; projects: number } = () => ({ records: 0, projects: 0 });
/** Where the owner-record gauges read from (state/response-owners.ts). */
export function setOwnerRecordsSource(fn: () => { records: number; projects: number }): void {
  ownerRecordsSource = fn;
}
new Gauge({
  name: 'tollgate_node_owner_records',
  help: 'Owner records of Responses API objects (stored responses, conversations, items) this node holds.',
  registers: [registry],
  collect() {
    this.set(ownerRecordsSource().records);
  },
});
new Gauge({
  name: 'tollgate_node_owner_record_projects',
  help: 'Projects whose owner records this node holds (a node holds those of the projects it serves).',
  registers: [registry],
  collect() {
    this.set(ownerRecordsSource().projects);
  },
});

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

new Gauge({
  name: 'tollgate_node_draining',
  help: '1 once the node received SIGTERM and drains its in-flight requests, else 0.',
  registers: [registry],
  collect() {
    this.set(isDraining() ? 1 : 0);
  },
});

/** What the request-body gauges read: the body budget (bytes held in memory) and the upload spill budget (on disk). */
export interface BodyState {
  bufferedBytes: number;
  bufferedLimitBytes: number;
  spilledBytes: number;
  spillLimitBytes: number;
}
let bodySource: () => BodyState = () => ({ bufferedBytes: 0, bufferedLimitBytes: 0, spilledBytes: 0, spillLimitBytes: 0 });

/** Where the request-body gauges read from (main.ts wires the body budget and the spill budget). */
export function setBodySource(fn: () => BodyState): void {
  bodySource = fn;
}

new Gauge({
  name: 'tollgate_node_body_buffered_bytes',
  help: 'Bytes of request bodies held in memory now (taken as they arrive, given back when the request ends).',
  registers: [registry],
  collect() {
    this.set(bodySource().bufferedBytes);
  },
});
new Gauge({
  name: 'tollgate_node_body_buffered_limit_bytes',
  help: 'The node-wide budget for request bodies in memory (--max-buffered-body-mib).',
  registers: [registry],
  collect() {
    this.set(bodySource().bufferedLimitBytes);
  },
});
new Gauge({
  name: 'tollgate_node_upload_spill_bytes',
  help: 'Bytes of uploads spilled to temporary files now.',
  registers: [registry],
  collect() {
    this.set(bodySource().spilledBytes);
  },
});
new Gauge({
  name: 'tollgate_node_upload_spill_limit_bytes',
  help: 'The node-wide budget for spilled uploads (--max-spill-mib).',
  registers: [registry],
  collect() {
    this.set(bodySource().spillLimitBytes);
  },
});

// How long the event loop was held up: a request that blocks it (a quadratic parse, a sync call)
// delays every other request on the node. Sampled by a libuv timer, off the request path.
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
new Gauge({
  name: 'tollgate_node_event_loop_delay_max_seconds',
  help: 'The longest event-loop delay seen since the previous scrape (sampled every 10 ms, so at least about 0.01).',
  registers: [registry],
  collect() {
    this.set(loopDelay.count > 0 ? loopDelay.max / 1e9 : 0);
    loopDelay.reset();
  },
});

// ---- the hot path ----------------------------------------------------------------------------

/** What Reply knows about a response when it ends (reply.ts). */
export interface ReplyMeter {
  family: PathFamily | null;
  status: number;
  /** Why the gateway refused it (errors.ts Refusal): its code is the `reason` label. */
  refusal: { readonly code: string } | null;
  startedAt: number;
  upstreamAt: number;
  headAt: number;
  upstreamError: boolean;
  aborted: boolean;
}

interface FamilyCells {
  byStatus: Map<number, Map<string, CountCell>>;
  added: HistogramSeries;
  upstream: HistogramSeries;
  upstreamErrors: CountCell;
}

const families = new Map<PathFamily, FamilyCells>();

function cellsOf(family: PathFamily): FamilyCells {
  let c = families.get(family);
  if (!c) {
    const upstreamErrorsCell = { child: upstreamErrors.labels(family.name), n: 0, pushed: 0 };
    upstreamErrorCells.push(upstreamErrorsCell);
    c = { byStatus: new Map(), added: addedLatency.child(family.name), upstream: upstreamTime.child(family.name), upstreamErrors: upstreamErrorsCell };
    families.set(family, c);
  }
  return c;
}

function requestCell(c: FamilyCells, family: PathFamily, status: number, reason: string): CountCell {
  let byReason = c.byStatus.get(status);
  if (!byReason) {
    byReason = new Map();
    c.byStatus.set(status, byReason);
  }
  let cell = byReason.get(reason);
  if (!cell) {
    cell = { child: requests.labels(family.name, String(status), reason), n: 0, pushed: 0 };
    requestCells.push(cell);
    byReason.set(reason, cell);
  }
  return cell;
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
  const c = cellsOf(family);
  // The client went away before anything was sent: 499, as nginx logs it.
  const status = r.status === 0 ? 499 : r.status;
  requestCell(c, family, status, r.refusal?.code ?? 'none').n++;
  if (r.upstreamError) c.upstreamErrors.n++;
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
