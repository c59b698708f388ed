// Prices by what the upstream reports (docs/billing.md#prices-by-what-the-upstream-reports): the
// service tier an answer says it ran on, a long prompt, and the built-in tool calls its output lists,
// on top of a model's token prices. One function prices a finished request (`reportedCostMicros`,
// what RequestContext.complete records and `usage.cost` shows); the same tables give the worst case
// reserved before admission and the refusal of a tier or tool the model has no price for. Pure.
import type { ModelConfig, ServiceTierPrices } from '../gen/tollgate/v1/sync.js';
import { usageCostMicros, type TokenCounts, type TokenPrices } from './money.js';

/** The built-in tools priced per call, by the output item type that reports a call. */
export const TOOL_ITEM_TYPES = {
  web_search_call: 'web_search',
  file_search_call: 'file_search',
  code_interpreter_call: 'code_interpreter',
  image_generation_call: 'image_generation',
} as const;
export type BuiltInTool = (typeof TOOL_ITEM_TYPES)[keyof typeof TOOL_ITEM_TYPES];

/** Calls of each built-in tool an answer reports (code_interpreter: container sessions). */
export type ToolCallCounts = Partial<Record<BuiltInTool, number>>;

/** What an answer reports besides its tokens that changes its price. */
export interface ReportedFacts {
  /** The `service_tier` the answer reports (not the one requested). */
  serviceTier?: string;
  toolCalls?: ToolCallCounts;
}

/** Tiers a request may name without a price of their own: billed at the model's standard prices. */
const STANDARD_TIERS: ReadonlySet<string> = new Set(['auto', 'default']);

/** The configured price of one call of `tool`, or undefined. */
export function toolCallMicros(model: ModelConfig, tool: BuiltInTool): number | undefined {
  const t = model.toolCalls;
  if (!t) return undefined;
  switch (tool) {
    case 'web_search':
      return t.webSearchMicros;
    case 'file_search':
      return t.fileSearchMicros;
    case 'code_interpreter':
      return t.codeInterpreterMicros;
    case 'image_generation':
      return t.imageGenerationMicros;
  }
}

/**
 * The built-in tool a request's `tools` entry names, by its `type` (the dated variants of web search
 * included), or null for any other tool (functions, MCP, custom tools: priced as tokens upstream).
 */
export function builtInToolOf(type: unknown): BuiltInTool | null {
  if (typeof type !== 'string') return null;
  if (type === 'web_search' || type.startsWith('web_search_')) return 'web_search';
  if (type === 'file_search' || type === 'code_interpreter' || type === 'image_generation') return type;
  return null;
}

/** The tier prices a request naming `tier` runs at: null for auto/default (standard), undefined when the model has none. */
export function namedTierPrices(model: ModelConfig, tier: string): ServiceTierPrices | null | undefined {
  if (STANDARD_TIERS.has(tier)) return null;
  if (tier === 'priority') return model.priority;
  if (tier === 'flex') return model.flex;
  return undefined;
}

/**
 * The token prices of a request of `model` that ran on the reported tier with `promptTokens` of input:
 * - tier: no tier, `default` or `auto` at the standard prices; priority and flex at theirs when
 *   configured; any other tier (or one not configured) at the highest of the configured, part by part;
 * - long context (input above the threshold): the input and output prices raised by the ratio of the
 *   long-context price to the standard one (a tier's and the cached price alike), rounded up to a whole
 *   micro-dollar per million tokens; with a standard price of 0, the long-context price itself.
 */
