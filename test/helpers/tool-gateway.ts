// A gateway for tool-endpoint tests: a control plane with the given tool backends and a `tools` tier
// whose limits are far away, one node, and a key of that tier the node already knows.
import { configYaml, type GatewayYaml } from './config.js';
import { consoleClient, createKey } from './console.js';
import { waitUntilKnown } from './data-plane.js';
import { startControlPlane, startDataPlane, type ControlPlane, type DataPlane } from './processes.js';

export const TOOLS_TIER = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };

export async function startToolGateway(toolBackends: GatewayYaml[]): Promise<{ cp: ControlPlane; node: DataPlane; key: string }> {
  const cp = await startControlPlane({
    configYaml: configYaml((cfg) => {
      cfg.tool_backends = toolBackends;
      cfg.tiers.tools = TOOLS_TIER;
    }),
  });
  const node = await startDataPlane(cp);
  const c = consoleClient(cp.address, cp.secrets.operatorToken);
  const key = (await createKey(c, { tier: 'tools' })).key;
  c.close();
  await waitUntilKnown(node.url, key);
  return { cp, node, key };
}
