// bench:tenants' flags (test/bench/tenants.ts), parsed once on import, and the figures derived from
// them that every part of the bench reads.
import { parseArgs } from 'node:util';

export const { values: opts } = parseArgs({
  options: {
    keys: { type: 'string' },
    orgs: { type: 'string' },
    rate: { type: 'string' },
    zipf: { type: 'string', default: '1.0' },
    duration: { type: 'string', default: '30' },
    nodes: { type: 'string' },
    idle: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '0' },
    'no-align': { type: 'boolean', default: false },
    'no-control': { type: 'boolean', default: false },
    'cpu-prof': { type: 'string' },
    'fake-nodes': { type: 'boolean', default: false },
    'fake-leases': { type: 'string', default: 'shares' },
    'no-fake-logs': { type: 'boolean', default: false },
    bare: { type: 'boolean', default: false },
    'fake-report-every-ms': { type: 'string', default: '1000' },
    'report-every-ms': { type: 'string' },
    stores: { type: 'string', default: 'sqlite,postgres' },
  },
});
export const FAKE = opts['fake-nodes']!;
// Defaults: 5,000 keys in 500 organisations at 400 req/s on 1 then 3 nodes; with --fake-nodes, cluster
// scale (target 3): 10 simulated nodes, 100,000 req/s, 100,000 keys in 10,000 organisations.
opts.keys ??= FAKE ? '100000' : '5000';
opts.orgs ??= FAKE ? '10000' : '500';
opts.rate ??= FAKE ? '100000' : '400';
opts.nodes ??= FAKE ? '10' : '1,3';
export const KEYS = positive('keys');
export const ORGS = Math.min(positive('orgs'), KEYS);
export const RATE = positive('rate');
export const ZIPF = Number(opts.zipf);
export const DURATION_SEC = positive('duration');
export const NODE_COUNTS = opts.nodes!.split(',').map(Number);
export const IDLE_SEC = Number(opts.idle);
/** Seconds of the K keys' load sent to the same nodes before the measured run (0: none): steady state, without the nodes' first minute. */
export const WARMUP_SEC = Number(opts.warmup);
if (!Number.isFinite(WARMUP_SEC) || WARMUP_SEC < 0) throw new Error(`--warmup must be a number of seconds, 0 or more, got ${JSON.stringify(opts.warmup)}`);
for (const flag of ['bare', 'fake-report-every-ms', 'no-fake-logs', 'fake-leases'] as const) {
  if (!FAKE && process.argv.some((a) => a === `--${flag}` || a.startsWith(`--${flag}=`))) throw new Error(`--${flag} is a flag of --fake-nodes`);
}
/** --stores: the control plane's stores measured one after the other in the run (PostgreSQL: a real server, test/helpers/postgres-server.ts). */
export const STORES = opts.stores!.split(',').map((x) => x.trim()) as ('sqlite' | 'postgres')[];
if (STORES.length === 0 || STORES.some((x) => x !== 'sqlite' && x !== 'postgres') || new Set(STORES).size !== STORES.length) {
  throw new Error(`--stores must list sqlite and/or postgres once each, comma-separated, got ${JSON.stringify(opts.stores)}`);
}
export const ALIGN = !opts['no-align'] && DURATION_SEC < 60;
export const TAIL_MS = 2000;
export const MB = 1024 * 1024;

export function positive(name: 'keys' | 'orgs' | 'rate' | 'duration'): number {
  const n = Number(opts[name]);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${name} must be a positive number, got ${JSON.stringify(opts[name])}`);
  return n;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
