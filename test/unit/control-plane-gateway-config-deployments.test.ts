import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { DEMO_CONFIG_PATH, parseGatewayConfig, redactGatewayConfig } from '../../control-plane/gateway-config/gateway-config.js';

const demo = () => parse(readFileSync(DEMO_CONFIG_PATH, 'utf8'));
const ENV = { KEY_A: 'sk-a', KEY_B: 'sk-b' };

/** The demo config with one pooled model `pool` (in the paid tier) of the deployments given. */
function withPool(deployments: unknown, extra: Record<string, unknown> = {}): any {
  const d = demo();
  d.models.push({ id: 'pool', provider: 'openai', kind: 'chat', input_usd_per_mtok: '1.00', output_usd_per_mtok: '2.00', deployments, ...extra });
  d.tiers.paid.models.push('pool');
  return d;
}

const two = () => [
  { id: 'east', base_url: 'http://127.0.0.1:1/v1', api_key_env: 'KEY_A', upstream_model: 'gpt-east', weight: 3, rpm: 60, tpm: 100000, max_parallel_requests: 10 },
  { id: 'west', base_url: 'http://127.0.0.1:2/v1', api_key_file: 'west.key', input_usd_per_mtok: '1.50', provider: 'openai' },
];

test('a model of deployments reaches the nodes with each deployment, its key, weight, limits and price overrides', () => {
  const { settings, proto } = parseGatewayConfig(withPool(two(), { max_attempts: 2, failover_timeout_ms: 9000, circuit_failures: 3, circuit_cooldown_ms: 4000 }), ENV, (p) => (p === 'west.key' ? 'sk-west' : ''));
  const m = proto.models.find((x) => x.id === 'pool')!;
  assert.equal(m.deployments.length, 2);
  const [east, west] = m.deployments;
  assert.deepEqual(
    [east.id, east.baseUrl, east.upstreamApiKey, east.upstreamModel, east.weight, east.rpm, east.tpm, east.maxParallelRequests, east.provider, east.inputMicrosPerMtok],
    ['east', 'http://127.0.0.1:1/v1', 'sk-a', 'gpt-east', 3, 60, 100000, 10, undefined, undefined],
  );
  // Defaults: weight 1, no limits, the model's id upstream; the price overridden, the provider named.
  assert.deepEqual(
    [west.id, west.upstreamApiKey, west.upstreamModel, west.weight, west.rpm, west.tpm, west.maxParallelRequests, west.provider, west.inputMicrosPerMtok, west.outputMicrosPerMtok],
    ['west', 'sk-west', 'pool', 1, 0, 0, 0, 'openai', 1_500_000, undefined],
  );
  assert.deepEqual([m.maxAttempts, m.failoverTimeoutMs, m.circuitFailures, m.circuitCooldownMs], [2, 9000, 3, 4000]);
  // The model's own upstream fields are the first deployment's (nodes reading only them still work).
  assert.deepEqual([m.baseUrl, m.upstreamApiKey, m.upstreamModel], ['http://127.0.0.1:1/v1', 'sk-a', 'gpt-east']);
  assert.equal(settings.models.get('pool')!.pool!.deployments.length, 2);
  // Persisted configs carry no deployment's key.
  const red = redactGatewayConfig(proto).models.find((x) => x.id === 'pool')!;
  assert.deepEqual(red.deployments.map((x) => x.upstreamApiKey), ['', '']);
  assert.equal(red.upstreamApiKey, '');
});

test('a model with one base_url stays valid and lists no deployments (one implicit deployment)', () => {
  const d = demo();
  d.models.push({ id: 'single', provider: 'openai', kind: 'chat', base_url: 'http://127.0.0.1:3', api_key_env: 'KEY_A' });
  const m = parseGatewayConfig(d, ENV).proto.models.find((x) => x.id === 'single')!;
  assert.deepEqual([m.baseUrl, m.upstreamApiKey, m.deployments.length, m.maxAttempts], ['http://127.0.0.1:3', 'sk-a', 0, 0]);
});

