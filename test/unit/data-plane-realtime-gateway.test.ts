// The realtime gateway's pure parts: which subprotocols carry credentials, token counts from an
// upstream, the in-band refusal of a model switch, close reasons, the realtime_upstreams config,
// socket turns' admission in KeyBudgets, the demo model's events, and the estimate a response without usage is billed.
// (Ending open sessions for a revoked key is the registry's: open-streams.test.ts.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { hashKey } from '../../proto/lib/keys.js';
import type { GatewayConfig, ModelConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { DEMO_CONFIG_PATH, parseGatewayConfig, redactGatewayConfig } from '../../control-plane/gateway-config/gateway-config.js';
import { GatewayState } from '../../data-plane/state/key-table.js';
import { ManualClock } from '../../data-plane/limits/clock.js';
import { KeyBudgets } from '../../data-plane/limits/key-budgets.js';
import { offersKeyInProtocol } from '../../data-plane/gate/gate.js';
import { clientEventRefusal } from '../../data-plane/realtime/client-events.js';
import { stringMemberSpans, tokens } from '../../data-plane/realtime/event-scan.js';
import { truncateReason } from '../../data-plane/endpoints/close-codes.js';
import { audioTokensOfBytes, ResponseTally } from '../../data-plane/realtime/response-estimate.js';
import { estimateTextTokens } from '../../data-plane/proxy/tokens.js';
import { usageCostMicros } from '../../proto/lib/money.js';
import { upstreamUrl } from '../../data-plane/realtime/ws-upstream.js';
import { DemoRealtimeLink } from '../../data-plane/proxy/providers/demo-realtime.js';

const model = (id: string, kind = 'realtime', upstreamModel = ''): ModelConfig => ({
  id,
  provider: 'demo',
  upstreamModel,
  baseUrl: '',
  upstreamApiKey: '',
  kind,
  inputMicrosPerMtok: 1,
  outputMicrosPerMtok: 1,
  audioMicrosPerUnit: 0,
  timeoutMs: 0,
  voices: [],
  deployments: [],
  maxAttempts: 0,
  failoverTimeoutMs: 0,
  circuitFailures: 0,
  circuitCooldownMs: 0,
});

test('subprotocols that carry a credential are recognised; plain ones are not', () => {
  const cases: Array<[string, boolean]> = [
    ['', false],
    ['realtime', false],
    ['realtime, openai-beta.realtime-v1', false],
    ['realtime, openai-insecure-api-key.sk-tollgate-abc', true],
    ['sk-tollgate-abc', true],
    ['Bearer.sk-x', true],
    ['x-api_key-y', true],
  ];
  for (const [header, want] of cases) assert.equal(offersKeyInProtocol(header), want, header);
});

test('token counts from an upstream are validated: whole, non-negative, bounded; anything else is 0', () => {
  const cases: Array<[unknown, number]> = [
    [12, 12],
    [12.7, 12],
    [0, 0],
    [-5, 0],
    [Number.NaN, 0],
    [Infinity, 0],
    ['12', 0],
    [null, 0],
    [undefined, 0],
    [1e15, 100_000_000],
  ];
  for (const [v, want] of cases) assert.equal(tokens(v), want, String(v));
});

test("a session.update naming another model is refused in-band; the session's own model or none passes", () => {
  const m = model('rt', 'realtime', 'gpt-realtime');
  const ev = (session: unknown) => Buffer.from(JSON.stringify({ type: 'session.update', event_id: 'e1', session }));
  assert.equal(clientEventRefusal(ev({ instructions: 'hi' }), m), null);
  assert.equal(clientEventRefusal(ev({ model: 'rt' }), m), null);
  assert.equal(clientEventRefusal(ev({ model: 'gpt-realtime' }), m), null);
  const refusal = clientEventRefusal(ev({ model: 'gpt-other' }), m)!;
  assert.equal(refusal.type, 'error');
  assert.equal(refusal.error.code, 'model_not_allowed');
  assert.equal(refusal.error.event_id, 'e1');
  assert.equal(clientEventRefusal(Buffer.from('{"type":"response.create","x":"\\"session.update\\""}'), m), null);
  assert.equal(clientEventRefusal(Buffer.from('not json "session.update"'), m), null);
});

test('a client event with a repeated key is refused in-band: the upstream may read the other copy', () => {
  // Before: `{"type":"session.update","type":"response.create",…}` read as a response.create here
  // (JSON.parse keeps the last copy) and went on; an upstream that keeps the first copy switched the
  // model. Likewise two `model` members, the allowed one last.
  const m = model('rt', 'realtime', 'gpt-realtime');
  for (const text of [
    '{"type":"session.update","type":"response.create","session":{"model":"gpt-other"}}',
    '{"type":"session.update","session":{"model":"gpt-other","model":"rt"}}',
    '{"type":"session.update","session":{"model":"gpt-other","mod\\u0065l":"rt"}}',
    '{"type":"session.update","session":{"model":"gpt-other"},"session":{"model":"rt"}}',
  ]) {
    const refusal = clientEventRefusal(Buffer.from(text), m);
    assert.equal(refusal?.type, 'error', text);
    assert.equal(refusal.error.code, 'invalid_request_error', text);
    assert.match(refusal.error.message, /repeat/, text);
  }
  assert.equal(clientEventRefusal(Buffer.from('{"type":"session.update","session":{"model":"rt","voice":"x"}}'), m), null);
});

test('close reasons fit the 123-byte limit of a close frame, whole characters only', () => {
  assert.equal(truncateReason('short'), 'short');
  const long = 'é'.repeat(100);
  const cut = truncateReason(long);
  assert.ok(Buffer.byteLength(cut) <= 123);
  assert.equal(cut, 'é'.repeat(61));
  const emoji = truncateReason('🙂'.repeat(40));
  assert.equal(emoji, '🙂'.repeat(30), 'a character is never split');
});

test('the upstream URL gets ?model= unless it names one', () => {
  const up = { model: 'rt', url: 'wss://up.example/v1/realtime', upstreamApiKey: 'k', upstreamModel: 'gpt-rt', connectTimeoutMs: 1 };
  assert.equal(upstreamUrl(up, 'rt'), 'wss://up.example/v1/realtime?model=gpt-rt');
  assert.equal(upstreamUrl({ ...up, url: 'wss://up.example/v1/realtime?model=fixed' }, 'rt'), 'wss://up.example/v1/realtime?model=fixed');
  assert.equal(upstreamUrl({ ...up, upstreamModel: '' }, 'rt'), 'wss://up.example/v1/realtime?model=rt');
});

test('config: realtime_upstreams name a realtime openai model, take a ws(s) URL and a credential from the environment, and are redacted before storage', () => {
  const doc = () => {
    const d = parse(readFileSync(DEMO_CONFIG_PATH, 'utf8'));
    d.models.push({ id: 'gpt-rt', provider: 'openai', kind: 'realtime', upstream_model: 'gpt-realtime' });
    d.realtime_upstreams = [{ model: 'gpt-rt', url: 'wss://api.example/v1/realtime', api_key_env: 'RT_KEY' }];
    return d;
  };
  const { proto } = parseGatewayConfig(doc(), { RT_KEY: 'secret' });
  assert.deepEqual(proto.realtimeUpstreams, [{ model: 'gpt-rt', url: 'wss://api.example/v1/realtime', upstreamApiKey: 'secret', upstreamModel: 'gpt-realtime', connectTimeoutMs: 10_000 }]);
  assert.equal(redactGatewayConfig(proto).realtimeUpstreams[0].upstreamApiKey, '');
  assert.equal(proto.models.find((m) => m.id === 'demo-realtime')?.kind, 'realtime');
  const bad: Array<[(d: any) => void, RegExp]> = [
    [(d) => (d.realtime_upstreams[0].model = 'nope'), /realtime_upstreams\[0\]\.model: names unknown model "nope"/],
    [(d) => (d.realtime_upstreams[0].model = 'demo-chat'), /must be a model of kind realtime with provider openai/],
    [(d) => (d.realtime_upstreams[0].url = 'https://api.example/v1/realtime'), /must be a ws:\/\/ or wss:\/\/ URL/],
    [(d) => (d.realtime_upstreams[0].api_key_env = 'UNSET_VAR'), /UNSET_VAR is not set/],
    [(d) => (d.realtime_upstreams = []), /model gpt-rt: a realtime model with provider openai needs exactly one realtime_upstreams entry, found 0/],
    [(d) => (d.realtime_upstreams[0].extra = 1), /unknown setting "extra"/],
  ];
  for (const [edit, re] of bad) {
    const d = doc();
    edit(d);
    assert.throws(() => parseGatewayConfig(d, { RT_KEY: 'secret' }), re);
  }
});

test("a socket turn is admitted without a slot of its own (the socket holds one) and a turn the upstream began is counted past the limits", () => {
  const clock = new ManualClock(Date.UTC(2025, 0, 1, 0, 0, 10));
  const kb = new KeyBudgets(clock);
  const limits = { keyId: 'k', rpmLimit: 3, tpmLimit: 100, maxParallel: 1 };
  const socket = kb.admit(limits, 0);
  assert.ok(socket.ok);
  // The key's one slot is the socket's: a turn still fits, and counts one request and its estimate.
  const turn = kb.admit(limits, 60, undefined, { slot: false });
  assert.ok(turn.ok);
  assert.deepEqual(kb.usage('k'), { minute: kb.usage('k').minute, requests: 2, tokens: 60, inFlight: 1 });
  // Over tpm it is refused as a request is, and consumes nothing.
  const over = kb.admit(limits, 50, undefined, { slot: false });
  assert.ok(!over.ok && over.dimension === 'tokens');
  if (turn.ok) turn.ticket.settle(70);
  assert.equal(kb.usage('k').inFlight, 1, "settling a turn leaves the socket's slot held");
  assert.equal(kb.usage('k').tokens, 70);
  // Forced: counted past rpm and tpm, never refused.
  assert.ok(kb.admit(limits, 0, undefined, { slot: false }).ok);
  const forced = kb.admit(limits, 500, undefined, { slot: false, force: true });
  assert.ok(forced.ok);
  assert.equal(kb.usage('k').requests, 4);
  assert.equal(kb.usage('k').tokens, 570);
  if (forced.ok) forced.ticket.refund();
  if (socket.ok) socket.ticket.settle(0);
  assert.equal(kb.usage('k').inFlight, 0);
});

test('the demo realtime model answers in OpenAI realtime event style with usage', async () => {
  const link = new DemoRealtimeLink(model('demo-realtime'));
  const events: any[] = [];
  link.events = { message: (d) => events.push(JSON.parse(d.toString())), closed: () => {} };
  link.resume();
  const send = (ev: unknown) => link.send(Buffer.from(JSON.stringify(ev)), false);
  send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hi there' }] } });
  send({ type: 'response.create' });
  send({ type: 'no.such.event', event_id: 'x1' });
  await new Promise((r) => setImmediate(r));
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 5), ['session.created', 'conversation.item.added', 'conversation.item.done', 'response.created', 'response.output_item.added']);
  assert.ok(types.filter((t) => t === 'response.output_text.delta').length >= 2);
  const done = events.find((e) => e.type === 'response.done');
  assert.equal(done.response.status, 'completed');
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, events.find((e) => e.type === 'response.output_text.done').text);
  assert.match(text, /You said: "Hi there"/);
  assert.ok(done.response.usage.input_tokens > 0);
  assert.equal(done.response.usage.output_tokens > 0, true);
  assert.equal(done.response.usage.total_tokens, done.response.usage.input_tokens + done.response.usage.output_tokens);
  const err = events[events.length - 1];
  assert.equal(err.type, 'error');
  assert.equal(err.error.event_id, 'x1');
  assert.ok(events.every((e) => typeof e.event_id === 'string'));
  // Paused, it holds its events until resumed.
  link.pause();
  send({ type: 'response.create' });
  await new Promise((r) => setImmediate(r));
  const before = events.length;
  assert.equal(events.filter((e) => e.type === 'response.done').length, 1);
  link.resume();
  assert.ok(events.length > before);
  assert.equal(events.filter((e) => e.type === 'response.done').length, 2);
});

