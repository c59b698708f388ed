// Prices by what the upstream reports (issue 34, deliverable 4; docs/billing.md#prices-by-what-the-upstream-reports).
// Before, a request was priced at the model's plain token prices whatever tier its answer reported,
// however long its prompt and whatever built-in tools it called. Tables over the pure pricing, the
// refusal of what has no price, and the worst case reserved before admission.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { reportedCostMicros, toolCallsOfOutput, unpricedInRequest } from '../../proto/lib/reported-prices.js';
import { requestWorstCase } from '../../data-plane/limits/worst-case.js';

function model(m: Partial<ModelConfig> = {}): ModelConfig {
  return {
    id: 'm',
    provider: 'openai',
    upstreamModel: 'm',
    baseUrl: '',
    upstreamApiKey: '',
    kind: 'chat',
    inputMicrosPerMtok: 1_000_000,
    outputMicrosPerMtok: 4_000_000,
    cachedInputMicrosPerMtok: 100_000,
    audioMicrosPerUnit: 0,
    timeoutMs: 0,
    voices: [],
    deployments: [],
    maxAttempts: 0,
    failoverTimeoutMs: 0,
    circuitFailures: 0,
    circuitCooldownMs: 0,
    priority: { inputMicrosPerMtok: 2_000_000, outputMicrosPerMtok: 8_000_000, cachedInputMicrosPerMtok: 200_000 },
    flex: { inputMicrosPerMtok: 500_000, outputMicrosPerMtok: 2_000_000 },
    longContext: { aboveInputTokens: 1000, inputMicrosPerMtok: 2_000_000, outputMicrosPerMtok: 6_000_000 },
    toolCalls: { webSearchMicros: 10_000, codeInterpreterMicros: 30_000 },
    ...m,
  };
}

test('a usage priced by the tier its answer reports, a long prompt and its tool calls', () => {
  const u = { promptTokens: 500, cachedPromptTokens: 100, completionTokens: 200 };
  const table: Array<[string, ModelConfig, Parameters<typeof reportedCostMicros>[1], number]> = [
    ['no tier: standard', model(), u, 400 + 10 + 800],
    ['default: standard', model(), { ...u, serviceTier: 'default' }, 1210],
    ['auto: standard', model(), { ...u, serviceTier: 'auto' }, 1210],
    ['priority', model(), { ...u, serviceTier: 'priority' }, 800 + 20 + 1600],
    // Flex without a cached price: its input price for cached tokens.
    ['flex', model(), { ...u, serviceTier: 'flex' }, 200 + 50 + 400],
    // Part by part: priority's input and output, flex's cached (its input price: it names no cached price).
    ['scale: the highest configured, part by part', model(), { ...u, serviceTier: 'scale' }, 800 + 50 + 1600],
    ['priority not configured: the highest configured', model({ priority: undefined }), { ...u, serviceTier: 'priority' }, 400 + 50 + 800],
    ['scale, every tier with a cached price', model({ flex: { inputMicrosPerMtok: 500_000, outputMicrosPerMtok: 2_000_000, cachedInputMicrosPerMtok: 50_000 } }), { ...u, serviceTier: 'scale' }, 2420],
    ['long context: whole request at the long prices', model(), { promptTokens: 2000, completionTokens: 200 }, 4000 + 1200],
    ['at the threshold: standard', model(), { promptTokens: 1000, completionTokens: 200 }, 1000 + 800],
    ['long context on priority: raised by the ratio', model(), { promptTokens: 2000, completionTokens: 200, serviceTier: 'priority' }, 8000 + 2400],
    ['long context, cached at the raised cached price', model(), { promptTokens: 2000, cachedPromptTokens: 1000, completionTokens: 0 }, 2000 + 200],
    ['long context over a free standard price: the long price itself', model({ inputMicrosPerMtok: 0, cachedInputMicrosPerMtok: undefined }), { promptTokens: 2000, completionTokens: 0 }, 4000],
    ['raised prices rounded up per Mtok', model({ inputMicrosPerMtok: 3, cachedInputMicrosPerMtok: undefined, longContext: { aboveInputTokens: 1, inputMicrosPerMtok: 4, outputMicrosPerMtok: 4_000_000 } }), { promptTokens: 1_000_000, completionTokens: 0, serviceTier: 'priority' }, Math.ceil((2_000_000 * 4) / 3)],
    ['tool calls at their prices', model(), { promptTokens: 0, completionTokens: 0, toolCalls: { web_search: 2, code_interpreter: 1 } }, 50_000],
    ['a tool without a price costs nothing here (admission refuses it)', model(), { promptTokens: 0, completionTokens: 0, toolCalls: { image_generation: 3 } }, 0],
  ];
  for (const [name, m, usage, want] of table) assert.equal(reportedCostMicros(m, usage), want, name);
});

