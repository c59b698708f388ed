// The node's one registry of what keys have open, and its one policy: HTTP requests and realtime
// sessions are ended for the same reasons (a node past its maximum staleness, a revoked key, an
// expired key, a blocked organisation, a narrowed scope), each reason with one error; each entry ends
// once, and an entry that ended by itself is not ended again. The registry keeps one alarm at the
// earliest expiry among the keys of what is open.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { GatewayConfig, ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { hashKey } from '../../proto/lib/keys.js';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { OpenStreams, endReasonFor, type EndReason, type OpenEntry, type OpenStreamsOptions } from '../../data-plane/state/open-streams.js';
import { closeReasonOf, type GatewayError } from '../../data-plane/errors.js';

const pepper = Buffer.alloc(32, 1);
const model = (id: string): ModelConfig => ({ id, provider: 'demo', upstreamModel: '', baseUrl: '', upstreamApiKey: '', kind: 'realtime', inputMicrosPerMtok: 1, outputMicrosPerMtok: 1, audioMicrosPerUnit: 0, timeoutMs: 0, voices: [], deployments: [], maxAttempts: 0, failoverTimeoutMs: 0, circuitFailures: 0, circuitCooldownMs: 0 });

function stateWithKeys(): GatewayState {
  const config: GatewayConfig = {
    serviceName: 'tollgate',
    tiers: [{ name: 'free', rpm: 20, tpm: 100, maxParallelRequests: 100, freeGrantMicros: 0, allowedModels: ['rt', 'rt2'] }],
    models: [model('rt'), model('rt2')],
    toolBackends: [],
    realtimeUpstreams: [],
    trustedProxies: [],
    maxStalenessMs: 0,
  };
  const state = new GatewayState(config);
  for (const o of ['o1', 'o2', 'o3']) state.upsertOrg({ orgId: o, tier: 'free', blocked: false, blockedReason: '', fundsVersion: 0, ownerAccountId: '' });
  for (const [id, org] of [['a', 'o1'], ['b', 'o1'], ['c', 'o2'], ['d', 'o2'], ['e', 'o3']]) state.upsertKey(keyEntry(id, org));
  return state;
}

function keyEntry(id: string, org: string, allowed: string[] = [], expiresAtMs?: number) {
  return { keyId: id, keyHash: hashKey(pepper, `sk-${id}`), projectId: 'p', orgId: org, allowedModels: allowed, rpmLimit: 20, tpmLimit: 100, maxParallelRequests: 100, ...(expiresAtMs === undefined ? {} : { expiresAtMs }) };
}

interface Ended {
  kind: 'http' | 'realtime';
  id: string;
  why: EndReason;
  /** What the client is told: an HTTP error's message, a WebSocket's close reason. */
  text: string;
  code: string;
}

/** Entries as HTTP requests and realtime sessions register them: the registry tells them apart by nothing. */
function registry(opts: OpenStreamsOptions = {}) {
  const streams = new OpenStreams(opts);
  const ended: Ended[] = [];
  const open = (kind: Ended['kind'], id: string, modelId = '', orgOf = '', expiresAtMs?: number): OpenEntry => {
    const e: OpenEntry = {
      keyHash: hashKey(pepper, `sk-${id}`),
      orgId: orgOf,
      modelId,
      slot: -1,
      // An HTTP request carries its key's expiry; a realtime session leaves it to the registry.
      ...(kind === 'http' && expiresAtMs !== undefined ? { expiresAtMs } : {}),
      end: (why: EndReason, err: GatewayError) => ended.push({ kind, id, why, code: err.code, text: kind === 'realtime' ? closeReasonOf(err) : err.message }),
    };
    streams.add(e);
    return e;
  };
  return { streams, ended, open };
}

/** An alarm that only records where it is set (limits/clock.ts `Alarm` rings it in the node). */
function fakeAlarm() {
  const alarm = {
    deadline: Infinity,
    sets: 0,
    set(ms: number) {
      alarm.deadline = ms;
      alarm.sets++;
    },
  };
  return alarm;
}

