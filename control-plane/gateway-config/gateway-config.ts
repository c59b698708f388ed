// The gateway config file's schema (YAML, format of control-plane/demo-config.yaml): a parsed document
// checked into typed settings and the proto nodes receive. Pure apart from reading the api_key_file
// secrets it names; the environment is passed in (config.ts reads the file and process.env). A bad
// document is one ConfigError line naming the setting.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseIpRange } from '../../proto/lib/ip.js';
import { parseUsd } from '../../proto/lib/money.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import type { GatewayConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { parseWebhooksConfig, type WebhookSettings } from './webhook-config.js';
import { parseResponsesConfig } from './responses-config.js';
import { parseModelPool, POOL_KEYS, readUpstreamKey, type ModelPool } from './deployments.js';
import { MODEL_PRICE_KEYS, parseReportedPrices, parseSafetySubject, type ReportedPriceSettings, type SafetySubject } from './model-price-config.js';

export const DEMO_CONFIG_PATH = fileURLToPath(new URL('../demo-config.yaml', import.meta.url));

export type ModelKind = 'chat' | 'embeddings' | 'transcription' | 'speech' | 'realtime';

export interface TierSettings {
  name: string;
  rpm: number;
  tpm: number;
  maxParallelRequests: number;
  monthlyCapMicros: number | null;
  freeGrantMicros: number;
  models: string[];
}

/** A model's prices, as both the nodes' config (sync.proto ModelConfig) and the console's model list carry them. */
export function modelPrices(m: ModelSettings): Pick<ModelSettings, 'inputMicrosPerMtok' | 'outputMicrosPerMtok' | 'audioMicrosPerUnit' | 'cachedInputMicrosPerMtok' | 'cacheWriteMicrosPerMtok' | 'inputAudioMicrosPerMtok' | 'outputAudioMicrosPerMtok'> & ReportedPriceSettings {
  return {
    inputMicrosPerMtok: m.inputMicrosPerMtok,
    outputMicrosPerMtok: m.outputMicrosPerMtok,
    audioMicrosPerUnit: m.audioMicrosPerUnit,
    cachedInputMicrosPerMtok: m.cachedInputMicrosPerMtok,
    cacheWriteMicrosPerMtok: m.cacheWriteMicrosPerMtok,
    inputAudioMicrosPerMtok: m.inputAudioMicrosPerMtok,
    outputAudioMicrosPerMtok: m.outputAudioMicrosPerMtok,
    ...m.reported,
  };
}

export interface ModelSettings {
  id: string;
  provider: 'demo' | 'openai';
  kind: ModelKind;
  upstreamModel: string;
  baseUrl: string;
  apiKeyEnv: string | null;
  /** The upstream key read from `api_key_file` (re-read on every reload); null when not configured. */
  apiKeyFromFile: string | null;
  inputMicrosPerMtok: number;
  outputMicrosPerMtok: number;
  audioMicrosPerUnit: number;
  /** Prices of usage parts the upstream bills apart; undefined: the fallback (proto/lib/money.ts TokenPrices). */
  cachedInputMicrosPerMtok?: number;
  cacheWriteMicrosPerMtok?: number;
  inputAudioMicrosPerMtok?: number;
  outputAudioMicrosPerMtok?: number;
  /** `max_output_tokens`: the most output one request may produce; undefined: none configured (docs/money-limits.md). */
  maxOutputTokens?: number;
  /** `service_tiers`, `long_context`, `tool_calls_usd` (model-price-config.ts). */
  reported: ReportedPriceSettings;
  safetyIdentifier: SafetySubject;
  timeoutMs: number;
  voices: string[];
  /** `deployments` and the failover settings (deployments.ts); null: the one upstream above. */
  pool: ModelPool | null;
}

export interface RealtimeUpstreamSettings {
  model: string;
  url: string;
  apiKeyEnv: string | null;
  upstreamModel: string;
  connectTimeoutMs: number;
}

