// `models status [--model ID]` and `models drain|disable|enable MODEL DEPLOYMENT` (operator only):
// pooled models' deployments, seen and steered (docs/operating.md#upstream-pools).
import type { DeploymentStatus } from '../../proto/gen/tollgate/v1/console.js';
import type { DeploymentHealth } from '../../proto/gen/tollgate/v1/sync.js';
import { formatTable, printJson } from '../output.js';
import { optionalString, type Command } from './command.js';

const iso = (ms: number): string | null => (ms > 0 ? new Date(ms).toISOString() : null);

function nodeJson(nodeId: string, h: DeploymentHealth) {
  return {
    node_id: nodeId,
    circuit: h.circuit,
    open_until: h.circuit === 'closed' ? null : iso(h.openUntilMs),
    cooling_until: iso(h.coolUntilMs),
    consecutive_failures: h.consecutiveFailures,
    recent_errors: Object.fromEntries(h.recentErrors.map((e) => [e.kind, e.count])),
    in_flight: h.inFlight,
    minute: h.minute,
    minute_requests: h.minuteRequests,
    minute_tokens: h.minuteTokens,
  };
}

function deploymentJson(d: DeploymentStatus) {
  const nodes = d.nodes.map((n) => nodeJson(n.nodeId, n.health!));
  const circuits = new Set(nodes.map((n) => n.circuit));
  // The cluster's minute: the newest any node reported; each node's count of it, summed.
  const minute = Math.max(0, ...nodes.map((n) => n.minute));
  const ofMinute = nodes.filter((n) => n.minute === minute);
  return {
    id: d.id,
    state: d.state,
    weight: d.weight,
    // One value when every node agrees, else "mixed" (each node's in `nodes`); "unknown" when no node reported.
    circuit: circuits.size === 1 ? [...circuits][0] : circuits.size === 0 ? 'unknown' : 'mixed',
    rpm: d.rpm,
    tpm: d.tpm,
    max_parallel_requests: d.maxParallelRequests,
    minute_requests: ofMinute.reduce((s, n) => s + n.minute_requests, 0),
    minute_tokens: ofMinute.reduce((s, n) => s + n.minute_tokens, 0),
    in_flight: nodes.reduce((s, n) => s + n.in_flight, 0),
    nodes,
  };
}

type DeploymentView = ReturnType<typeof deploymentJson>;

/** "node-a: open until 12:01:05Z, node-b: closed" when the nodes differ; the one value when they agree. */
function healthCell(d: DeploymentView): string {
  const one = (n: DeploymentView['nodes'][number]) => {
    const parts = [n.circuit + (n.open_until && n.circuit === 'open' ? ` until ${n.open_until.slice(11, 19)}Z` : '')];
    if (n.cooling_until) parts.push(`cooling until ${n.cooling_until.slice(11, 19)}Z`);
    return parts.join(', ');
  };
  const texts = d.nodes.map(one);
  if (texts.length > 0 && texts.every((t) => t === texts[0])) return texts[0];
  return d.nodes.map((n, i) => `${n.node_id}: ${texts[i]}`).join('; ') || 'unknown';
}

function errorsCell(d: DeploymentView): string {
  const sum = new Map<string, number>();
  for (const n of d.nodes) for (const [k, v] of Object.entries(n.recent_errors)) sum.set(k, (sum.get(k) ?? 0) + v);
  return [...sum].map(([k, v]) => `${k}=${v}`).join(' ');
}

const ofLimit = (used: number, limit: number) => (limit > 0 ? `${used}/${limit}` : `${used}`);

function steerCommand(verb: 'drain' | 'disable' | 'enable', state: string, summary: string): Command {
  return {
    name: `models ${verb}`,
    summary,
    synopsis: 'MODEL DEPLOYMENT',
    positionals: ['MODEL', 'DEPLOYMENT'],
    async run(ctx, args) {
      const [model, deployment] = args.positionals;
      const r = await ctx.client().setDeploymentState({ model, deployment, state });
      if (ctx.out.json) {
        printJson(ctx.out, { model: r.model, deployment: r.deployment, state: r.state, version: r.version, nodes_total: r.nodesTotal, nodes_confirmed: r.nodesConfirmed });
        return;
      }
      ctx.out.write(`${r.model}/${r.deployment}: ${r.state} (version ${r.version}, confirmed by ${r.nodesConfirmed} of ${r.nodesTotal} node(s))\n`);
    },
  };
}

export const poolCommands: Command[] = [
  {
    name: 'models status',
    summary: "Each deployment of each pooled model: its state, its health (circuit, cooling, recent errors) as each node sees it, and its room this minute (operator only).",
    synopsis: '[--model ID]',
    options: { model: { type: 'string', value: 'ID', help: 'only this model' } },
    notes: ['Health differs per node (each sees its own failures): where the nodes differ, each is named.', 'Room: requests and input tokens the nodes sent the deployment this UTC minute, of its rpm and tpm.'],
    async run(ctx, args) {
      const res = await ctx.client().getModelsStatus({ model: optionalString(args, 'model') ?? '' });
      const models = res.models.map((m) => ({ id: m.id, deployments: m.deployments.map(deploymentJson) }));
      if (ctx.out.json) {
        printJson(ctx.out, { models });
        return;
      }
      ctx.out.write(formatTable(
        ['model', 'deployment', 'state', 'health', 'recent_errors', 'rpm_used', 'tpm_used', 'in_flight'],
        models.flatMap((m) => m.deployments.map((d) => [m.id, d.id, d.state, healthCell(d), errorsCell(d), ofLimit(d.minute_requests, d.rpm), ofLimit(d.minute_tokens, d.tpm), d.in_flight])),
      ));
    },
  },
  steerCommand('drain', 'drained', 'Send no new request to one deployment of a pooled model (requests in flight finish; a stored object it holds is still reached), without a config reload (operator only).'),
  steerCommand('disable', 'disabled', 'Send no request at all to one deployment of a pooled model (requests in flight finish), without a config reload (operator only).'),
  steerCommand('enable', 'enabled', 'Choose a drained or disabled deployment again (operator only).'),
];
