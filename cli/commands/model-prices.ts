// The prices by what the upstream reports, as `tollgate models list` shows them: each model's service
// tiers, long-context prices and built-in tool prices (docs/billing.md#prices-by-what-the-upstream-reports).
import type { ModelInfo } from '../../proto/gen/tollgate/v1/console.js';
import type { ServiceTierPrices } from '../../proto/gen/tollgate/v1/sync.js';
import { formatUsd } from '../../proto/lib/money.js';

interface TierJson {
  input_usd_per_mtok: string;
  output_usd_per_mtok: string;
  cached_input_usd_per_mtok: string;
}

export interface ReportedPricesJson {
  service_tiers: { priority?: TierJson; flex?: TierJson };
  long_context: { above_input_tokens: number; input_usd_per_mtok: string; output_usd_per_mtok: string } | null;
  tool_calls_usd: { web_search?: string; file_search?: string; code_interpreter?: string; image_generation?: string };
}

function tier(t: ServiceTierPrices): TierJson {
  return {
    input_usd_per_mtok: formatUsd(t.inputMicrosPerMtok),
    output_usd_per_mtok: formatUsd(t.outputMicrosPerMtok),
    // Unset: billed at the tier's input price.
    cached_input_usd_per_mtok: formatUsd(t.cachedInputMicrosPerMtok ?? t.inputMicrosPerMtok),
  };
}

/** A model's tier, long-context and tool prices as the JSON output names them (the config's names). */
export function reportedPricesJson(m: ModelInfo): ReportedPricesJson {
  const tiers: ReportedPricesJson['service_tiers'] = {};
  if (m.priority) tiers.priority = tier(m.priority);
  if (m.flex) tiers.flex = tier(m.flex);
  const lc = m.longContext;
  const tools: ReportedPricesJson['tool_calls_usd'] = {};
  const t = m.toolCalls;
  if (t?.webSearchMicros !== undefined) tools.web_search = formatUsd(t.webSearchMicros);
  if (t?.fileSearchMicros !== undefined) tools.file_search = formatUsd(t.fileSearchMicros);
  if (t?.codeInterpreterMicros !== undefined) tools.code_interpreter = formatUsd(t.codeInterpreterMicros);
  if (t?.imageGenerationMicros !== undefined) tools.image_generation = formatUsd(t.imageGenerationMicros);
  return {
    service_tiers: tiers,
    long_context: lc ? { above_input_tokens: lc.aboveInputTokens, input_usd_per_mtok: formatUsd(lc.inputMicrosPerMtok), output_usd_per_mtok: formatUsd(lc.outputMicrosPerMtok) } : null,
    tool_calls_usd: tools,
  };
}

/** The table's three columns: "priority 2.50/10.00/0.25 flex …" (input/output/cached), "above 272000: 5.00/22.50", "web_search 0.01 …". */
export function reportedPricesCells(p: ReportedPricesJson): [string | null, string | null, string | null] {
  const tiers = Object.entries(p.service_tiers).map(([name, t]) => `${name} ${t.input_usd_per_mtok}/${t.output_usd_per_mtok}/${t.cached_input_usd_per_mtok}`);
  const lc = p.long_context ? `above ${p.long_context.above_input_tokens}: ${p.long_context.input_usd_per_mtok}/${p.long_context.output_usd_per_mtok}` : null;
  const tools = Object.entries(p.tool_calls_usd).map(([name, usd]) => `${name} ${usd}`);
  return [tiers.length > 0 ? tiers.join(' ') : null, lc, tools.length > 0 ? tools.join(' ') : null];
}