/** One tool prefix and the backends serving it (tool_backends in the config file). */
export interface ToolBackendSettings {
  prefix: string;
  /** The first of baseUrls (what older nodes read). */
  baseUrl: string;
  baseUrls: string[];
  timeoutMs: number;
  connectTimeoutMs: number;
  headerTimeoutMs: number;
  idleTimeoutMs: number;
}

export interface GatewaySettings {
  serviceName: string;
  defaultTier: string;
  tiers: Map<string, TierSettings>;
  models: Map<string, ModelSettings>;
  toolBackends: ToolBackendSettings[];
  realtimeUpstreams: RealtimeUpstreamSettings[];
  trustedProxies: string[];
  maxStalenessMs: number;
  /** `max_orgs_per_account` (default 3): organisations an account may own; the operator is exempt. */
  maxOrgsPerAccount: number;
  /** `webhooks:` and `webhook_balance_low_usd` (control plane only; never sent to nodes). */
  webhooks: WebhookSettings;
}

export interface LoadedGatewayConfig {
  settings: GatewaySettings;
  /** What nodes receive; holds resolved upstream credentials: never log or persist it whole. */
  proto: GatewayConfig;
}

const TOP_KEYS = new Set([
  'service_name',
  'default_tier',
  'tiers',
  'models',
  'tool_backends',
  'realtime_upstreams',
  'trusted_proxies',
  'max_staleness_sec',
  'max_staleness_ms',
  'max_orgs_per_account',
  'webhooks',
  'webhook_balance_low_usd',
  'responses',
]);
const TIER_KEYS = new Set(['rpm', 'tpm', 'max_parallel_requests', 'monthly_cap_usd', 'free_grant_usd', 'models']);
const MODEL_KEYS = new Set([
  'id',
  'provider',
  'kind',
  'upstream_model',
  'base_url',
  'api_key_env',
  'api_key_file',
  'input_usd_per_mtok',
  'output_usd_per_mtok',
  'audio_usd_per_unit',
  'cached_input_usd_per_mtok',
  'cache_write_usd_per_mtok',
  'input_audio_usd_per_mtok',
  'output_audio_usd_per_mtok',
  'max_output_tokens',
  'timeout_ms',
  'voices',
  ...POOL_KEYS,
  ...MODEL_PRICE_KEYS,
]);
const KINDS = new Set<ModelKind>(['chat', 'embeddings', 'transcription', 'speech', 'realtime']);
const REALTIME_UPSTREAM_KEYS = new Set(['model', 'url', 'api_key_env', 'upstream_model', 'connect_timeout_ms']);
const DEFAULT_REALTIME_CONNECT_TIMEOUT_MS = 10_000;
const DEFAULT_UPSTREAM_TIMEOUT_MS = 60_000;
const DEFAULT_MAX_ORGS_PER_ACCOUNT = 3;

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function fail(where: string, msg: string): never {
  throw new ConfigError(`${where}: ${msg}`);
}

function checkKeys(where: string, obj: Obj, allowed: Set<string>): void {
  for (const k of Object.keys(obj)) if (!allowed.has(k)) fail(where, `unknown setting ${JSON.stringify(k)}`);
}

function posInt(where: string, v: unknown, min = 1): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) fail(where, `must be a whole number >= ${min}, got ${JSON.stringify(v)}`);
  return v;
}

/** A price that may be left out (null or absent: undefined, billed at its fallback price). */
function optionalUsd(where: string, v: unknown): number | undefined {
  return v === undefined || v === null ? undefined : usd(where, v);
}

function usd(where: string, v: unknown, fallback: number | null = null): number {
  if (v === undefined) {
    if (fallback === null) fail(where, 'is required');
    return fallback;
  }
  const micros = typeof v === 'string' || typeof v === 'number' ? parseUsd(String(v)) : null;
  if (micros === null || micros < 0) fail(where, `must be a non-negative USD amount like "5.00", got ${JSON.stringify(v)}`);
  return micros;
}

