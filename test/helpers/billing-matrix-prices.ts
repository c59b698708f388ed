// The billing matrix's rows for prices by what the upstream reports (issue 34, deliverable 4;
// docs/billing.md#prices-by-what-the-upstream-reports): the service tier an answer reports (priority,
// flex, or default when priority was asked), a prompt above the long-context threshold, and each
// built-in tool call its output lists, against the priced fake (fake-priced-upstream.ts) serving model
// `up-priced`. Each row is one request ended normally; how each other ending bills an answer's usage
// is its endpoint's own row (chat JSON, chat SSE, …), so those cells are listed as not applicable.
import assert from 'node:assert/strict';
import type { PricedAnswer } from './fake-priced-upstream.js';
import type { BillingMatrix } from './billing-matrix.js';
import type { GatewayYaml } from './config.js';

/** up-priced's prices in micro-dollars per token (the config's USD per million tokens read as such). */
export const PRICED = {
  standard: { input: 1000, output: 2000, cached: 100 },
  priority: { input: 2000, output: 4000, cached: 200 },
  flex: { input: 500, output: 1000, cached: 50 },
  long: { above: 60, input: 3000, output: 5000 },
  /** Per call (per container for code_interpreter), micro-dollars. */
  tools: { web_search: 10_000, file_search: 2_500, code_interpreter: 30_000, image_generation: 40_000 },
};

/** The model's entry in the matrix's config (and the vector store its file_search row names). */
export function pricedModel(baseUrl: string): GatewayYaml {
  const usd = (microsPerToken: number) => String(microsPerToken);
  const tier = (p: { input: number; output: number; cached: number }) => ({ input_usd_per_mtok: usd(p.input), output_usd_per_mtok: usd(p.output), cached_input_usd_per_mtok: usd(p.cached) });
  const { standard, long, tools } = PRICED;
  return {
    id: 'up-priced',
    provider: 'openai',
    kind: 'chat',
    base_url: baseUrl,
    api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY',
    timeout_ms: 10_000,
    ...tier(standard),
    service_tiers: { priority: tier(PRICED.priority), flex: tier(PRICED.flex) },
    long_context: { above_input_tokens: long.above, input_usd_per_mtok: usd(long.input), output_usd_per_mtok: usd(long.output) },
    tool_calls_usd: Object.fromEntries(Object.entries(tools).map(([k, v]) => [k, (v / 1e6).toFixed(4)])),
  };
}

/** What every row's answer reports, unless the row says otherwise: 50 tokens in (10 cached), 20 out. */
const ANSWER: PricedAnswer = { inputTokens: 50, cachedTokens: 10, outputTokens: 20 };
/** Above the threshold (60): 100 in, none cached. */
const LONG_ANSWER: PricedAnswer = { inputTokens: 100, cachedTokens: 0, outputTokens: 20 };

function tokens(a: PricedAnswer, p: { input: number; output: number; cached: number }): number {
  const cached = a.cachedTokens ?? 0;
  return (a.inputTokens - cached) * p.input + cached * p.cached + a.outputTokens * p.output;
}

const item = (type: string, id: string, extra: Record<string, unknown> = {}) => ({ type, id, status: 'completed', ...extra });
const WEB = item('web_search_call', 'ws_1', { action: { type: 'search', query: 'otters' } });
const FILE = item('file_search_call', 'fs_1', { queries: ['otters'], results: null });
const CODE = (id: string, container: string) => item('code_interpreter_call', id, { container_id: container, code: 'print(1)', outputs: null });
const IMAGE = item('image_generation_call', 'ig_1', { result: 'iVBORw0KGgo=' });
const TOOL = {
  web_search: { type: 'web_search' },
  file_search: { type: 'file_search', vector_store_ids: ['vs_matrix'] },
  code_interpreter: { type: 'code_interpreter', container: { type: 'auto' } },
  image_generation: { type: 'image_generation' },
};

interface PricedRow {
  name: string;
  path: '/v1/chat/completions' | '/v1/responses';
  body: Record<string, unknown>;
  answer: PricedAnswer;
  expected: number;
}

const chat = (extra: Record<string, unknown>) => ({ model: 'up-priced', messages: [{ role: 'user', content: 'Hi' }], ...extra });
const responses = (extra: Record<string, unknown>) => ({ model: 'up-priced', input: 'Hi', ...extra });
const { standard, priority, flex, long, tools } = PRICED;
const std = tokens(ANSWER, standard);

