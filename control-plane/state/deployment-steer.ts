// The operator's drain or disable of one deployment of a pooled model (issue 36; docs/configuration.md
// #draining-or-disabling-a-deployment). The control plane holds the states (store/deployment-states-repo.ts)
// and publishes them in the config every node holds (ModelDeployment.state). Pure: no I/O.
import type { GatewayConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { CpError, invalidArgument, notFound } from '../errors.js';

export const DEPLOYMENT_STATES = ['enabled', 'drained', 'disabled'] as const;
export type DeploymentSteer = (typeof DEPLOYMENT_STATES)[number];

/** States by `model\ndeployment`; a deployment absent is enabled. */
export type SteerStates = ReadonlyMap<string, string>;

export const steerKey = (model: string, deployment: string): string => `${model}\n${deployment}`;

/** The config as nodes are sent it: each pooled deployment with its state ('' when enabled). */
export function withSteer(config: GatewayConfig, states: SteerStates): GatewayConfig {
  if (states.size === 0) return config;
  return {
    ...config,
    models: config.models.map((m) =>
      m.deployments.some((d) => states.has(steerKey(m.id, d.id)))
        ? { ...m, deployments: m.deployments.map((d) => ({ ...d, state: states.get(steerKey(m.id, d.id)) ?? '' })) }
        : m,
    ),
  };
}

/**
 * Checks a change of one deployment's state against the config: the model and the deployment must
 * exist (NOT_FOUND naming them), and a model keeps at least one enabled deployment (FAILED_PRECONDITION),
 * so that draining never turns every request of a model into an error.
 */
export function checkSteer(config: GatewayConfig, states: SteerStates, model: string, deployment: string, state: string): void {
  if (!(DEPLOYMENT_STATES as readonly string[]).includes(state)) throw invalidArgument(`state must be enabled, drained or disabled, got ${JSON.stringify(state)}`);
  const m = config.models.find((x) => x.id === model);
  if (!m) throw notFound(`model ${JSON.stringify(model)} is not in the gateway config`);
  if (!m.deployments.some((d) => d.id === deployment)) {
    const ids = m.deployments.map((d) => d.id);
    throw notFound(`model ${model} has no deployment ${JSON.stringify(deployment)}${ids.length > 0 ? ` (its deployments: ${ids.join(', ')})` : ' (it lists no deployments)'}`);
  }
  if (state === 'enabled') return;
  const othersEnabled = m.deployments.some((d) => d.id !== deployment && !states.has(steerKey(model, d.id)));
  if (!othersEnabled) throw new CpError('FAILED_PRECONDITION', `${deployment} is the last enabled deployment of model ${model}: enable another before you ${state === 'drained' ? 'drain' : 'disable'} it`);
}
