// A gateway for tool-endpoint tests: a control plane with the given tool backends and a `tools` tier
// whose limits are far away, one node, and a key of that tier the node already knows. Built on the
// gateway fixture (launchGateway); its processes also stop with stopAll.
import { configYaml, type GatewayYaml } from './config.js';
import { launchGateway, type Gateway } from './gateway-fixture.js';
import type { ControlPlane, DataPlane } from './processes.js';

export const TOOLS_TIER = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };

export async function startToolGateway(toolBackends: GatewayYaml[]): Promise<{ cp: ControlPlane; node: DataPlane; key: string; gw: Gateway }> {
  const gw = await launchGateway({
    controlPlane: {
      configYaml: configYaml((cfg) => {
        cfg.tool_backends = toolBackends;
        cfg.tiers.tools = TOOLS_TIER;
      }),
    },
  });
  const key = (await gw.fundedKey({ tier: 'tools' })).key;
  // As before: the console is not needed after the key (closing it twice, in gw.close(), is harmless).
  gw.console.close();
  return { cp: gw.cp, node: gw.node, key, gw };
}