const ROWS: PricedRow[] = [
  { name: 'responses JSON, priority reported', path: '/v1/responses', body: responses({ service_tier: 'priority' }), answer: { ...ANSWER, serviceTier: 'priority' }, expected: tokens(ANSWER, priority) },
  { name: 'responses SSE, priority reported', path: '/v1/responses', body: responses({ service_tier: 'priority', stream: true }), answer: { ...ANSWER, serviceTier: 'priority' }, expected: tokens(ANSWER, priority) },
  { name: 'responses JSON, flex reported', path: '/v1/responses', body: responses({ service_tier: 'flex' }), answer: { ...ANSWER, serviceTier: 'flex' }, expected: tokens(ANSWER, flex) },
  { name: 'responses SSE, flex reported', path: '/v1/responses', body: responses({ service_tier: 'flex', stream: true }), answer: { ...ANSWER, serviceTier: 'flex' }, expected: tokens(ANSWER, flex) },
  // Billed as reported, not as asked.
  { name: 'responses JSON, priority asked and default reported', path: '/v1/responses', body: responses({ service_tier: 'priority' }), answer: { ...ANSWER, serviceTier: 'default' }, expected: std },
  { name: 'chat JSON, priority reported', path: '/v1/chat/completions', body: chat({ service_tier: 'priority' }), answer: { ...ANSWER, serviceTier: 'priority' }, expected: tokens(ANSWER, priority) },
  { name: 'chat SSE with include_usage, flex reported', path: '/v1/chat/completions', body: chat({ service_tier: 'flex', stream: true, stream_options: { include_usage: true } }), answer: { ...ANSWER, serviceTier: 'flex' }, expected: tokens(ANSWER, flex) },
  // The whole request at the long-context prices once its input passes the threshold.
  { name: 'responses JSON, a prompt above the long-context threshold', path: '/v1/responses', body: responses({}), answer: LONG_ANSWER, expected: tokens(LONG_ANSWER, { input: long.input, output: long.output, cached: 0 }) },
  { name: 'chat JSON, a prompt above the long-context threshold', path: '/v1/chat/completions', body: chat({}), answer: LONG_ANSWER, expected: tokens(LONG_ANSWER, { input: long.input, output: long.output, cached: 0 }) },
  { name: 'responses JSON, one web_search call', path: '/v1/responses', body: responses({ tools: [TOOL.web_search] }), answer: { ...ANSWER, items: [WEB] }, expected: std + tools.web_search },
  { name: 'responses JSON, one file_search call', path: '/v1/responses', body: responses({ tools: [TOOL.file_search] }), answer: { ...ANSWER, items: [FILE] }, expected: std + tools.file_search },
  // Per container session: two calls in one container are one.
  { name: 'responses JSON, two code_interpreter calls in one container', path: '/v1/responses', body: responses({ tools: [TOOL.code_interpreter] }), answer: { ...ANSWER, items: [CODE('ci_1', 'cntr_1'), CODE('ci_2', 'cntr_1')] }, expected: std + tools.code_interpreter },
  { name: 'responses JSON, one image_generation call', path: '/v1/responses', body: responses({ tools: [TOOL.image_generation] }), answer: { ...ANSWER, items: [IMAGE] }, expected: std + tools.image_generation },
  {
    name: 'responses SSE, every built-in tool call',
    path: '/v1/responses',
    body: responses({ stream: true, tools: Object.values(TOOL) }),
    answer: { ...ANSWER, items: [WEB, FILE, CODE('ci_1', 'cntr_1'), CODE('ci_2', 'cntr_2'), IMAGE] },
    expected: std + tools.web_search + tools.file_search + 2 * tools.code_interpreter + tools.image_generation,
  },
];

/** Registers the rows' cells on the matrix. */
export function addReportedPriceRows(matrix: BillingMatrix): void {
  for (const row of ROWS) {
    matrix.cell(`${row.name} × normal`, row.expected, async () => {
      const k = await matrix.newKey();
      matrix.priced.answer = row.answer;
      const res = await fetch(`${matrix.node.url}${row.path}`, { method: 'POST', headers: { authorization: `Bearer ${k.key}`, 'content-type': 'application/json' }, body: JSON.stringify(row.body) });
      const text = await res.text();
      assert.equal(res.status, 200, text);
      return k.keyId;
    });
    matrix.cell(`${row.name} × every other ending`, { na: "a reported tier, threshold or tool call prices the usage an answer reports; how each ending bills that usage is its endpoint's own row" }, async () => '');
  }
}
