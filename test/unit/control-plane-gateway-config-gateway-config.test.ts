import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { readGatewayConfig } from '../../control-plane/config.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { DEMO_CONFIG_PATH, parseGatewayConfig } from '../../control-plane/gateway-config/gateway-config.js';

const demo = () => parse(readFileSync(DEMO_CONFIG_PATH, 'utf8'));

test('the shipped demo config has the spec tiers exactly', () => {
  const { settings, proto } = readGatewayConfig(DEMO_CONFIG_PATH);
  const free = settings.tiers.get('free')!;
  const paid = settings.tiers.get('paid')!;
  assert.deepEqual(
    [free.rpm, free.tpm, free.maxParallelRequests, free.monthlyCapMicros, free.freeGrantMicros],
    [20, 60_000, 100, 5_000_000, 5_000_000],
  );
  assert.deepEqual([paid.rpm, paid.tpm, paid.maxParallelRequests, paid.monthlyCapMicros, paid.freeGrantMicros], [300, 1_000_000, 100, null, 0]);
  assert.equal(settings.defaultTier, 'free');
  assert.equal(settings.serviceName, 'tollgate');
  assert.equal(proto.tiers.find((t) => t.name === 'paid')?.monthlyCapMicros, undefined);
  assert.equal(proto.models.find((m) => m.id === 'demo-chat')?.inputMicrosPerMtok, 500_000);
  assert.equal(proto.models.find((m) => m.id === 'demo-chat')?.outputMicrosPerMtok, 1_500_000);
});

test('bad gateway configs are refused with one line naming the setting', () => {
  const cases: [string, (d: any) => void, RegExp][] = [
    ['plan names an unknown model', (d) => d.tiers.free.models.push('nope'), /tier free\.models: names unknown model "nope"/],
    ['bad price', (d) => (d.models[0].input_usd_per_mtok = 'cheap'), /model demo-chat\.input_usd_per_mtok: must be a non-negative USD amount/],
    ['negative price', (d) => (d.models[0].output_usd_per_mtok = '-1'), /output_usd_per_mtok/],
    ['bad cap', (d) => (d.tiers.free.monthly_cap_usd = '5.0000001'), /tier free\.monthly_cap_usd/],
    ['default tier missing', (d) => (d.default_tier = 'gold'), /default_tier: names unknown tier "gold"/],
    ['zero rpm', (d) => (d.tiers.paid.rpm = 0), /tier paid\.rpm: must be a whole number >= 1/],
    ['unknown setting', (d) => (d.tiers.free.rmp = 3), /tier free: unknown setting "rmp"/],
    ['unknown provider', (d) => (d.models[0].provider = 'magic'), /provider: must be "demo" or "openai"/],
    ['duplicate model', (d) => d.models.push({ ...d.models[0] }), /model demo-chat: is defined twice/],
    ['openai without base_url', (d) => d.models.push({ id: 'x', provider: 'openai', kind: 'chat' }), /model x\.base_url: is required/],
    ['missing api key env', (d) => d.models.push({ id: 'x', provider: 'openai', base_url: 'http://127.0.0.1:1', api_key_env: 'TOLLGATE_TEST_UNSET_VAR' }), /TOLLGATE_TEST_UNSET_VAR is not set/],
    ['no tiers', (d) => (d.tiers = {}), /^tiers: /],
    ['bad service name', (d) => (d.service_name = 'a b'), /^service_name: /],
    ['bad tool prefix', (d) => (d.tool_backends = [{ prefix: '/pdf', base_url: 'http://127.0.0.1:9' }]), /tool_backends\[0\]\.prefix/],
    // Before: any string was accepted, and an entry that could never match trusted nothing, silently.
    ['trusted proxy not an address', (d) => (d.trusted_proxies = ['10.0.0.0/8', 'proxy.internal']), /^trusted_proxies\[1\]: "proxy\.internal": not an IP address/],
    ['trusted proxy prefix too long', (d) => (d.trusted_proxies = ['10.0.0.0/33']), /^trusted_proxies\[0\]: "10\.0\.0\.0\/33": .*prefix length/],
    ['trusted proxy host bits', (d) => (d.trusted_proxies = ['fd00::1/8']), /^trusted_proxies\[0\]: "fd00::1\/8": .*host bits.*fd00::\/8/],
    ['trusted proxies not a list', (d) => (d.trusted_proxies = '10.0.0.0/8'), /^trusted_proxies: must be a list/],
    // A model's output ceiling prices a request that names no max (docs/money-limits.md#the-last-request).
    ['zero output ceiling', (d) => (d.models[0].max_output_tokens = 0), /^model demo-chat\.max_output_tokens: must be a whole number >= 1, got 0/],
    ['fractional output ceiling', (d) => (d.models[0].max_output_tokens = 1.5), /^model demo-chat\.max_output_tokens: must be a whole number >= 1/],
    ['output ceiling as text', (d) => (d.models[0].max_output_tokens = '4096'), /^model demo-chat\.max_output_tokens: must be a whole number >= 1, got "4096"/],
  ];
  for (const [name, mutate, want] of cases) {
    const d = demo();
    mutate(d);
    assert.throws(() => parseGatewayConfig(d, {}), (err: Error) => {
      assert.ok(err instanceof ConfigError, name);
      assert.match(err.message, want, name);
      assert.ok(!err.message.includes('\n'), `${name}: one line`);
      return true;
    });
  }
});