test('a revoked key: every open entry of that key ends once, and no other; one that ended by itself is not ended', () => {
  const state = stateWithKeys();
  const { streams, ended, open } = registry();
  open('http', 'a');
  open('http', 'a');
  open('http', 'b');
  const gone = open('http', 'e');
  assert.equal(streams.count(), 4);
  assert.equal(streams.enforce(state), 0, 'nothing changed: nothing ends');
  state.removeKey(hashKey(pepper, 'sk-a'));
  assert.equal(streams.enforce(state), 2);
  assert.deepEqual(ended.map((e) => `${e.id}:${e.why}`), ['a:key_revoked', 'a:key_revoked']);
  assert.equal(streams.enforce(state), 0, 'already ended');
  assert.equal(streams.remove(gone), true);
  assert.equal(streams.remove(gone), false, 'removing is idempotent');
  state.removeKey(hashKey(pepper, 'sk-e'));
  assert.equal(streams.enforce(state), 0, 'an unregistered entry is not ended');
  assert.equal(streams.count(), 1);
  assert.equal(streams.count(hashKey(pepper, 'sk-b')), 1);
});

test('an entry whose end throws does not stop the others', () => {
  const state = stateWithKeys();
  const { streams, ended, open } = registry();
  streams.add({
    keyHash: hashKey(pepper, 'sk-a'),
    orgId: 'o1',
    modelId: '',
    slot: -1,
    end: () => {
      throw new Error('boom');
    },
  });
  open('http', 'a');
  open('realtime', 'c', 'rt');
  open('http', 'e');
  state.removeKey(hashKey(pepper, 'sk-a'));
  state.upsertOrg({ orgId: 'o2', tier: 'free', blocked: true, blockedReason: 'balance_exhausted', fundsVersion: 1, ownerAccountId: '' });
  assert.equal(streams.enforce(state), 3);
  assert.deepEqual(ended.map((e) => `${e.id}:${e.why}`), ['a:key_revoked', 'c:org_blocked']);
  assert.equal(streams.count(), 1);
});

test('one policy for HTTP requests and realtime sessions: removed keys, blocked organisations and narrowed scopes end both, with the same error and text', () => {
  const state = stateWithKeys();
  const { streams, ended, open } = registry();
  for (const kind of ['http', 'realtime'] as const) {
    open(kind, 'a', 'rt');
    open(kind, 'b', 'rt');
    open(kind, 'c', 'rt');
    open(kind, 'd', 'rt2');
  }
  // An HTTP request whose body (and so its model) was not read yet names no model.
  open('http', 'b');
  assert.equal(streams.count(), 9);

  state.removeKey(hashKey(pepper, 'sk-a'));
  state.upsertOrg({ orgId: 'o2', tier: 'free', blocked: true, blockedReason: 'balance_exhausted', fundsVersion: 1, ownerAccountId: '' });
  streams.enforce(state);
  const byKind = (kind: Ended['kind']) => ended.filter((e) => e.kind === kind).map((e) => `${e.id}:${e.why}:${e.code}`).sort();
  assert.deepEqual(byKind('http'), ['a:key_revoked:KEY_INVALID', 'c:org_blocked:ORG_BLOCKED', 'd:org_blocked:ORG_BLOCKED']);
  assert.deepEqual(byKind('realtime'), byKind('http'));
  const text = (kind: Ended['kind'], id: string) => ended.find((e) => e.kind === kind && e.id === id)!.text;
  assert.equal(text('http', 'a'), 'This API key was revoked.');
  assert.match(text('realtime', 'a'), /^invalid_api_key: .*revoked/);
  assert.equal(text('http', 'c'), "The organisation's balance is exhausted; add credits to continue.");
  assert.equal(text('realtime', 'c'), "insufficient_quota: the organisation's balance is exhausted; add credits to continue.");
  assert.equal(streams.count(), 3);

  ended.length = 0;
  state.upsertKey(keyEntry('b', 'o1', ['rt2']));
  streams.enforce(state);
  assert.deepEqual(ended.map((e) => [e.kind, e.id, e.why, e.text]).sort(), [
    ['http', 'b', 'model_not_allowed', 'This API key may no longer use the model `rt`.'],
    ['realtime', 'b', 'model_not_allowed', 'model_not_allowed: this API key may no longer use the model `rt`.'],
  ]);
  assert.equal(streams.count(), 1, 'the request that names no model yet stays');
});

test('a node past its maximum staleness ends everything open, HTTP and realtime alike', () => {
  const state = stateWithKeys();
  const { streams, ended, open } = registry();
  open('http', 'a');
  open('realtime', 'c', 'rt');
  assert.equal(streams.enforce(state, true), 2);
  assert.deepEqual(ended.map((e) => [e.kind, e.why, e.code]), [
    ['http', 'node_stale', 'KEY_STALE'],
    ['realtime', 'node_stale', 'KEY_STALE'],
  ]);
  assert.match(ended[1].text, /^invalid_api_key: this gateway node cannot currently verify API keys/);
  assert.equal(streams.count(), 0);
});

