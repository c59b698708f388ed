// A model's upstream pool in the gateway config (issue 36): `deployments`, each one upstream account
// with its key, weight and own limits, and the model's failover and circuit settings. Pure apart from
// reading the api_key_file secrets named; a bad entry is one ConfigError line naming the model and the field.
import { parseUsd } from '../../proto/lib/money.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import type { ModelDeployment } from '../../proto/gen/tollgate/v1/sync.js';

/** What gateway-config.ts's `readSecretFromDir` returns: reads an `api_key_file`, throws one line. */
type SecretReader = (path: string) => string;
type Obj = Record<string, unknown>;

/** The model-level settings of a pool, besides `deployments`. */
export const POOL_KEYS = ['deployments', 'max_attempts', 'failover_timeout_ms', 'circuit_failures', 'circuit_cooldown_ms'] as const;

/** Price overrides a deployment may carry: config name → ModelDeployment field. */
const PRICE_KEYS = {
  input_usd_per_mtok: 'inputMicrosPerMtok',
  output_usd_per_mtok: 'outputMicrosPerMtok',
  audio_usd_per_unit: 'audioMicrosPerUnit',
  cached_input_usd_per_mtok: 'cachedInputMicrosPerMtok',
  cache_write_usd_per_mtok: 'cacheWriteMicrosPerMtok',
  input_audio_usd_per_mtok: 'inputAudioMicrosPerMtok',
  output_audio_usd_per_mtok: 'outputAudioMicrosPerMtok',
} as const;

const DEPLOYMENT_KEYS = new Set(['id', 'base_url', 'api_key_env', 'api_key_file', 'upstream_model', 'weight', 'rpm', 'tpm', 'max_parallel_requests', 'provider', ...Object.keys(PRICE_KEYS)]);

/** What `deployments` replaces on the model. */
const REPLACED = ['base_url', 'api_key_env', 'api_key_file', 'upstream_model'] as const;

export interface ModelPool {
  deployments: ModelDeployment[];
  /** 0: the node's defaults (every deployment once; the model's timeout; 5 failures; 30 s). */
  maxAttempts: number;
  failoverTimeoutMs: number;
  circuitFailures: number;
  circuitCooldownMs: number;
}

function fail(where: string, msg: string): never {
  throw new ConfigError(`${where}: ${msg}`);
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function text(where: string, v: unknown): string {
  if (typeof v !== 'string' || v.trim() === '') fail(where, 'must be a non-empty string');
  return v.trim();
}

function wholeNumber(where: string, v: unknown): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) fail(where, `must be a whole number >= 1, got ${JSON.stringify(v)}`);
  return v;
}

const optionalWhole = (where: string, v: unknown): number => (v === undefined || v === null ? 0 : wholeNumber(where, v));