test('tool calls of an output: one per item, code interpreter per container', () => {
  const out = toolCallsOfOutput([
    { type: 'web_search_call' },
    { type: 'message', content: [{ type: 'output_text', text: '"type":"web_search_call"' }] },
    { type: 'code_interpreter_call', container_id: 'c1' },
    { type: 'code_interpreter_call', container_id: 'c1' },
    { type: 'code_interpreter_call' },
    { type: 'image_generation_call' },
    { type: 'file_search_call' },
    { type: 'function_call' },
    null,
  ]);
  assert.deepEqual(out, { web_search: 1, code_interpreter: 2, image_generation: 1, file_search: 1 });
});

test('what a request names without a price is refused, naming the parameter', () => {
  const plain = model({ priority: undefined, flex: undefined, toolCalls: undefined });
  const table: Array<[string, ModelConfig, Record<string, unknown>, string | null]> = [
    ['auto needs no price', plain, { service_tier: 'auto' }, null],
    ['default needs no price', plain, { service_tier: 'default' }, null],
    ['priority without prices', plain, { service_tier: 'priority' }, 'service_tier'],
    ['flex without prices', plain, { service_tier: 'flex' }, 'service_tier'],
    ['scale is never priced', model(), { service_tier: 'scale' }, 'service_tier'],
    ['not a string', model(), { service_tier: 1 }, 'service_tier'],
    ['priority priced', model(), { service_tier: 'priority' }, null],
    ['a function tool is tokens', plain, { tools: [{ type: 'function', name: 'f' }] }, null],
    ['a dated web search without a price', plain, { tools: [{ type: 'function' }, { type: 'web_search_preview_2025_03_11' }] }, 'tools[1].type'],
    ['web search priced', model(), { tools: [{ type: 'web_search' }] }, null],
    ['image generation not priced on this model', model(), { tools: [{ type: 'image_generation' }] }, 'tools[0].type'],
    ['chat web_search_options without a price', plain, { web_search_options: {} }, 'web_search_options'],
  ];
  for (const [name, m, body, param] of table) assert.equal(unpricedInRequest(m, body)?.param ?? null, param, name);
});

test('the worst case counts the named tier, a long input and the named tools', () => {
  const m = model();
  const w = (body: Record<string, unknown>, input = 100) => requestWorstCase(m, 'responses', { max_output_tokens: 1000, ...body }, input).micros;
  assert.equal(w({}), 100 + 4000);
  assert.equal(w({ service_tier: 'auto' }), 100 + 4000);
  assert.equal(w({ service_tier: 'priority' }), 200 + 8000);
  assert.equal(w({ service_tier: 'flex' }), 50 + 2000);
  assert.equal(w({}, 2000), 4000 + 6000, 'an input estimate past the threshold');
  assert.equal(w({ tools: [{ type: 'web_search' }, { type: 'code_interpreter' }] }), 4100 + 10_000 + 30_000);
  assert.equal(w({ tools: [{ type: 'web_search' }, { type: 'code_interpreter' }], max_tool_calls: 3 }), 4100 + 30_000 + 30_000, 'each search up to max_tool_calls; one container');
});