test('a model\'s max_output_tokens reaches the nodes\' ModelConfig; absent, none is configured', () => {
  const d = demo();
  d.models[0].max_output_tokens = 4096;
  const { settings, proto } = parseGatewayConfig(d, {});
  assert.equal(settings.models.get('demo-chat')?.maxOutputTokens, 4096);
  assert.equal(proto.models.find((m) => m.id === 'demo-chat')?.maxOutputTokens, 4096);
  assert.equal(proto.models.find((m) => m.id === 'demo-chat-pro')?.maxOutputTokens, undefined);
});

test('api_key_env resolves to upstream_api_key from the environment', () => {
  const d = demo();
  d.models.push({ id: 'gpt', provider: 'openai', base_url: 'http://127.0.0.1:1/v1/', api_key_env: 'UP_KEY', upstream_model: 'gpt-x' });
  const { proto, settings } = parseGatewayConfig(d, { UP_KEY: 'secret-value' });
  const m = proto.models.find((x) => x.id === 'gpt')!;
  assert.equal(m.upstreamApiKey, 'secret-value');
  assert.equal(m.baseUrl, 'http://127.0.0.1:1/v1');
  assert.equal(m.upstreamModel, 'gpt-x');
  assert.equal(settings.models.get('gpt')?.apiKeyEnv, 'UP_KEY');
});

test('trusted_proxies takes addresses and CIDR ranges, IPv4 and IPv6', () => {
  const d = demo();
  d.trusted_proxies = ['10.0.0.0/8', ' 192.168.1.1 ', 'fd00::/8', '::ffff:172.16.0.0/108', '2001:db8::1'];
  const { proto, settings } = parseGatewayConfig(d, {});
  assert.deepEqual(proto.trustedProxies, ['10.0.0.0/8', '192.168.1.1', 'fd00::/8', '::ffff:172.16.0.0/108', '2001:db8::1']);
  assert.deepEqual(settings.trustedProxies, proto.trustedProxies);
});

test('api_key_file: read through the reader, never both with api_key_env, an unreadable or empty file named', () => {
  const withModel = (extra: Record<string, unknown>) => {
    const doc = demo();
    doc.models.push({ id: 'up', provider: 'openai', kind: 'chat', base_url: 'https://upstream.example/v1', ...extra });
    return doc;
  };
  const read = (path: string) => {
    if (path === 'key.txt') return 'sk-from-file';
    if (path === 'empty.txt') return '';
    throw new Error(`cannot read /etc/tollgate/${path} (ENOENT)`);
  };
  const ok = parseGatewayConfig(withModel({ api_key_file: 'key.txt' }), {}, read);
  assert.equal(ok.proto.models.find((m) => m.id === 'up')?.upstreamApiKey, 'sk-from-file');
  assert.throws(() => parseGatewayConfig(withModel({ api_key_file: 'key.txt', api_key_env: 'X' }), { X: 'y' }, read), /model up: give api_key_env or api_key_file, not both/);
  assert.throws(() => parseGatewayConfig(withModel({ api_key_file: 'gone.txt' }), {}, read), /model up\.api_key_file: cannot read \/etc\/tollgate\/gone\.txt \(ENOENT\)/);
  assert.throws(() => parseGatewayConfig(withModel({ api_key_file: 'empty.txt' }), {}, read), /model up\.api_key_file: empty\.txt is empty/);
});

