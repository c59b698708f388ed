// The follower of background responses (data-plane/endpoints/responses/background-responses.ts) against a fake
// provider: one bill per response, from the terminal usage; ended by the open-streams registry it
// cancels upstream and bills what the cancel reports (one more read, else the bound, when the cancel
// says nothing billable); gone upstream or at a drain's deadline, safely above.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import type { GatewayConfig, ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { hashKey } from '../../proto/lib/keys.js';
import { GatewayState, StateHolder } from '../../data-plane/state/key-table.js';
import { OpenStreams } from '../../data-plane/state/open-streams.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { BACKGROUND_OUTPUT_CEILING_TOKENS, BackgroundFollowers, safeAbove } from '../../data-plane/endpoints/responses/background-responses.js';
import type { ResponsesProvider, UpstreamRead } from '../../data-plane/proxy/providers/responses-provider.js';
import type { RequestContext } from '../../data-plane/request/request-context.js';
import type { CallResult } from '../../data-plane/proxy/providers/provider.js';
import { estimateTokens } from '../../data-plane/proxy/tokens.js';

// The follower's poll timers are unref'd (a node's server keeps its loop alive): this one keeps the test's.
const keepAlive = setInterval(() => {}, 1000);
after(() => clearInterval(keepAlive));

const pepper = Buffer.alloc(32, 1);
const model: ModelConfig = { id: 'up', provider: 'openai', upstreamModel: '', baseUrl: '', upstreamApiKey: '', kind: 'chat', inputMicrosPerMtok: 1, outputMicrosPerMtok: 1, audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments: [], maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0 };
const BODY = { model: 'up', input: 'otters', background: true, max_output_tokens: 50 };
const USAGE = { promptTokens: 10, completionTokens: 20 };

function holder(): StateHolder {
  const config: GatewayConfig = { serviceName: 't', tiers: [{ name: 'free', rpm: 20, tpm: 100, maxParallelRequests: 100, freeGrantMicros: 0, allowedModels: ['up'] }], models: [model], toolBackends: [], realtimeUpstreams: [], trustedProxies: [], maxStalenessMs: 0 };
  const state = new GatewayState(config);
  state.upsertOrg({ orgId: 'o', tier: 'free', blocked: false, blockedReason: '', fundsVersion: 0, ownerAccountId: '' });
  state.upsertKey({ keyId: 'k', keyHash: hashKey(pepper, 'sk-k'), projectId: 'p', orgId: 'o', allowedModels: [], rpmLimit: 20, tpmLimit: 100, maxParallelRequests: 100 });
  const h = new StateHolder();
  h.current = state;
  return h;
}

/** A create's context as the follower sees it: every completion recorded, and a promise of the first. */
function context() {
  const completed: CallResult[] = [];
  let deferred = false;
  let resolve!: (r: CallResult) => void;
  const first = new Promise<CallResult>((r) => (resolve = r));
  const ctx = {
    key: { keyHash: hashKey(pepper, 'sk-k'), orgId: 'o' },
    // The create's input estimate as admission took it (no chain here: the body's own estimate).
    estimatedPromptTokens: 0,
    deferSettlement: () => (deferred = true),
    complete: (r: CallResult) => {
      completed.push(r);
      resolve(r);
    },
  } as unknown as RequestContext;
  return { ctx, completed, first, deferred: () => deferred };
}

/** A provider answering retrieves from a script (the last answer repeats) and cancels with one answer. */
function provider(reads: UpstreamRead[], cancelRead: UpstreamRead | null = null) {
  const calls: string[] = [];
  const p: ResponsesProvider = {
    create: () => {},
    stored: () => {},
    forward: () => {},
    retrieve: (_m, id, done) => {
      calls.push(`GET ${id}`);
      done(reads.length > 1 ? reads.shift()! : reads[0]);
    },
    cancel: (_m, id, done) => {
      calls.push(`CANCEL ${id}`);
      done(cancelRead ?? { httpStatus: 500, status: null, usage: null, outputTokens: 0 });
    },
  };
  return { p, calls };
}

const running: UpstreamRead = { httpStatus: 200, status: 'in_progress', usage: null, outputTokens: 0 };
const completed: UpstreamRead = { httpStatus: 200, status: 'completed', usage: USAGE, outputTokens: 5 };

test('a followed response is billed once, from its terminal usage, and leaves the registries', async () => {
  const streams = new OpenStreams();
  const f = new BackgroundFollowers({ holder: holder(), clock: new ManualClock(Date.UTC(2026, 0, 1)), openStreams: streams, isStale: () => false });
  const c = context();
  const { p, calls } = provider([running, running, completed]);
  f.follow(c.ctx, p, model, 'resp_1', BODY, 200);
  assert.equal(c.deferred(), true, 'the create is not settled by its answer');
  assert.equal(f.open(), 1);
  assert.equal(streams.count(), 1);
  assert.deepEqual(await c.first, { ...USAGE, status: 200 });
  assert.deepEqual(calls, ['GET resp_1', 'GET resp_1', 'GET resp_1']);
  assert.equal(f.open(), 0);
  assert.equal(streams.count(), 0);
  assert.equal(c.completed.length, 1);
});

