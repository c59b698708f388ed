// A model's prices by what the upstream reports, and whose safety identifier it sends, as the
// gateway config file names them (docs/configuration.md#reported-prices-and-the-safety-identifier):
// `service_tiers`, `long_context`, `tool_calls_usd`, `safety_identifier`. Parsed into the ModelConfig
// fields nodes receive (320–324).
import { parseUsd } from '../../proto/lib/money.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import type { LongContextPrices, ServiceTierPrices, ToolCallPrices } from '../../proto/gen/tollgate/v1/sync.js';

export const MODEL_PRICE_KEYS = ['service_tiers', 'long_context', 'tool_calls_usd', 'safety_identifier'] as const;

export interface ReportedPriceSettings {
  priority?: ServiceTierPrices;
  flex?: ServiceTierPrices;
  longContext?: LongContextPrices;
  toolCalls?: ToolCallPrices;
}

export type SafetySubject = 'project' | 'key' | 'organisation' | 'off';
const SUBJECTS: ReadonlySet<string> = new Set(['project', 'key', 'organisation', 'off']);

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function fail(where: string, msg: string): never {
  throw new ConfigError(`${where}: ${msg}`);
}

function mapping(where: string, v: unknown, keys: readonly string[]): Obj {
  if (!isObj(v)) fail(where, 'must be a mapping');
  for (const k of Object.keys(v)) if (!keys.includes(k)) fail(`${where}.${k}`, `unknown setting (known: ${keys.join(', ')})`);
  return v;
}

function usd(where: string, v: unknown): number {
  const micros = typeof v === 'number' || typeof v === 'string' ? parseUsd(String(v)) : null;
  if (micros === null || micros < 0) fail(where, `must be a non-negative USD amount with at most 6 decimals, got ${JSON.stringify(v)}`);
  return micros;
}

function tier(where: string, v: unknown): ServiceTierPrices {
  const t = mapping(where, v, ['input_usd_per_mtok', 'output_usd_per_mtok', 'cached_input_usd_per_mtok']);
  return {
    inputMicrosPerMtok: usd(`${where}.input_usd_per_mtok`, t.input_usd_per_mtok),
    outputMicrosPerMtok: usd(`${where}.output_usd_per_mtok`, t.output_usd_per_mtok),
    cachedInputMicrosPerMtok: t.cached_input_usd_per_mtok === undefined ? undefined : usd(`${where}.cached_input_usd_per_mtok`, t.cached_input_usd_per_mtok),
  };
}

/** The model's `service_tiers`, `long_context` and `tool_calls_usd`, each optional. */
export function parseReportedPrices(where: string, raw: Obj): ReportedPriceSettings {
  const out: ReportedPriceSettings = {};
  if (raw.service_tiers !== undefined && raw.service_tiers !== null) {
    const st = mapping(`${where}.service_tiers`, raw.service_tiers, ['priority', 'flex']);
    if (st.priority !== undefined) out.priority = tier(`${where}.service_tiers.priority`, st.priority);
    if (st.flex !== undefined) out.flex = tier(`${where}.service_tiers.flex`, st.flex);
  }
  if (raw.long_context !== undefined && raw.long_context !== null) {
    const w = `${where}.long_context`;
    const lc = mapping(w, raw.long_context, ['above_input_tokens', 'input_usd_per_mtok', 'output_usd_per_mtok']);
    const above = lc.above_input_tokens;
    if (typeof above !== 'number' || !Number.isSafeInteger(above) || above < 1) fail(`${w}.above_input_tokens`, `must be a whole number of tokens, at least 1, got ${JSON.stringify(above)}`);
    out.longContext = { aboveInputTokens: above, inputMicrosPerMtok: usd(`${w}.input_usd_per_mtok`, lc.input_usd_per_mtok), outputMicrosPerMtok: usd(`${w}.output_usd_per_mtok`, lc.output_usd_per_mtok) };
  }
  if (raw.tool_calls_usd !== undefined && raw.tool_calls_usd !== null) {
    const w = `${where}.tool_calls_usd`;
    const t = mapping(w, raw.tool_calls_usd, ['web_search', 'file_search', 'code_interpreter', 'image_generation']);
    const price = (k: string) => (t[k] === undefined ? undefined : usd(`${w}.${k}`, t[k]));
    out.toolCalls = { webSearchMicros: price('web_search'), fileSearchMicros: price('file_search'), codeInterpreterMicros: price('code_interpreter'), imageGenerationMicros: price('image_generation') };
  }
  return out;
}

/** `safety_identifier`: whose identifier the upstream receives; by default the project's for provider openai, none for demo. */
export function parseSafetySubject(where: string, raw: Obj, provider: string): SafetySubject {
  const v = raw.safety_identifier;
  if (v === undefined || v === null) return provider === 'openai' ? 'project' : 'off';
  if (typeof v !== 'string' || !SUBJECTS.has(v)) fail(`${where}.safety_identifier`, `must be one of project, key, organisation, off, got ${JSON.stringify(v)}`);
  return v as SafetySubject;
}
