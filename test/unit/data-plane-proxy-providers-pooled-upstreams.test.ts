import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ModelConfig, ModelDeployment } from '../../proto/gen/tollgate/v1/sync.js';
import { dearestPrices, pricedAs, retryAfterMs } from '../../data-plane/proxy/providers/pooled-upstreams.js';

const dep = (id: string, prices: Partial<ModelDeployment> = {}): ModelDeployment => ({ id, baseUrl: 'http://u', upstreamApiKey: 'k', upstreamModel: 'm', weight: 1, rpm: 0, tpm: 0, maxParallelRequests: 0, state: '', ...prices });
const model = (deployments: ModelDeployment[]): ModelConfig => ({
  id: 'm', provider: 'openai', upstreamModel: 'm', baseUrl: 'http://u', upstreamApiKey: '', kind: 'chat', inputMicrosPerMtok: 1_000_000, outputMicrosPerMtok: 2_000_000,
  audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments, maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0,
});

test("a deployment bills at the prices it overrides, the model's elsewhere", () => {
  const m = model([dep('a'), dep('b', { inputMicrosPerMtok: 3_000_000 })]);
  assert.equal(pricedAs(m, m.deployments[0]), m, 'no override: the model itself');
  const b = pricedAs(m, m.deployments[1]);
  assert.deepEqual([b.id, b.inputMicrosPerMtok, b.outputMicrosPerMtok], ['m', 3_000_000, 2_000_000]);
});

test("a pooled model's worst case is priced at the dearest of its deployments, part by part", () => {
  // Before: at the model's prices, so a dearer deployment could pass a money limit by more than its worst case.
  const m = model([dep('a', { outputMicrosPerMtok: 5_000_000 }), dep('b', { inputMicrosPerMtok: 3_000_000, cachedInputMicrosPerMtok: 100 }), dep('c', { inputMicrosPerMtok: 500_000 })]);
  const d = dearestPrices(m);
  assert.deepEqual([d.inputMicrosPerMtok, d.outputMicrosPerMtok, d.cachedInputMicrosPerMtok], [3_000_000, 5_000_000, 1_000_000]);
  assert.equal(dearestPrices(model([])).inputMicrosPerMtok, 1_000_000);
});

test('retry-after: seconds, an HTTP date, or 1 s when absent or unreadable', () => {
  const now = Date.UTC(2025, 0, 1);
  assert.equal(retryAfterMs('30', now), 30_000);
  assert.equal(retryAfterMs(new Date(now + 12_000).toUTCString(), now), 12_000);
  assert.equal(retryAfterMs(undefined, now), 1_000);
  assert.equal(retryAfterMs('soon', now), 1_000);
});