function httpUrl(where: string, v: unknown): string {
  const s = text(where, v);
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    fail(where, `is not a URL: ${JSON.stringify(s)}`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') fail(where, `must be an http(s) URL, got ${JSON.stringify(s)}`);
  return s.replace(/\/+$/, '');
}

/**
 * The upstream key of a model or deployment entry: `api_key_env` (resolved from `env`) or
 * `api_key_file` (read through `readSecret`), never both; null when neither is given.
 */
export function readUpstreamKey(where: string, raw: Obj, env: NodeJS.ProcessEnv, readSecret: SecretReader): { env: string | null; value: string | null } {
  const keyEnv = raw.api_key_env === undefined || raw.api_key_env === null ? null : text(`${where}.api_key_env`, raw.api_key_env);
  const keyFile = raw.api_key_file === undefined || raw.api_key_file === null ? null : text(`${where}.api_key_file`, raw.api_key_file);
  if (keyEnv && keyFile) fail(where, 'give api_key_env or api_key_file, not both');
  if (keyEnv) {
    if (!env[keyEnv]) fail(`${where}.api_key_env`, `environment variable ${keyEnv} is not set`);
    return { env: keyEnv, value: env[keyEnv]! };
  }
  if (!keyFile) return { env: null, value: null };
  let value: string;
  try {
    value = readSecret(keyFile);
  } catch (err) {
    fail(`${where}.api_key_file`, (err as Error).message);
  }
  if (!value) fail(`${where}.api_key_file`, `${keyFile} is empty`);
  return { env: null, value };
}

/**
 * A model's pool settings, or null when it lists no `deployments` (its own base_url is its one
 * upstream). `where` is "model <id>"; `modelId` the default upstream model name.
 */
export function parseModelPool(where: string, modelId: string, raw: Obj, env: NodeJS.ProcessEnv, readSecret: SecretReader): ModelPool | null {
  if (raw.deployments === undefined || raw.deployments === null) {
    for (const k of POOL_KEYS) if (raw[k] !== undefined) fail(`${where}.${k}`, 'applies only to a model with deployments');
    return null;
  }
  for (const k of REPLACED) if (raw[k] !== undefined) fail(`${where}.${k}`, `deployments replace the model's ${k}; give it on each deployment`);
  const list = raw.deployments;
  if (!Array.isArray(list) || list.length === 0) fail(`${where}.deployments`, 'must be a non-empty list');
  const seen = new Set<string>();
  const deployments = list.map((d, i) => {
    const at = `${where}.deployments[${i}]`;
    if (!isObj(d)) fail(at, 'must be a mapping');
    for (const k of Object.keys(d)) if (!DEPLOYMENT_KEYS.has(k)) fail(at, `unknown setting ${JSON.stringify(k)}`);
    const id = text(`${at}.id`, d.id);
    if (!/^[A-Za-z0-9_.-]{1,64}$/.test(id)) fail(`${at}.id`, `must be 1-64 letters, digits, ".", "-" or "_", got ${JSON.stringify(id)}`);
    if (seen.has(id)) fail(`${at}.id`, `${JSON.stringify(id)} is listed twice`);
    seen.add(id);
    const baseUrl = httpUrl(`${at}.base_url`, d.base_url);
    const key = readUpstreamKey(at, d, env, readSecret);
    if (key.value === null) fail(at, 'needs api_key_env or api_key_file');
    const weight = d.weight === undefined ? 1 : d.weight;
    if (typeof weight !== 'number' || !Number.isFinite(weight) || weight <= 0) fail(`${at}.weight`, `must be a positive number, got ${JSON.stringify(weight)}`);
    const out: ModelDeployment = {
      id,
      baseUrl,
      upstreamApiKey: key.value,
      upstreamModel: d.upstream_model === undefined ? modelId : text(`${at}.upstream_model`, d.upstream_model),
      weight,
      rpm: optionalWhole(`${at}.rpm`, d.rpm),
      tpm: optionalWhole(`${at}.tpm`, d.tpm),
      maxParallelRequests: optionalWhole(`${at}.max_parallel_requests`, d.max_parallel_requests),
      // The operator's drain or disable is the control plane's state, not the file's (ControlState).
      state: '',
    };
    if (d.provider !== undefined) {
      // Failover runs inside the OpenAI-compatible provider: a pool is of HTTP upstreams.
      if (d.provider !== 'openai') fail(`${at}.provider`, `must be "openai", got ${JSON.stringify(d.provider)}`);
      out.provider = d.provider;
    }
    for (const [name, field] of Object.entries(PRICE_KEYS)) {
      const v = d[name];
      if (v === undefined || v === null) continue;
      const micros = typeof v === 'string' || typeof v === 'number' ? parseUsd(String(v)) : null;
      if (micros === null || micros < 0) fail(`${at}.${name}`, `must be a non-negative USD amount like "5.00", got ${JSON.stringify(v)}`);
      out[field] = micros;
    }
    return out;
  });
  return {
    deployments,
    maxAttempts: optionalWhole(`${where}.max_attempts`, raw.max_attempts),
    failoverTimeoutMs: optionalWhole(`${where}.failover_timeout_ms`, raw.failover_timeout_ms),
    circuitFailures: optionalWhole(`${where}.circuit_failures`, raw.circuit_failures),
    circuitCooldownMs: optionalWhole(`${where}.circuit_cooldown_ms`, raw.circuit_cooldown_ms),
  };
}
