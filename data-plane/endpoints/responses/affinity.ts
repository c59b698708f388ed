// Affinity (issue 36): a stored response, a conversation or an item lives in the upstream account of
// the deployment that created it, and only that account can answer for it. So a request of a pooled
// model that names one is pinned to that deployment: never another (its account would answer 404),
// and when that one is down the client is told so (pooled-upstreams.ts, a 503). The ids named are
// already checked to be the key's project's (owned-ids.ts). Pure: no I/O.
import type { ModelConfig } from '../../../proto/gen/tollgate/v1/sync.js';
import type { GatewayState } from '../../state/key-table.js';
import { GatewayError } from '../../errors.js';
import type { ResponseOwner } from '../../state/response-owners.js';
import { conversationOf, isItemReference, type OwnerLookup } from './owned-ids.js';

type Obj = Record<string, unknown>;

/** Where a request goes: `undefined` any deployment (it names nothing stored, or its model has one upstream), else that deployment's id ('' the first). */
export type Pin = string | undefined;

function isObj(v: unknown): v is Obj {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** The base URL and key of the upstream account that holds `owner`'s object; null: gone from the config. */
function accountOf(owner: ResponseOwner, state: GatewayState): { baseUrl: string; key: string } | null {
  const m = state.view.models.get(owner.model);
  if (!m) return null;
  if (m.deployments.length === 0) return { baseUrl: m.baseUrl, key: m.upstreamApiKey };
  const d = owner.deployment ? m.deployments.find((x) => x.id === owner.deployment) : m.deployments[0];
  return d ? { baseUrl: d.baseUrl, key: d.upstreamApiKey } : null;
}

/**
 * The deployment of `model` that holds `owner`'s object: its own record when the object was made with
 * this model; else the deployment reaching the same upstream account; null when none of this model's
 * does. `undefined` when `model` is not pooled (its one upstream is where it goes).
 */
export function deploymentFor(model: ModelConfig, owner: ResponseOwner, state: GatewayState): string | null | undefined {
  if (model.deployments.length === 0) return undefined;
  if (owner.model === model.id) return owner.deployment ?? '';
  const account = accountOf(owner, state);
  const d = account && model.deployments.find((x) => x.baseUrl === account.baseUrl && x.upstreamApiKey === account.key);
  return d ? d.id : null;
}

/**
 * The deployment a request of `model` must go to, from the stored objects its body names
 * (`previous_response_id`, `conversation`, `item_reference` items in `itemsField`; `pathId`: the one
 * its path names), or the refusal when no single deployment of the model holds them all.
 */
export function pinOf(model: ModelConfig, body: Obj | null, state: GatewayState, owners: OwnerLookup, nowMs: number, itemsField: 'input' | 'items' = 'input', pathId = ''): Pin | GatewayError {
  if (model.deployments.length === 0) return undefined;
  const named: Array<[string, string]> = [];
  if (pathId !== '') named.push([pathId, 'id']);
  if (body) {
    if (typeof body.previous_response_id === 'string') named.push([body.previous_response_id, 'previous_response_id']);
    const conv = conversationOf(body);
    if (typeof conv === 'string' && conv !== '') named.push([conv, 'conversation']);
    const items = body[itemsField];
    if (Array.isArray(items)) {
      for (let i = 0; i < items.length; i++) {
        const item = items[i];
        if (isObj(item) && isItemReference(item) && typeof item.id === 'string') named.push([item.id, `${itemsField}[${i}].id`]);
      }
    }
  }
  let pin: Pin;
  let firstParam = '';
  for (const [id, param] of named) {
    const owner = owners.get(id, nowMs);
    if (!owner) continue;
    const d = deploymentFor(model, owner, state);
    if (d === undefined) continue;
    if (d === null) {
      return new GatewayError('INVALID_REQUEST', `'${id.slice(0, 128)}' lives on an upstream account that model ${model.id} does not use; name the model it was created with.`, { param: param === 'id' ? null : param });
    }
    // '' (recorded before pools kept the deployment) is the first deployment.
    const at = d === '' ? (model.deployments[0]?.id ?? '') : d;
    if (pin === undefined) {
      pin = at;
      firstParam = param;
    } else if (pin !== at) {
      return new GatewayError('INVALID_REQUEST', `'${id.slice(0, 128)}' and the object named by '${firstParam}' live on different upstream accounts of model ${model.id}: one request cannot name both.`, { param });
    }
  }
  return pin;
}