test('tool_backends: several base URLs with per-backend timeouts, and the older one-URL form still valid', () => {
  const d = demo();
  d.tool_backends = [
    { prefix: '/v1/files/', base_urls: ['http://10.0.0.1:8000/', 'https://files.internal/api'], connect_timeout_ms: 500, header_timeout_ms: 20_000, idle_timeout_ms: 90_000 },
    { prefix: '/v1/pdf', base_url: 'http://127.0.0.1:9', timeout_ms: 30_000 },
    { prefix: '/v1/mcp', base_url: 'http://127.0.0.1:10' },
  ];
  const { proto } = parseGatewayConfig(d, {});
  assert.deepEqual(proto.toolBackends, [
    { prefix: '/v1/files', baseUrl: 'http://10.0.0.1:8000', baseUrls: ['http://10.0.0.1:8000', 'https://files.internal/api'], timeoutMs: 60_000, connectTimeoutMs: 500, headerTimeoutMs: 20_000, idleTimeoutMs: 90_000 },
    // timeout_ms is the default of the header and idle timeouts; connect defaults to at most 5 s.
    { prefix: '/v1/pdf', baseUrl: 'http://127.0.0.1:9', baseUrls: ['http://127.0.0.1:9'], timeoutMs: 30_000, connectTimeoutMs: 5_000, headerTimeoutMs: 30_000, idleTimeoutMs: 30_000 },
    { prefix: '/v1/mcp', baseUrl: 'http://127.0.0.1:10', baseUrls: ['http://127.0.0.1:10'], timeoutMs: 60_000, connectTimeoutMs: 5_000, headerTimeoutMs: 60_000, idleTimeoutMs: 60_000 },
  ]);
});

test('bad tool_backends are refused with one line naming the setting', () => {
  const cases: [string, unknown, RegExp][] = [
    ['both forms', [{ prefix: '/v1/pdf', base_url: 'http://a', base_urls: ['http://b'] }], /tool_backends\[0\]: has both base_url and base_urls/],
    ['empty list', [{ prefix: '/v1/pdf', base_urls: [] }], /tool_backends\[0\]\.base_urls: must be a non-empty list/],
    ['not http', [{ prefix: '/v1/pdf', base_urls: ['ws://a'] }], /tool_backends\[0\]\.base_urls\[0\]: must be an http\(s\) URL/],
    ['credentials in the URL', [{ prefix: '/v1/pdf', base_urls: ['http://user:pw@a'] }], /must not carry credentials/],
    ['same URL twice', [{ prefix: '/v1/pdf', base_urls: ['http://a', 'http://a/'] }], /lists the same URL twice/],
    ['prefix twice', [{ prefix: '/v1/pdf', base_url: 'http://a' }, { prefix: '/v1/pdf/', base_url: 'http://b' }], /tool_backends\[1\]\.prefix: \/v1\/pdf is configured twice/],
    ['bad timeout', [{ prefix: '/v1/pdf', base_url: 'http://a', idle_timeout_ms: 0 }], /tool_backends\[0\]\.idle_timeout_ms: must be a whole number >= 1/],
    ['unknown key', [{ prefix: '/v1/pdf', base_url: 'http://a', retries: 3 }], /tool_backends\[0\]: unknown setting "retries"/],
  ];
  for (const [name, list, re] of cases) {
    const d = demo();
    d.tool_backends = list;
    assert.throws(() => parseGatewayConfig(d, {}), (e: unknown) => e instanceof ConfigError && re.test(e.message), name);
  }
});

test('max_orgs_per_account: 3 unless set, a whole number >= 0', () => {
  assert.equal(parseGatewayConfig(demo(), {}).settings.maxOrgsPerAccount, 3);
  assert.equal(parseGatewayConfig({ ...demo(), max_orgs_per_account: 0 }, {}).settings.maxOrgsPerAccount, 0);
  assert.throws(() => parseGatewayConfig({ ...demo(), max_orgs_per_account: -1 }, {}), /^ConfigError: max_orgs_per_account: must be a whole number >= 0/);
  assert.throws(() => parseGatewayConfig({ ...demo(), max_orgs_per_account: 'many' }, {}), /max_orgs_per_account: must be a whole number >= 0, got "many"/);
});