export function tokenPricesOf(model: ModelConfig, serviceTier: string | undefined, promptTokens: number): TokenPrices {
  const standard: TokenPrices = {
    inputMicrosPerMtok: model.inputMicrosPerMtok,
    outputMicrosPerMtok: model.outputMicrosPerMtok,
    cachedInputMicrosPerMtok: model.cachedInputMicrosPerMtok,
    cacheWriteMicrosPerMtok: model.cacheWriteMicrosPerMtok,
    inputAudioMicrosPerMtok: model.inputAudioMicrosPerMtok,
    outputAudioMicrosPerMtok: model.outputAudioMicrosPerMtok,
  };
  let p = standard;
  const tier = serviceTier ?? '';
  if (tier !== '' && !STANDARD_TIERS.has(tier)) {
    const own = tier === 'priority' ? model.priority : tier === 'flex' ? model.flex : undefined;
    p = own ? withTier(standard, own) : highest(model, standard);
  }
  const lc = model.longContext;
  if (lc && lc.aboveInputTokens > 0 && promptTokens > lc.aboveInputTokens) {
    const raise = (price: number, long: number, std: number) => (std > 0 ? ceilDiv(price, long, std) : long);
    const cached = p.cachedInputMicrosPerMtok ?? p.inputMicrosPerMtok;
    p = {
      ...p,
      inputMicrosPerMtok: raise(p.inputMicrosPerMtok, lc.inputMicrosPerMtok, model.inputMicrosPerMtok),
      outputMicrosPerMtok: raise(p.outputMicrosPerMtok, lc.outputMicrosPerMtok, model.outputMicrosPerMtok),
      cachedInputMicrosPerMtok: raise(cached, lc.inputMicrosPerMtok, model.inputMicrosPerMtok),
    };
  }
  return p;
}

/** The standard prices with a tier's token prices (its cached price, else its input price). */
function withTier(standard: TokenPrices, t: ServiceTierPrices): TokenPrices {
  return {
    ...standard,
    inputMicrosPerMtok: t.inputMicrosPerMtok,
    outputMicrosPerMtok: t.outputMicrosPerMtok,
    cachedInputMicrosPerMtok: t.cachedInputMicrosPerMtok ?? t.inputMicrosPerMtok,
  };
}

/** The highest of the standard and every configured tier's prices, part by part. */
function highest(model: ModelConfig, standard: TokenPrices): TokenPrices {
  let p = standard;
  for (const t of [model.priority, model.flex]) {
    if (!t) continue;
    const w = withTier(standard, t);
    p = {
      ...p,
      inputMicrosPerMtok: Math.max(p.inputMicrosPerMtok, w.inputMicrosPerMtok),
      outputMicrosPerMtok: Math.max(p.outputMicrosPerMtok, w.outputMicrosPerMtok),
      cachedInputMicrosPerMtok: Math.max(p.cachedInputMicrosPerMtok ?? p.inputMicrosPerMtok, w.cachedInputMicrosPerMtok ?? w.inputMicrosPerMtok),
    };
  }
  return p;
}

/** The tool calls' price: each call at its tool's price (a tool without one costs 0 here; admission refuses naming it). */
export function toolCallsCostMicros(model: ModelConfig, calls: ToolCallCounts | undefined): number {
  if (!calls) return 0;
  let sum = 0;
  for (const [tool, n] of Object.entries(calls) as Array<[BuiltInTool, number]>) sum += (n ?? 0) * (toolCallMicros(model, tool) ?? 0);
  return sum;
}

/** The cost of a finished request of a token-priced model: its tokens at the reported tier's (and long context's) prices, plus its tool calls. */
export function reportedCostMicros(model: ModelConfig, usage: TokenCounts & ReportedFacts): number {
  return usageCostMicros(usage, tokenPricesOf(model, usage.serviceTier, usage.promptTokens)) + toolCallsCostMicros(model, usage.toolCalls);
}

/** ⌈a × b / c⌉, exact for any integer prices. */
function ceilDiv(a: number, b: number, c: number): number {
  const d = BigInt(c);
  return Number((BigInt(a) * BigInt(b) + d - 1n) / d);
}

/**
 * The built-in tool calls an answer's `output` items report: one per `web_search_call`,
 * `file_search_call` and `image_generation_call` item; code interpreter per container session (its
 * items' distinct `container_id`, an item naming none counted as a session of its own).
 */
