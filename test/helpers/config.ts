// Test gateway configs: the shipped demo config with changes, as YAML text for startControlPlane.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { ROOT } from './processes.js';

export type GatewayYaml = Record<string, any>;

export function demoConfig(): GatewayYaml {
  return parse(readFileSync(join(ROOT, 'control-plane', 'demo-config.yaml'), 'utf8'));
}

export function configYaml(edit: (cfg: GatewayYaml) => void): string {
  const cfg = demoConfig();
  edit(cfg);
  return stringify(cfg);
}

/** Adds an OpenAI-compatible model served by a fake upstream to the config and to the given tiers. */
export function addUpstreamModel(cfg: GatewayYaml, id: string, baseUrl: string, tiers: string[] = ['free', 'paid'], extra: GatewayYaml = {}): void {
  cfg.models.push({
    id,
    provider: 'openai',
    kind: 'chat',
    base_url: baseUrl,
    api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY',
    upstream_model: `upstream-${id}`,
    timeout_ms: 10_000,
    input_usd_per_mtok: '0.50',
    output_usd_per_mtok: '1.50',
    ...extra,
  });
  for (const t of tiers) cfg.tiers[t].models.push(id);
}
