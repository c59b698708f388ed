import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { GatewayConfig, ModelConfig, ModelDeployment } from '../../proto/gen/tollgate/v1/sync.js';
import { checkSteer, steerKey, withSteer } from '../../control-plane/state/deployment-steer.js';
import { CpError } from '../../control-plane/errors.js';

const dep = (id: string): ModelDeployment => ({ id, baseUrl: 'http://u', upstreamApiKey: 'k', upstreamModel: 'm', weight: 1, rpm: 0, tpm: 0, maxParallelRequests: 0, state: '' });
const model = (id: string, deployments: ModelDeployment[]): ModelConfig => ({
  id, provider: 'openai', upstreamModel: id, baseUrl: 'http://u', upstreamApiKey: '', kind: 'chat', inputMicrosPerMtok: 0, outputMicrosPerMtok: 0,
  audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments, maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0,
});
const config = { serviceName: 't', tiers: [], models: [model('pool', [dep('a'), dep('b'), dep('c')]), model('solo', [])], toolBackends: [], realtimeUpstreams: [], trustedProxies: [], maxStalenessMs: 0 } as GatewayConfig;

test('checkSteer: unknown model or deployment, a bad state, and the last enabled deployment are refused, each naming what is wrong', () => {
  const states = new Map([[steerKey('pool', 'a'), 'drained'], [steerKey('pool', 'b'), 'disabled']]);
  const cases: [string, string, string, string | null][] = [
    ['pool', 'a', 'enabled', null],
    ['pool', 'b', 'drained', null],
    ['pool', 'c', 'drained', 'FAILED_PRECONDITION c is the last enabled deployment of model pool: enable another before you drain it'],
    ['pool', 'c', 'disabled', 'FAILED_PRECONDITION c is the last enabled deployment of model pool: enable another before you disable it'],
    ['pool', 'c', 'enabled', null],
    ['pool', 'z', 'drained', 'NOT_FOUND model pool has no deployment "z" (its deployments: a, b, c)'],
    ['solo', 'a', 'drained', 'NOT_FOUND model solo has no deployment "a" (it lists no deployments)'],
    ['nope', 'a', 'drained', 'NOT_FOUND model "nope" is not in the gateway config'],
    ['pool', 'a', 'paused', 'INVALID_ARGUMENT state must be enabled, drained or disabled, got "paused"'],
  ];
  for (const [m, d, s, want] of cases) {
    let got: string | null = null;
    try {
      checkSteer(config, states, m, d, s);
    } catch (e) {
      got = `${(e as CpError).code} ${(e as CpError).message}`;
    }
    assert.equal(got, want, `${m}/${d} ${s}`);
  }
});

test("withSteer: each deployment carries its state, the others '' ; no states, the config itself", () => {
  assert.equal(withSteer(config, new Map()), config);
  const out = withSteer(config, new Map([[steerKey('pool', 'b'), 'drained']]));
  assert.deepEqual(out.models[0].deployments.map((d) => d.state), ['', 'drained', '']);
  assert.equal(out.models[1], config.models[1]);
  assert.equal(config.models[0].deployments[1].state, '', 'the file config is not changed');
});