test('a terminal response without usage: the input estimate and its output counted', async () => {
  const f = new BackgroundFollowers({ holder: holder(), clock: new ManualClock(Date.UTC(2026, 0, 1)), isStale: () => false });
  const c = context();
  f.follow(c.ctx, provider([{ httpStatus: 200, status: 'failed', usage: null, outputTokens: 7 }]).p, model, 'resp_2', BODY, 200);
  assert.deepEqual(await c.first, { status: 200, promptTokens: estimateTokens(BODY), completionTokens: 7 });
});

test('gone upstream (404): billed safely above, its max_output_tokens or the ceiling', async () => {
  const gone: UpstreamRead = { httpStatus: 404, status: null, usage: null, outputTokens: 0 };
  const f = new BackgroundFollowers({ holder: holder(), clock: new ManualClock(Date.UTC(2026, 0, 1)), isStale: () => false });
  const c = context();
  f.follow(c.ctx, provider([gone]).p, model, 'resp_3', BODY, 200);
  assert.deepEqual(await c.first, { status: 200, promptTokens: estimateTokens(BODY), completionTokens: 50 });
  const noMax = { model: 'up', input: 'otters', background: true };
  assert.deepEqual(safeAbove(noMax, 200), { status: 200, promptTokens: estimateTokens(noMax), completionTokens: BACKGROUND_OUTPUT_CEILING_TOKENS });
  // At the tier it asked for, with every built-in tool call it allows (issue 34: never below what the upstream may bill).
  const priced = { ...noMax, service_tier: 'priority', tools: [{ type: 'web_search' }, { type: 'code_interpreter' }], max_tool_calls: 4 };
  assert.deepEqual(safeAbove(priced, 200), { status: 200, promptTokens: estimateTokens(priced), completionTokens: BACKGROUND_OUTPUT_CEILING_TOKENS, serviceTier: 'priority', toolCalls: { web_search: 4, code_interpreter: 1 } });
});

test('ended by the registry (its key revoked): cancelled upstream, billed the cancelled usage', async () => {
  const h = holder();
  const streams = new OpenStreams();
  const f = new BackgroundFollowers({ holder: h, clock: new ManualClock(Date.UTC(2026, 0, 1)), openStreams: streams, isStale: () => false });
  const c = context();
  const { p, calls } = provider([running], { httpStatus: 200, status: 'cancelled', usage: { promptTokens: 10, completionTokens: 3 }, outputTokens: 0 });
  f.follow(c.ctx, p, model, 'resp_4', BODY, 200);
  h.current.removeKey(hashKey(pepper, 'sk-k'));
  assert.equal(streams.enforce(h.current), 1);
  assert.deepEqual(await c.first, { status: 200, promptTokens: 10, completionTokens: 3 });
  assert.deepEqual(calls, ['CANCEL resp_4']);
  assert.equal(f.open(), 0);
});

test('a cancel that says nothing billable: one more read, else safely above', async () => {
  const h = holder();
  const streams = new OpenStreams();
  const f = new BackgroundFollowers({ holder: h, clock: new ManualClock(Date.UTC(2026, 0, 1)), openStreams: streams, isStale: () => true });
  // Stale already when followed: ended at once, before any poll.
  const c = context();
  const { p, calls } = provider([running]);
  f.follow(c.ctx, p, model, 'resp_5', BODY, 499);
  assert.deepEqual(await c.first, { status: 499, promptTokens: estimateTokens(BODY), completionTokens: 50 });
  assert.deepEqual(calls, ['CANCEL resp_5', 'GET resp_5']);
});

test("a drain's deadline bills each followed response safely above, once", async () => {
  const f = new BackgroundFollowers({ holder: holder(), clock: new ManualClock(Date.UTC(2026, 0, 1)), isStale: () => false });
  const a = context();
  const b = context();
  f.follow(a.ctx, provider([running]).p, model, 'resp_6', BODY, 200);
  f.follow(b.ctx, provider([running]).p, model, 'resp_7', { ...BODY, max_output_tokens: 9 }, 200);
  assert.equal(f.closeAll(), 2);
  assert.equal(f.closeAll(), 0);
  assert.deepEqual([await a.first, await b.first].map((r) => r.completionTokens), [50, 9]);
  assert.equal(a.completed.length + b.completed.length, 2);
});