test("a key's expiry passing on the node's clock ends its HTTP requests and realtime sessions, with the 401 a request of the expired key gets; revocation comes first, a blocked organisation after", () => {
  const state = stateWithKeys();
  const T = Date.UTC(2026, 0, 1);
  state.upsertKey(keyEntry('a', 'o1', [], T));
  state.upsertKey(keyEntry('c', 'o2', [], T));
  state.upsertKey(keyEntry('e', 'o3', [], T + 60_000));
  let now = T - 1;
  const { streams, ended, open } = registry({ now: () => now });
  for (const kind of ['http', 'realtime'] as const) {
    open(kind, 'a', 'rt', 'o1', T);
    open(kind, 'b', 'rt', 'o1');
    open(kind, 'c', 'rt', 'o2', T);
    open(kind, 'e', 'rt', 'o3', T + 60_000);
  }
  assert.equal(streams.enforce(state), 0, 'a millisecond before the expiry nothing ends');
  assert.equal(endReasonFor(state, streams.list()[0], false, T - 1), null);
  assert.equal(endReasonFor(state, streams.list()[0], false, T), 'key_expired');

  now = T;
  state.upsertOrg({ orgId: 'o2', tier: 'free', blocked: true, blockedReason: 'balance_exhausted', fundsVersion: 1, ownerAccountId: '' });
  assert.equal(streams.enforce(state), 4);
  assert.deepEqual(ended.map((e) => `${e.kind}:${e.id}:${e.why}:${e.code}`).sort(), [
    'http:a:key_expired:KEY_INVALID',
    'http:c:key_expired:KEY_INVALID',
    'realtime:a:key_expired:KEY_INVALID',
    'realtime:c:key_expired:KEY_INVALID',
  ]);
  const text = (kind: Ended['kind']) => ended.find((e) => e.kind === kind && e.id === 'a')!.text;
  assert.equal(text('http'), 'Invalid API key: the key does not exist or was revoked.');
  assert.equal(text('realtime'), 'invalid_api_key: invalid API key: the key does not exist or was revoked.');

  // A revoked key that has also expired is named revoked.
  ended.length = 0;
  now = T + 60_000;
  state.removeKey(hashKey(pepper, 'sk-e'));
  assert.equal(streams.enforce(state), 2);
  assert.deepEqual(ended.map((e) => `${e.id}:${e.why}`), ['e:key_revoked', 'e:key_revoked']);
  assert.equal(streams.count(), 2, "the keys without an expiry keep theirs");
});

test('the alarm stands at the earliest expiry among the keys of what is open: set on add, reset by each enforcement to what stays open', () => {
  const state = stateWithKeys();
  const T = Date.UTC(2026, 0, 1);
  state.upsertKey(keyEntry('a', 'o1', [], T + 2000));
  state.upsertKey(keyEntry('c', 'o2', [], T + 1000));
  const alarm = fakeAlarm();
  let now = T;
  // A realtime session carries no expiry: the registry asks the state (as main.ts wires it).
  const { streams, ended, open } = registry({ now: () => now, alarm, expiryOf: (h) => state.keysByHash.get(h)?.expiresAtMs ?? 0 });

  open('http', 'b');
  assert.equal(alarm.deadline, Infinity, 'a key without an expiry sets nothing');
  open('http', 'a', '', 'o1', T + 2000);
  assert.equal(alarm.deadline, T + 2000);
  const session = open('realtime', 'c', 'rt');
  assert.equal(alarm.deadline, T + 1000, "the session's key expires first");
  const sets = alarm.sets;
  open('http', 'a', '', 'o1', T + 2000);
  assert.equal(alarm.sets, sets, 'a later expiry leaves it');

  // The session left by itself: the alarm rings for nothing, and is set to what is left.
  streams.remove(session);
  now = T + 1000;
  assert.equal(streams.enforce(state), 0);
  assert.equal(alarm.deadline, T + 2000);
  now = T + 2000;
  assert.equal(streams.enforce(state), 2);
  assert.deepEqual(ended.map((e) => `${e.id}:${e.why}`), ['a:key_expired', 'a:key_expired']);
  assert.equal(alarm.deadline, Infinity, 'what stays open has no expiry');
  assert.equal(streams.count(), 1);
});
