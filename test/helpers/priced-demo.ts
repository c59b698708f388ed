// A demo model priced so that one short chat request costs about a dollar, for the tests of money
// across nodes (limits-exact-money, money-limits), and what they share around it.
import type { DataPlane } from './processes.js';
import { bearer, chatBody, request, type HttpResult } from './http.js';
import type { Console } from './console.js';
import type { GatewayYaml } from './config.js';
import { eventually } from './data-plane.js';

/** Adds `demo-pricey` (0.10 USD a token) to the config and to the free and paid tiers. */
export function pricey(cfg: GatewayYaml): void {
  cfg.models.push({ id: 'demo-pricey', provider: 'demo', kind: 'chat', input_usd_per_mtok: '100000', output_usd_per_mtok: '100000' });
  cfg.tiers.free.models.push('demo-pricey');
  cfg.tiers.paid.models.push('demo-pricey');
}

/** One chat request of `demo-pricey`. */
export const chat = (node: DataPlane, key: string, content = 'Hi'): Promise<HttpResult> =>
  request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(content, 'demo-pricey') });

/** What an answer of `demo-pricey` cost, in micro-dollars. */
export const costOf = (r: HttpResult): number => (r.body.usage.prompt_tokens + r.body.usage.completion_tokens) * 100_000;

/** Waits until `n` nodes are connected and every one has applied the control plane's current version. */
export async function allNodesCurrent(admin: Console, n: number): Promise<void> {
  await eventually(async () => {
    const r = await admin.listNodes();
    const live = r.nodes.filter((x) => x.connected);
    return live.length === n && live.every((x) => x.ackedVersion >= r.currentVersion);
  }, 'every node on the current version');
}
