// Messages on the node streams by direction and kind (docs/scale.md): what the control plane's CPU
// per request is spent on. Plain counters bumped per message (no label lookup on the hot path), read
// into `tollgate_cp_sync_messages_total{direction,kind}` when /metrics is scraped.
import { Counter } from 'prom-client';
import { registry } from '../metrics.js';
import type { ControlMessage, NodeMessage } from '../../proto/gen/tollgate/v1/sync.js';

const inbound = new Map<string, number>();
const outbound = new Map<string, number>();

/** The message's field, and for lease messages what they carry (`leaseRequest.used`, `leaseGrant.pools`, …). */
function kindOf(msg: object): string {
  for (const k in msg) {
    const v = (msg as Record<string, unknown>)[k];
    if (v === undefined || v === null) continue;
    if (k === 'leaseRequest' || k === 'leaseGrant') {
      const parts: string[] = [];
      for (const f in v as object) {
        const x = (v as Record<string, unknown>)[f];
        if (f === 'leaseEpoch' || x === undefined || x === null || x === false || x === 0 || x === '' || (Array.isArray(x) && x.length === 0)) continue;
        parts.push(f);
      }
      return `${k}.${parts.join('+') || 'empty'}`;
    }
    return k;
  }
  return 'empty';
}

export function countInbound(msg: NodeMessage): void {
  const k = kindOf(msg);
  inbound.set(k, (inbound.get(k) ?? 0) + 1);
}

export function countOutbound(msg: ControlMessage): void {
  const k = kindOf(msg);
  outbound.set(k, (outbound.get(k) ?? 0) + 1);
}

let reported = new Map<string, number>();
new Counter({
  name: 'tollgate_cp_sync_messages_total',
  help: 'Messages on the node sync streams, by direction (in: from nodes, out: to nodes) and kind (the message field set).',
  labelNames: ['direction', 'kind'] as const,
  registers: [registry],
  collect() {
    const next = new Map<string, number>();
    for (const [dir, m] of [['in', inbound], ['out', outbound]] as const) {
      for (const [kind, n] of m) {
        const id = `${dir}\u0000${kind}`;
        next.set(id, n);
        const delta = n - (reported.get(id) ?? 0);
        if (delta > 0) this.labels(dir, kind).inc(delta);
      }
    }
    reported = next;
  },
});
