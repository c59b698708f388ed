// Pooled models' deployments (issue 36), the operator's: `tollgate models status` (each deployment's
// state and limits from the config, its health and this minute's use as each connected node last said
// in NodeStatus) and `tollgate models drain|disable|enable` (ControlState.setDeploymentState: stored,
// published to every node as a config version, acks awaited as a revocation's are).
import type { ConsoleServiceServer, DeploymentStatus, ModelStatus, NodeDeploymentHealth } from '../../proto/gen/tollgate/v1/console.js';
import type { DeploymentHealth, ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { notFound } from '../errors.js';
import { steerKey } from '../state/deployment-steer.js';
import { ConsoleAccess } from './console-access.js';

type PoolCalls = 'getModelsStatus' | 'setDeploymentState';

export class PoolService extends ConsoleAccess {
  handlers(): Pick<ConsoleServiceServer, PoolCalls> {
    return {
      getModelsStatus: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        const all = this.state.config.models;
        if (req.model && !all.some((m) => m.id === req.model)) throw notFound(`model ${JSON.stringify(req.model)} is not in the gateway config`);
        const models = all.filter((m) => (req.model ? m.id === req.model : m.deployments.length > 0));
        // Nodes that said how they see their deployments, one entry per node (its newest connection).
        const reported = new Map<string, DeploymentHealth[]>();
        for (const n of this.fleet.liveNodes()) if (n.deployments) reported.set(n.id, n.deployments);
        return { models: models.map((m) => this.modelStatus(m, reported)) };
      }),

      setDeploymentState: this.unary(async (req, caller) => {
        this.requireOperator(caller);
        const version = await this.state.setDeploymentState(req.model, req.deployment, req.state);
        this.log(`deployment ${req.model}/${req.deployment} ${req.state}: version ${version}`);
        const acks = await this.fleet.awaitAcks(version, this.opts.revokeAckTimeoutMs);
        return { model: req.model, deployment: req.deployment, state: req.state, version, nodesTotal: acks.total, nodesConfirmed: acks.confirmed };
      }),
    };
  }

  private modelStatus(m: ModelConfig, reported: ReadonlyMap<string, DeploymentHealth[]>): ModelStatus {
    const deployments = m.deployments.map((d): DeploymentStatus => {
      const nodes: NodeDeploymentHealth[] = [];
      for (const [nodeId, rows] of reported) {
        // A node that never sent the deployment a request holds no state for it: closed, unused.
        const health = rows.find((h) => h.model === m.id && h.deployment === d.id) ?? unused(m.id, d.id);
        nodes.push({ nodeId, health });
      }
      nodes.sort((a, b) => a.nodeId.localeCompare(b.nodeId));
      return {
        id: d.id,
        state: this.state.deploymentStates.get(steerKey(m.id, d.id)) ?? 'enabled',
        weight: d.weight,
        rpm: d.rpm,
        tpm: d.tpm,
        maxParallelRequests: d.maxParallelRequests,
        nodes,
      };
    });
    return { id: m.id, deployments };
  }
}

function unused(model: string, deployment: string): DeploymentHealth {
  return { model, deployment, circuit: 'closed', openUntilMs: 0, coolUntilMs: 0, consecutiveFailures: 0, recentErrors: [], inFlight: 0, minute: 0, minuteRequests: 0, minuteTokens: 0 };
}
