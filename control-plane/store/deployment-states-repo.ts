// Deployments of pooled models the operator drained or disabled (migration 040); absent: enabled.
import type { Queryable } from './db.js';

export interface DeploymentStateRow {
  model: string;
  deployment: string;
  state: string;
}

export function listDeploymentStates(q: Queryable): Promise<DeploymentStateRow[]> {
  return q.all('SELECT model, deployment, state FROM deployment_states ORDER BY model, deployment');
}

/** `enabled` deletes the row; any other state is kept. */
export async function setDeploymentState(q: Queryable, model: string, deployment: string, state: string, at: string): Promise<void> {
  if (state === 'enabled') await q.run('DELETE FROM deployment_states WHERE model = ? AND deployment = ?', [model, deployment]);
  else await q.run('INSERT INTO deployment_states (model, deployment, state, changed_at) VALUES (?, ?, ?, ?) ON CONFLICT (model, deployment) DO UPDATE SET state = excluded.state, changed_at = excluded.changed_at', [model, deployment, state, at]);
}