function str(where: string, v: unknown, fallback?: string): string {
  if (v === undefined && fallback !== undefined) return fallback;
  if (typeof v !== 'string' || v.trim() === '') fail(where, 'must be a non-empty string');
  return v.trim();
}

function strList(where: string, v: unknown): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || v.some((x) => typeof x !== 'string' || x.trim() === '')) fail(where, 'must be a list of strings');
  return (v as string[]).map((x) => x.trim());
}

function httpUrl(where: string, v: unknown): string {
  const s = str(where, v);
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    fail(where, `is not a URL: ${JSON.stringify(s)}`);
  }
  if (!['http:', 'https:', 'ws:', 'wss:'].includes(u.protocol)) fail(where, `must be an http(s) or ws(s) URL, got ${JSON.stringify(s)}`);
  return s.replace(/\/+$/, '');
}

const TOOL_BACKEND_KEYS = new Set(['prefix', 'base_url', 'base_urls', 'timeout_ms', 'connect_timeout_ms', 'header_timeout_ms', 'idle_timeout_ms']);
const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;

/**
 * `tool_backends`: a list of { prefix, base_url | base_urls, timeout_ms, connect_timeout_ms,
 * header_timeout_ms, idle_timeout_ms }. The older form (one base_url and one timeout_ms) stays valid:
 * timeout_ms is the default of the header and idle timeouts.
 */
function parseToolBackends(list: unknown): ToolBackendSettings[] {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) fail('tool_backends', 'must be a list');
  const seen = new Set<string>();
  return list.map((raw, i) => {
    const where = `tool_backends[${i}]`;
    if (!isObj(raw)) fail(where, 'must be a mapping');
    checkKeys(where, raw, TOOL_BACKEND_KEYS);
    const rawPrefix = str(`${where}.prefix`, raw.prefix);
    if (!/^\/v1\/[A-Za-z0-9_./-]+$/.test(rawPrefix)) fail(`${where}.prefix`, `must be a path under /v1/, got ${JSON.stringify(rawPrefix)}`);
    const prefix = rawPrefix.replace(/\/+$/, '');
    if (seen.has(prefix)) fail(`${where}.prefix`, `${prefix} is configured twice; list several URLs under one entry's base_urls instead`);
    seen.add(prefix);
    if (raw.base_url !== undefined && raw.base_urls !== undefined) fail(where, 'has both base_url and base_urls; use one');
    let baseUrls: string[];
    if (raw.base_urls !== undefined) {
      if (!Array.isArray(raw.base_urls) || raw.base_urls.length === 0) fail(`${where}.base_urls`, 'must be a non-empty list of URLs');
      baseUrls = raw.base_urls.map((u, j) => httpUrl(`${where}.base_urls[${j}]`, u));
    } else {
      baseUrls = [httpUrl(`${where}.base_url`, raw.base_url)];
    }
    for (const [j, u] of baseUrls.entries()) {
      const url = new URL(u);
      if (url.protocol !== 'http:' && url.protocol !== 'https:') fail(`${where}.base_urls[${j}]`, 'must be an http(s) URL');
      if (url.username || url.password || url.search || url.hash) fail(`${where}.base_urls[${j}]`, 'must not carry credentials, a query or a fragment');
    }
    if (new Set(baseUrls).size !== baseUrls.length) fail(`${where}.base_urls`, 'lists the same URL twice');
    const ms = (name: string, fallback: number) => (raw[name] === undefined ? fallback : posInt(`${where}.${name}`, raw[name]));
    const timeoutMs = ms('timeout_ms', DEFAULT_UPSTREAM_TIMEOUT_MS);
    return {
      prefix,
      baseUrl: baseUrls[0],
      baseUrls,
      timeoutMs,
      connectTimeoutMs: ms('connect_timeout_ms', Math.min(DEFAULT_CONNECT_TIMEOUT_MS, timeoutMs)),
      headerTimeoutMs: ms('header_timeout_ms', timeoutMs),
      idleTimeoutMs: ms('idle_timeout_ms', timeoutMs),
    };
  });
}

