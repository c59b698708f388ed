// A pooled model's deployments in the node's /metrics (issue 36): requests sent, errors by kind,
// failovers, circuit state, requests in flight and the use of the upstream's limits this minute. The
// counts are plain numbers on each DeploymentState (upstream-pool.ts); prom-client reads them only
// when scraped. The same rows go to the control plane in NodeStatus (`tollgate models status`).
import { Counter, Gauge } from 'prom-client';
import type { DeploymentHealth } from '../../proto/gen/tollgate/v1/sync.js';
import { registry } from '../metrics.js';
import type { DeploymentState } from './upstream-pool.js';

export interface DeploymentRow {
  model: string;
  state: DeploymentState;
  /** 0 closed, 1 half-open, 2 open. */
  circuit: number;
  /** The current UTC minute (ms since epoch / 60000) on the node's clock. */
  minute: number;
  minuteRequests: number;
  minuteTokens: number;
}

let source: () => Iterable<DeploymentRow> = () => [];

/** Where the deployment metrics read from (the OpenAI provider's pools). */
export function setDeploymentSource(fn: () => Iterable<DeploymentRow>): void {
  source = fn;
}

const CIRCUITS = ['closed', 'half-open', 'open'];

/** Each deployment's health and this minute's use, as NodeStatus carries it to the control plane. */
export function deploymentHealth(): DeploymentHealth[] {
  const out: DeploymentHealth[] = [];
  for (const r of source()) {
    const s = r.state;
    out.push({
      model: r.model,
      deployment: s.id,
      circuit: CIRCUITS[r.circuit],
      openUntilMs: s.openUntil,
      coolUntilMs: s.coolUntil,
      consecutiveFailures: s.failures,
      recentErrors: [...s.recentErrors(r.minute)].map(([kind, count]) => ({ kind, count })),
      inFlight: s.inFlight,
      minute: r.minute,
      minuteRequests: r.minuteRequests,
      minuteTokens: r.minuteTokens,
    });
  }
  return out;
}

const LABELS = ['model', 'deployment'] as const;

/** A counter whose values are read from the rows when scraped. */
function countFrom(name: string, help: string, value: (r: DeploymentRow) => number): void {
  new Counter({
    name,
    help,
    labelNames: LABELS,
    registers: [registry],
    collect() {
      this.reset();
      for (const r of source()) {
        const n = value(r);
        if (n > 0) this.inc({ model: r.model, deployment: r.state.id }, n);
      }
    },
  });
}

function gaugeFrom(name: string, help: string, value: (r: DeploymentRow) => number): void {
  new Gauge({
    name,
    help,
    labelNames: LABELS,
    registers: [registry],
    collect() {
      this.reset();
      for (const r of source()) this.set({ model: r.model, deployment: r.state.id }, value(r));
    },
  });
}

countFrom('tollgate_node_deployment_requests_total', 'Requests sent to each deployment of a pooled model (every attempt).', (r) => r.state.sent);
countFrom('tollgate_node_deployment_failovers_total', 'Requests moved from this deployment to another before the first byte.', (r) => r.state.failovers);
gaugeFrom('tollgate_node_deployment_circuit', "The deployment's circuit: 0 closed, 1 half-open, 2 open.", (r) => r.circuit);
gaugeFrom('tollgate_node_deployment_in_flight', 'Requests to the deployment in flight on this node.', (r) => r.state.inFlight);
gaugeFrom('tollgate_node_deployment_minute_requests', 'Requests this node sent the deployment in the current UTC minute (against its rpm).', (r) => r.minuteRequests);
gaugeFrom('tollgate_node_deployment_minute_tokens', 'Input tokens (estimated) this node sent the deployment in the current UTC minute (against its tpm).', (r) => r.minuteTokens);

new Counter({
  name: 'tollgate_node_deployment_errors_total',
  help: 'Failed attempts at each deployment by kind: refused, timeout, reset, unreachable (no head), 429, 5xx.',
  labelNames: ['model', 'deployment', 'kind'],
  registers: [registry],
  collect() {
    this.reset();
    for (const r of source()) for (const [kind, n] of r.state.errors) this.inc({ model: r.model, deployment: r.state.id, kind }, n);
  },
});