test("a model's service_tiers, long_context, tool_calls_usd and safety_identifier reach the nodes' ModelConfig", () => {
  const d = demo();
  d.models.push({
    id: 'x',
    provider: 'openai',
    base_url: 'http://127.0.0.1:1/v1',
    service_tiers: { priority: { input_usd_per_mtok: '2.50', output_usd_per_mtok: '20', cached_input_usd_per_mtok: '0.25' }, flex: { input_usd_per_mtok: '0.625', output_usd_per_mtok: '5' } },
    long_context: { above_input_tokens: 272000, input_usd_per_mtok: '2.5', output_usd_per_mtok: '15' },
    tool_calls_usd: { web_search: '0.01', code_interpreter: '0.03' },
    safety_identifier: 'organisation',
  });
  const { proto } = parseGatewayConfig(d);
  const x = proto.models.find((m) => m.id === 'x')!;
  assert.deepEqual(x.priority, { inputMicrosPerMtok: 2_500_000, outputMicrosPerMtok: 20_000_000, cachedInputMicrosPerMtok: 250_000 });
  assert.deepEqual(x.flex, { inputMicrosPerMtok: 625_000, outputMicrosPerMtok: 5_000_000, cachedInputMicrosPerMtok: undefined });
  assert.deepEqual(x.longContext, { aboveInputTokens: 272_000, inputMicrosPerMtok: 2_500_000, outputMicrosPerMtok: 15_000_000 });
  assert.deepEqual(x.toolCalls, { webSearchMicros: 10_000, fileSearchMicros: undefined, codeInterpreterMicros: 30_000, imageGenerationMicros: undefined });
  assert.equal(x.safetyIdentifier, 'organisation');
  // Defaults: the project's identifier for openai, none for demo; no tier, long-context or tool prices.
  d.models.push({ id: 'y', provider: 'openai', base_url: 'http://127.0.0.1:1/v1' });
  const y = parseGatewayConfig(d).proto.models.find((m) => m.id === 'y')!;
  assert.equal(y.safetyIdentifier, 'project');
  assert.deepEqual([y.priority, y.flex, y.longContext, y.toolCalls], [undefined, undefined, undefined, undefined]);
  assert.equal(parseGatewayConfig(demo()).proto.models.find((m) => m.id === 'demo-chat')!.safetyIdentifier, 'off');
});

test('bad tier, long-context, tool prices and safety_identifier are refused with one line naming the setting', () => {
  const cases: [string, Record<string, unknown>, RegExp][] = [
    ['unknown tier', { service_tiers: { scale: { input_usd_per_mtok: '1', output_usd_per_mtok: '1' } } }, /model demo-chat\.service_tiers\.scale: unknown setting/],
    ['tier price missing', { service_tiers: { priority: { input_usd_per_mtok: '1' } } }, /model demo-chat\.service_tiers\.priority\.output_usd_per_mtok: must be a non-negative USD amount/],
    ['tier not a mapping', { service_tiers: { flex: 2 } }, /model demo-chat\.service_tiers\.flex: must be a mapping/],
    ['threshold not whole', { long_context: { above_input_tokens: 1.5, input_usd_per_mtok: '1', output_usd_per_mtok: '1' } }, /model demo-chat\.long_context\.above_input_tokens: must be a whole number/],
    ['unknown tool', { tool_calls_usd: { computer_use: '0.01' } }, /model demo-chat\.tool_calls_usd\.computer_use: unknown setting/],
    ['negative tool price', { tool_calls_usd: { web_search: '-0.01' } }, /model demo-chat\.tool_calls_usd\.web_search: must be a non-negative USD amount/],
    ['unknown subject', { safety_identifier: 'account' }, /model demo-chat\.safety_identifier: must be one of project, key, organisation, off/],
  ];
  for (const [name, extra, message] of cases) {
    const d = demo();
    Object.assign(d.models[0], extra);
    assert.throws(() => parseGatewayConfig(d), (e: unknown) => e instanceof ConfigError && message.test(e.message) && !e.message.includes('\n'), name);
  }
});