export function toolCallsOfOutput(output: readonly unknown[]): ToolCallCounts {
  const calls: ToolCallCounts = {};
  const containers = new Set<string>();
  for (const item of output) {
    if (item === null || typeof item !== 'object') continue;
    const { type, container_id: container } = item as Record<string, unknown>;
    const tool = typeof type === 'string' ? (TOOL_ITEM_TYPES as Record<string, BuiltInTool | undefined>)[type] : undefined;
    if (!tool) continue;
    if (tool === 'code_interpreter' && typeof container === 'string' && container !== '') {
      if (containers.has(container)) continue;
      containers.add(container);
    }
    calls[tool] = (calls[tool] ?? 0) + 1;
  }
  return calls;
}

/** Whether a count holds any call. */
export function hasToolCalls(c: ToolCallCounts | undefined): boolean {
  return !!c && Object.values(c).some((n) => (n ?? 0) > 0);
}

/** A tier or built-in tool a request names that the model has no price for: the parameter and why. */
export interface Unpriced {
  param: string;
  message: string;
}

/**
 * What a chat or Responses request names that its model has no price for: a `service_tier` other than
 * auto or default without configured prices, a built-in tool in `tools` (or a chat request's
 * `web_search_options`) without a price per call. Null when everything it names is priced.
 */
export function unpricedInRequest(model: ModelConfig, body: Record<string, unknown>): Unpriced | null {
  const tier = body.service_tier;
  if (tier !== undefined && tier !== null) {
    if (typeof tier !== 'string') return { param: 'service_tier', message: "Invalid type for 'service_tier': expected a string." };
    if (namedTierPrices(model, tier) === undefined) {
      return { param: 'service_tier', message: `The model \`${model.id}\` has no price for service_tier '${tier.slice(0, 32)}' on this gateway; use 'auto' or 'default'.` };
    }
  }
  if (Array.isArray(body.tools)) {
    for (let i = 0; i < body.tools.length; i++) {
      const t = body.tools[i];
      const tool = t !== null && typeof t === 'object' ? builtInToolOf((t as Record<string, unknown>).type) : null;
      if (tool && toolCallMicros(model, tool) === undefined) return { param: `tools[${i}].type`, message: `The model \`${model.id}\` has no price for the built-in tool '${tool}' on this gateway.` };
    }
  }
  if (body.web_search_options !== undefined && body.web_search_options !== null && toolCallMicros(model, 'web_search') === undefined) {
    return { param: 'web_search_options', message: `The model \`${model.id}\` has no price for the built-in tool 'web_search' on this gateway.` };
  }
  return null;
}

/**
 * The most a request's tier, length and tools may cost beyond its tokens, for the worst case reserved
 * before admission: the prices of the tier it names (auto, default or none: standard), raised for long
 * context when its input estimate passes the threshold, and every built-in tool it names called
 * `max_tool_calls` times (once when it names no max; code interpreter once per request).
 */
export function requestedPrices(model: ModelConfig, body: Record<string, unknown>, inputTokens: number): { prices: TokenPrices; toolMicros: number } {
  const prices = tokenPricesOf(model, requestedTier(body), inputTokens);
  return { prices, toolMicros: toolCallsCostMicros(model, requestedToolCalls(body)) };
}

/** The `service_tier` a request names, if a string. */
export function requestedTier(body: Record<string, unknown>): string | undefined {
  return typeof body.service_tier === 'string' ? body.service_tier : undefined;
}

/** The most built-in tool calls a request allows: each tool it names `max_tool_calls` times (once without it), code interpreter once. */
export function requestedToolCalls(body: Record<string, unknown>): ToolCallCounts {
  const maxCalls = typeof body.max_tool_calls === 'number' && Number.isSafeInteger(body.max_tool_calls) && body.max_tool_calls > 0 ? body.max_tool_calls : 1;
  const calls: ToolCallCounts = {};
  if (Array.isArray(body.tools)) {
    for (const t of body.tools) {
      const tool = t !== null && typeof t === 'object' ? builtInToolOf((t as Record<string, unknown>).type) : null;
      if (tool) calls[tool] = tool === 'code_interpreter' ? 1 : maxCalls;
    }
  }
  if (body.web_search_options !== undefined && body.web_search_options !== null) calls.web_search = maxCalls;
  return calls;
}