/** Reads an `api_key_file`; throws a one-line message (never the file's contents) when it cannot. */
export type SecretFileReader = (path: string) => string;

export function readSecretFromDir(dir: string): SecretFileReader {
  return (path) => {
    const full = resolve(dir, path);
    try {
      return readFileSync(full, 'utf8').trim();
    } catch (err) {
      throw new Error(`cannot read ${full} (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
    }
  };
}

/**
 * Validates the parsed YAML document. `env` resolves `api_key_env`, `readSecret` reads `api_key_file`
 * (relative to the config file). Throws ConfigError with one line.
 */
export function parseGatewayConfig(doc: unknown, env: NodeJS.ProcessEnv = {}, readSecret: SecretFileReader = readSecretFromDir(process.cwd())): LoadedGatewayConfig {
  if (!isObj(doc)) throw new ConfigError('gateway config: must be a YAML mapping');
  checkKeys('gateway config', doc, TOP_KEYS);
  const serviceName = str('service_name', doc.service_name, 'tollgate');
  if (!/^[A-Za-z0-9_]{1,32}$/.test(serviceName)) fail('service_name', 'must be 1-32 letters, digits or underscores (it goes into every key: sk-<service_name>-...)');

  if (!Array.isArray(doc.models) || doc.models.length === 0) fail('models', 'must be a non-empty list');
  const models = new Map<string, ModelSettings>();
  doc.models.forEach((raw, i) => {
    let where = `models[${i}]`;
    if (!isObj(raw)) fail(where, 'must be a mapping');
    const id = str(`${where}.id`, raw.id);
    where = `model ${id}`;
    checkKeys(where, raw, MODEL_KEYS);
    if (models.has(id)) fail(where, 'is defined twice');
    const provider = str(`${where}.provider`, raw.provider);
    if (provider !== 'demo' && provider !== 'openai') fail(`${where}.provider`, `must be "demo" or "openai", got ${JSON.stringify(provider)}`);
    const kind = str(`${where}.kind`, raw.kind, 'chat') as ModelKind;
    if (!KINDS.has(kind)) fail(`${where}.kind`, `must be one of ${[...KINDS].join(', ')}, got ${JSON.stringify(kind)}`);
    const pool = parseModelPool(where, id, raw, env, readSecret);
    const first = pool?.deployments[0];
    const baseUrl = first ? first.baseUrl : raw.base_url === undefined ? '' : httpUrl(`${where}.base_url`, raw.base_url);
    // A realtime model's upstream is its realtime_upstreams entry, not a base URL.
    if (provider === 'openai' && !baseUrl && kind !== 'realtime') fail(`${where}.base_url`, 'is required for provider openai');
    const key = readUpstreamKey(where, raw, env, readSecret);
    models.set(id, {
      id,
      provider,
      kind,
      upstreamModel: first ? first.upstreamModel : str(`${where}.upstream_model`, raw.upstream_model, id),
      baseUrl,
      apiKeyEnv: key.env,
      apiKeyFromFile: first ? first.upstreamApiKey : key.env ? null : key.value,
      inputMicrosPerMtok: usd(`${where}.input_usd_per_mtok`, raw.input_usd_per_mtok, 0),
      outputMicrosPerMtok: usd(`${where}.output_usd_per_mtok`, raw.output_usd_per_mtok, 0),
      audioMicrosPerUnit: usd(`${where}.audio_usd_per_unit`, raw.audio_usd_per_unit, 0),
      cachedInputMicrosPerMtok: optionalUsd(`${where}.cached_input_usd_per_mtok`, raw.cached_input_usd_per_mtok),
      cacheWriteMicrosPerMtok: optionalUsd(`${where}.cache_write_usd_per_mtok`, raw.cache_write_usd_per_mtok),
      inputAudioMicrosPerMtok: optionalUsd(`${where}.input_audio_usd_per_mtok`, raw.input_audio_usd_per_mtok),
      outputAudioMicrosPerMtok: optionalUsd(`${where}.output_audio_usd_per_mtok`, raw.output_audio_usd_per_mtok),
      maxOutputTokens: raw.max_output_tokens === undefined || raw.max_output_tokens === null ? undefined : posInt(`${where}.max_output_tokens`, raw.max_output_tokens),
      reported: parseReportedPrices(where, raw),
      safetyIdentifier: parseSafetySubject(where, raw, provider),
      timeoutMs: raw.timeout_ms === undefined ? DEFAULT_UPSTREAM_TIMEOUT_MS : posInt(`${where}.timeout_ms`, raw.timeout_ms),
      voices: strList(`${where}.voices`, raw.voices),
      pool,
    });
  });

  if (!isObj(doc.tiers) || Object.keys(doc.tiers).length === 0) fail('tiers', 'must be a non-empty mapping of tier name to settings');
  const tiers = new Map<string, TierSettings>();
  for (const [name, raw] of Object.entries(doc.tiers)) {
    const where = `tier ${name}`;
    if (!/^[A-Za-z0-9_-]{1,64}$/.test(name)) fail(where, 'name must be letters, digits, - or _');
    if (!isObj(raw)) fail(where, 'must be a mapping');
    checkKeys(where, raw, TIER_KEYS);
    const planModels = strList(`${where}.models`, raw.models);
    for (const m of planModels) if (!models.has(m)) fail(`${where}.models`, `names unknown model ${JSON.stringify(m)}`);
    tiers.set(name, {
      name,
      rpm: posInt(`${where}.rpm`, raw.rpm),
      tpm: posInt(`${where}.tpm`, raw.tpm),
      maxParallelRequests: posInt(`${where}.max_parallel_requests`, raw.max_parallel_requests ?? 100),
      monthlyCapMicros: raw.monthly_cap_usd === null || raw.monthly_cap_usd === undefined ? null : usd(`${where}.monthly_cap_usd`, raw.monthly_cap_usd),
      freeGrantMicros: usd(`${where}.free_grant_usd`, raw.free_grant_usd, 0),
      models: [...new Set(planModels)],
    });
  }
  const defaultTier = str('default_tier', doc.default_tier, tiers.has('free') ? 'free' : [...tiers.keys()][0]);
  if (!tiers.has(defaultTier)) fail('default_tier', `names unknown tier ${JSON.stringify(defaultTier)}`);

  const toolBackends = parseToolBackends(doc.tool_backends);
  const realtimeUpstreams = (() => {
    const list = doc.realtime_upstreams ?? [];
    if (!Array.isArray(list)) fail('realtime_upstreams', 'must be a list');
    return list.map((raw, i) => {
      const where = `realtime_upstreams[${i}]`;
      if (!isObj(raw)) fail(where, 'must be a mapping');
      checkKeys(where, raw, REALTIME_UPSTREAM_KEYS);
      const model = str(`${where}.model`, raw.model);
      const m = models.get(model);
      if (!m) fail(`${where}.model`, `names unknown model ${JSON.stringify(model)}`);
      if (m.kind !== 'realtime' || m.provider !== 'openai') fail(`${where}.model`, `${JSON.stringify(model)} must be a model of kind realtime with provider openai`);
      const url = httpUrl(`${where}.url`, raw.url);
      if (!/^wss?:/i.test(url)) fail(`${where}.url`, `must be a ws:// or wss:// URL, got ${JSON.stringify(url)}`);
      const apiKeyEnv = raw.api_key_env === undefined || raw.api_key_env === null ? null : str(`${where}.api_key_env`, raw.api_key_env);
      if (apiKeyEnv && !env[apiKeyEnv]) fail(`${where}.api_key_env`, `environment variable ${apiKeyEnv} is not set`);
      return {
        model,
        url,
        apiKeyEnv,
        upstreamModel: str(`${where}.upstream_model`, raw.upstream_model, m.upstreamModel),
        connectTimeoutMs: raw.connect_timeout_ms === undefined ? DEFAULT_REALTIME_CONNECT_TIMEOUT_MS : posInt(`${where}.connect_timeout_ms`, raw.connect_timeout_ms),
      };
    });
  })();
  for (const m of models.values()) {
    const n = realtimeUpstreams.filter((u) => u.model === m.id).length;
    if (m.kind === 'realtime' && m.provider === 'openai' && n !== 1) fail(`model ${m.id}`, `a realtime model with provider openai needs exactly one realtime_upstreams entry, found ${n}`);
  }
  const trustedProxies = strList('trusted_proxies', doc.trusted_proxies);
  // Parsed here only to refuse what a node could never match; nodes parse the list once per config version.
  trustedProxies.forEach((entry, i) => {
    const r = parseIpRange(entry);
    if (typeof r === 'string') fail(`trusted_proxies[${i}]`, `${JSON.stringify(entry)}: ${r}`);
  });
  let maxStalenessMs = 0;
  if (doc.max_staleness_ms !== undefined) maxStalenessMs = posInt('max_staleness_ms', doc.max_staleness_ms, 0);
  else if (doc.max_staleness_sec !== undefined) maxStalenessMs = posInt('max_staleness_sec', doc.max_staleness_sec, 0) * 1000;

  const maxOrgsPerAccount = doc.max_orgs_per_account === undefined ? DEFAULT_MAX_ORGS_PER_ACCOUNT : posInt('max_orgs_per_account', doc.max_orgs_per_account, 0);
  const webhooks = parseWebhooksConfig(doc.webhooks, doc.webhook_balance_low_usd, env);
  const settings: GatewaySettings = { serviceName, defaultTier, tiers, models, toolBackends, realtimeUpstreams, trustedProxies, maxStalenessMs, maxOrgsPerAccount, webhooks };
  const proto: GatewayConfig = {
    serviceName,
    tiers: [...tiers.values()].map((t) => ({
      name: t.name,
      rpm: t.rpm,
      tpm: t.tpm,
      maxParallelRequests: t.maxParallelRequests,
      monthlyCapMicros: t.monthlyCapMicros ?? undefined,
      freeGrantMicros: t.freeGrantMicros,
      allowedModels: t.models,
    })),
    models: [...models.values()].map((m) => ({
      id: m.id,
      provider: m.provider,
      upstreamModel: m.upstreamModel,
      baseUrl: m.baseUrl,
      upstreamApiKey: m.apiKeyEnv ? (env[m.apiKeyEnv] ?? '') : (m.apiKeyFromFile ?? ''),
      kind: m.kind,
      ...modelPrices(m),
      maxOutputTokens: m.maxOutputTokens,
      safetyIdentifier: m.safetyIdentifier,
      timeoutMs: m.timeoutMs,
      voices: m.voices,
      deployments: m.pool?.deployments ?? [],
      maxAttempts: m.pool?.maxAttempts ?? 0,
      failoverTimeoutMs: m.pool?.failoverTimeoutMs ?? 0,
      circuitFailures: m.pool?.circuitFailures ?? 0,
      circuitCooldownMs: m.pool?.circuitCooldownMs ?? 0,
    })),
    toolBackends,
    realtimeUpstreams: realtimeUpstreams.map((u) => ({
      model: u.model,
      url: u.url,
      upstreamApiKey: u.apiKeyEnv ? (env[u.apiKeyEnv] ?? '') : '',
      upstreamModel: u.upstreamModel,
      connectTimeoutMs: u.connectTimeoutMs,
    })),
    trustedProxies,
    maxStalenessMs,
    responses: parseResponsesConfig(doc.responses, { models, tiers }),
  };
  return { settings, proto };
}

/** A copy of the proto config safe to persist: upstream credentials removed. */
export function redactGatewayConfig(cfg: GatewayConfig): GatewayConfig {
  return { ...cfg, models: cfg.models.map((m) => ({ ...m, upstreamApiKey: '', deployments: m.deployments.map((d) => ({ ...d, upstreamApiKey: '' })) })), realtimeUpstreams: cfg.realtimeUpstreams.map((u) => ({ ...u, upstreamApiKey: '' })) };
}