test('bad deployments are refused with one line naming the model and the field', () => {
  const cases: [string, () => any, RegExp][] = [
    ['duplicate id', () => withPool([two()[0], { ...two()[0] }]), /^model pool\.deployments\[1\]\.id: "east" is listed twice/],
    ['zero weight', () => withPool([{ ...two()[0], weight: 0 }]), /^model pool\.deployments\[0\]\.weight: must be a positive number, got 0/],
    ['negative weight', () => withPool([{ ...two()[0], weight: -2 }]), /^model pool\.deployments\[0\]\.weight: must be a positive number/],
    ['weight as text', () => withPool([{ ...two()[0], weight: 'heavy' }]), /^model pool\.deployments\[0\]\.weight: must be a positive number, got "heavy"/],
    ['no base_url', () => withPool([{ id: 'a', api_key_env: 'KEY_A' }]), /^model pool\.deployments\[0\]\.base_url: must be a non-empty string/],
    ['no key', () => withPool([{ id: 'a', base_url: 'http://127.0.0.1:1' }]), /^model pool\.deployments\[0\]: needs api_key_env or api_key_file/],
    ['both keys', () => withPool([{ id: 'a', base_url: 'http://127.0.0.1:1', api_key_env: 'KEY_A', api_key_file: 'x' }]), /^model pool\.deployments\[0\]: give api_key_env or api_key_file, not both/],
    ['key env unset', () => withPool([{ id: 'a', base_url: 'http://127.0.0.1:1', api_key_env: 'TOLLGATE_TEST_UNSET' }]), /^model pool\.deployments\[0\]\.api_key_env: environment variable TOLLGATE_TEST_UNSET is not set/],
    ['fractional rpm', () => withPool([{ ...two()[0], rpm: 1.5 }]), /^model pool\.deployments\[0\]\.rpm: must be a whole number >= 1, got 1\.5/],
    ['zero tpm', () => withPool([{ ...two()[0], tpm: 0 }]), /^model pool\.deployments\[0\]\.tpm: must be a whole number >= 1, got 0/],
    ['parallel as text', () => withPool([{ ...two()[0], max_parallel_requests: '4' }]), /^model pool\.deployments\[0\]\.max_parallel_requests: must be a whole number >= 1/],
    ['no id', () => withPool([{ base_url: 'http://127.0.0.1:1', api_key_env: 'KEY_A' }]), /^model pool\.deployments\[0\]\.id: must be a non-empty string/],
    ['unknown field', () => withPool([{ ...two()[0], wieght: 2 }]), /^model pool\.deployments\[0\]: unknown setting "wieght"/],
    ['empty list', () => withPool([]), /^model pool\.deployments: must be a non-empty list/],
    ['with the model base_url', () => withPool([two()[0]], { base_url: 'http://127.0.0.1:9' }), /^model pool\.base_url: deployments replace the model's base_url/],
    ['with the model key', () => withPool([two()[0]], { api_key_env: 'KEY_A' }), /^model pool\.api_key_env: deployments replace the model's api_key_env/],
    ['with the model upstream_model', () => withPool([two()[0]], { upstream_model: 'x' }), /^model pool\.upstream_model: deployments replace the model's upstream_model/],
    ['bad provider', () => withPool([{ ...two()[0], provider: 'magic' }]), /^model pool\.deployments\[0\]\.provider: must be "openai"/],
    ['bad price', () => withPool([{ ...two()[0], output_usd_per_mtok: 'cheap' }]), /^model pool\.deployments\[0\]\.output_usd_per_mtok: must be a non-negative USD amount/],
    ['zero max_attempts', () => withPool(two(), { max_attempts: 0 }), /^model pool\.max_attempts: must be a whole number >= 1, got 0/],
    ['bad circuit_failures', () => withPool(two(), { circuit_failures: -1 }), /^model pool\.circuit_failures: must be a whole number >= 1/],
  ];
  for (const [name, build, want] of cases) {
    assert.throws(() => parseGatewayConfig(build(), ENV, () => 'sk-file'), (err: Error) => {
      assert.ok(err instanceof ConfigError, name);
      assert.match(err.message, want, name);
      assert.ok(!err.message.includes('\n'), `${name}: one line`);
      return true;
    }, name);
  }
});
