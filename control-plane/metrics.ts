// The control plane's Prometheus metrics (prom-client), served on its admin listener (GET /metrics).
// Events are counted where they happen (console calls, ingest, lease answers, transactions); states
// (connected nodes, their version lag) are read when scraped.
import type { handleUnaryCall, sendUnaryData, ServerUnaryCall, UntypedServiceImplementation } from '@grpc/grpc-js';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';

export const registry = new Registry();

const consoleCalls = new Counter({
  name: 'tollgate_cp_console_requests_total',
  help: 'Console API calls by method and gRPC status code name.',
  labelNames: ['method', 'code'] as const,
  registers: [registry],
});

const ingestRows = new Counter({
  name: 'tollgate_cp_ingest_rows_total',
  help: 'Usage rows written from node reports (rate() of it is rows per second).',
  registers: [registry],
});

const ingestReports = new Counter({
  name: 'tollgate_cp_ingest_reports_total',
  help: 'Node usage reports by result: written, or duplicate (a replay that changed nothing).',
  labelNames: ['result'] as const,
  registers: [registry],
});

const txSeconds = new Histogram({
  name: 'tollgate_cp_db_transaction_seconds',
  help: 'SQLite write transactions, BEGIN IMMEDIATE to COMMIT or ROLLBACK (queue wait excluded).',
  labelNames: ['outcome'] as const,
  buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
  registers: [registry],
});
const txCommit = txSeconds.labels('commit');
const txRollback = txSeconds.labels('rollback');

const leaseAnswers = new Counter({
  name: 'tollgate_cp_lease_answers_total',
  help: 'Lease answers to nodes by kind (key minute budget, money) and outcome (granted, refused: nothing left to give).',
  labelNames: ['kind', 'outcome'] as const,
  registers: [registry],
});
const keyGranted = leaseAnswers.labels('key', 'granted');
const keyRefused = leaseAnswers.labels('key', 'refused');
const moneyGranted = leaseAnswers.labels('money', 'granted');
const moneyRefused = leaseAnswers.labels('money', 'refused');

export interface FleetSource {
  connectedCount(): number;
  liveNodes(): Array<{ id: string; ackedVersion: number }>;
  currentVersion(): number;
  /** Reports read from node streams and not yet written. */
  ingestBacklog: number;
}

let fleet: FleetSource | null = null;
let ready = false;

/** Where the node gauges read from (main.ts wires the sync service). */
export function setFleetSource(f: FleetSource): void {
  fleet = f;
}

/** Readiness as the admin listener and the metrics report it. */
export function setReady(value: boolean): void {
  ready = value;
}

export function isReady(): boolean {
  return ready;
}

new Gauge({
  name: 'tollgate_cp_ready',
  help: '1 while the control plane serves (database open, listening, not stopping), else 0.',
  registers: [registry],
  collect() {
    this.set(ready ? 1 : 0);
  },
});
new Gauge({
  name: 'tollgate_cp_connected_nodes',
  help: 'Data-plane nodes with an open sync stream.',
  registers: [registry],
  collect() {
    this.set(fleet?.connectedCount() ?? 0);
  },
});
new Gauge({
  name: 'tollgate_cp_ingest_backlog_reports',
  help: 'Reports read from node streams and not yet written (bounded: a node whose reports wait is not read from).',
  registers: [registry],
  collect() {
    this.set(fleet?.ingestBacklog ?? 0);
  },
});
new Gauge({
  name: 'tollgate_cp_state_version',
  help: 'The current state version (what nodes converge to).',
  registers: [registry],
  collect() {
    this.set(fleet?.currentVersion() ?? 0);
  },
});
new Gauge({
  name: 'tollgate_cp_node_version_lag',
  help: 'Per connected node: state versions it has not acknowledged yet.',
  labelNames: ['node'] as const,
  registers: [registry],
  collect() {
    this.reset();
    if (!fleet) return;
    const current = fleet.currentVersion();
    for (const n of fleet.liveNodes()) this.set({ node: n.id }, Math.max(0, current - n.ackedVersion));
  },
});

/** Observer for Db.tx (store/db.ts). */
export function observeTransaction(seconds: number, committed: boolean): void {
  (committed ? txCommit : txRollback).observe(seconds);
}

export function countIngest(r: { duplicate: boolean; inserted: number }): void {
  ingestReports.labels(r.duplicate ? 'duplicate' : 'written').inc();
  if (r.inserted > 0) ingestRows.inc(r.inserted);
}

export function countLeaseAnswers(keys: ReadonlyArray<{ requests: number; tokens: number }>, orgs: ReadonlyArray<{ micros: number }>): void {
  for (const k of keys) (k.requests > 0 || k.tokens > 0 ? keyGranted : keyRefused).inc();
  for (const o of orgs) (o.micros > 0 ? moneyGranted : moneyRefused).inc();
}

const codeNames = new Map<number, string>();
function codeName(code: number): string {
  let name = codeNames.get(code);
  if (name === undefined) {
    name = GrpcStatus[code] ?? String(code);
    codeNames.set(code, name);
  }
  return name;
}

/** Wraps every unary handler of a service so each answer is counted by method and status code. */
export function countUnaryCalls<T extends object>(handlers: T): T {
  const out: Record<string, unknown> = {};
  for (const [method, h] of Object.entries(handlers as UntypedServiceImplementation)) {
    const handler = h as handleUnaryCall<unknown, unknown>;
    out[method] = (call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) =>
      handler(call, (err, value) => {
        consoleCalls.labels(method, codeName(err ? (err.code ?? GrpcStatus.UNKNOWN) : GrpcStatus.OK)).inc();
        callback(err, value);
      });
  }
  return out as T;
}

export function scrape(): Promise<string> {
  return registry.metrics();
}

export const METRICS_CONTENT_TYPE = registry.contentType;