test('stringMemberSpans finds top-level string members without decoding them, as JSON.parse reads them', () => {
  const text = '{"type":"response.output_audio.delta","nested":{"delta":"no"},"response_id":"resp_1","delta":"QUJD","n":3}';
  const data = Buffer.from(text);
  const [delta, id, n, nested] = stringMemberSpans(data, ['delta', 'response_id', 'n', 'nested']);
  assert.equal(text.slice(...delta!), '"QUJD"', 'the top-level delta, not the nested one');
  assert.equal(text.slice(...id!), '"resp_1"');
  assert.equal(n, undefined, 'a number is not a string member');
  assert.equal(nested, undefined, 'an object is not a string member');
  // The last copy wins, as in JSON.parse; an escaped key is read decoded.
  const twice = Buffer.from('{"delta":"a","\\u0064elta":"bb"}');
  assert.equal(twice.toString().slice(...stringMemberSpans(twice, ['delta'])[0]!), '"bb"');
  for (const bad of ['', '[1]', '{"delta":', '{"delta":"unterminated']) assert.deepEqual(stringMemberSpans(Buffer.from(bad), ['delta']), [undefined]);
});

test('a response tally counts items, instructions, tools and audio in, deltas out, and prices audio as audio', () => {
  const t = new ResponseTally();
  t.addItem({ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello there' }, { type: 'input_audio', audio: Buffer.alloc(8_000).toString('base64') }] });
  t.addItem({ type: 'function_call_output', call_id: 'c1', output: '{"temp":21}' });
  t.addConfig({ instructions: 'Be brief.', tools: [{ type: 'function', name: 'f' }], metadata: { ignored: 'x'.repeat(400) } });
  t.addTextOut('Hello ');
  t.audioOutBytes += 16_000;
  // Items: 4 each plus their text; instructions and tools as text; metadata is not sent to the model.
  const textIn = 4 + estimateTextTokens('Hello there') + 4 + estimateTextTokens('{"temp":21}') + estimateTextTokens('Be brief.') + estimateTextTokens(JSON.stringify([{ type: 'function', name: 'f' }]));
  // 8,000 bytes of audio: one second at the assumed 8,000 B/s, 20 tokens; 16,000 bytes out: 40.
  assert.equal(audioTokensOfBytes(8_000), 20);
  const counts = t.counts();
  assert.deepEqual(counts, { promptTokens: textIn + 20, completionTokens: estimateTextTokens('Hello ') + 40, audioPromptTokens: 20, audioCompletionTokens: 40 });
  const prices = { inputMicrosPerMtok: 1_000_000, outputMicrosPerMtok: 2_000_000, inputAudioMicrosPerMtok: 10_000_000, outputAudioMicrosPerMtok: 20_000_000 };
  assert.equal(usageCostMicros(counts, prices), textIn * 1 + 20 * 10 + estimateTextTokens('Hello ') * 2 + 40 * 20);
});
