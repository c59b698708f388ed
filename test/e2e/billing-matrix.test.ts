// The billing conformance matrix (docs/billing-endings.md): every model endpoint × every way a
// request ends, against fake upstreams with known usage, asserting the micro-dollars the request log
// recorded for that one request. One key per cell, so each cell's row is its own. A new endpoint is
// one entry of ENDPOINTS; a new ending is one entry of ENDINGS and one case in `run`.
//
// Before the fixes of the billing issue: a key revoked (or its organisation blocked) before the
// upstream answered was billed $0 while the upstream ran on; a client that left early was billed the
// words of its messages only; a transcription without an upstream `duration` was billed bytes / 32,000
// seconds.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { consoleClient, createKey, type Console, type DemoKey } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeRealtimeUpstream, type FakeRealtimeUpstream } from '../helpers/fake-realtime-upstream.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { openRealtime } from '../helpers/realtime.js';
import { startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageRows } from '../helpers/usage-db.js';
import { estimateOutputTokens, estimateTextTokens, estimateTokens } from '../../data-plane/proxy/tokens.js';
import { wavFile } from '../helpers/audio-files.js';

/**
 * Cells whose fix belongs to the usage readers (issue 20, deliver 1: JSON and SSE usage at any size;
 * realtime events told apart by type), another branch. They run, and are expected to fail until that
 * branch is merged: the integrator empties this list then. A cell listed here that passes fails the
 * test, so the list cannot go stale silently.
 */
const NEEDS_READERS: readonly string[] = [];

const MIB = 1024 * 1024;
/** Prices in the test config, in micro-dollars: per token in and out, per second of audio, per character of speech. */
const IN = 1000;
const OUT = 2000;
const PER_SECOND = 100;
const PER_CHAR = 15;
/** The fake upstream's known usage. */
const CHAT_USAGE = { prompt: 11, completion: 6 };
const EMBED_USAGE = 7;
const REALTIME_USAGE = { input_tokens: 10, output_tokens: 20 };
/** What a verbose_json transcription reports, and what the uploaded file really holds. */
const UPSTREAM_SECONDS = 42;
const FILE_SECONDS = 5;
const RT_IN = 3000;
const RT_OUT = 4000;
const RT_AUDIO_IN = 30_000;
const RT_AUDIO_OUT = 50_000;

const ENDINGS = [
  'normal',
  'answer over 4 MiB',
  'client abort before the head',
  'abort mid-stream',
  'key revoked mid-stream',
  'org blocked mid-stream',
  'upstream error mid-stream',
  'upstream without usage',
] as const;
type Ending = (typeof ENDINGS)[number];

/** Why a cell does not exist for an endpoint (shown in the test's name, never silently left out). */
type Cost = number | { na: string };

interface HttpEndpoint {
  name: string;
  kind: 'json' | 'sse' | 'multipart';
  path: string;
  body(): Record<string, unknown>;
  /** The micro-dollars recorded for this ending. */
  expected(e: Ending, body: Record<string, unknown>): Cost;
}

const chatMessages = [
  { role: 'system', content: 'You answer in one short sentence.' },
  { role: 'user', content: [{ type: 'text', text: 'What is in this picture?' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=', detail: 'low' } }] },
];
const chatTools = [{ type: 'function', function: { name: 'lookup', description: 'Looks a thing up', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
/** The first SSE chunk the fake sends before it holds or fails: its content, as received. */
const FIRST_CHUNK = { choices: [{ delta: { role: 'assistant', content: 'Hello' } }] };
const WHOLE_ANSWER = { choices: [{ message: { role: 'assistant', content: 'Hello from the fake upstream.' } }] };
const STREAMED_ANSWER = ['Hello', ' from', ' the', ' fake', ' upstream', '.'].reduce((n, w) => n + estimateOutputTokens({ choices: [{ delta: { content: w } }] }), 0);

function chatCost(e: Ending, body: Record<string, unknown>, streamed: boolean): Cost {
  const usage = CHAT_USAGE.prompt * IN + CHAT_USAGE.completion * OUT;
  const prompt = estimateTokens(body) * IN;
  switch (e) {
    case 'normal':
    case 'answer over 4 MiB':
    case 'client abort before the head':
      return usage;
    case 'abort mid-stream':
      // Read on after the client left: the upstream's usage arrived within the grace.
      return streamed ? usage : { na: 'a JSON answer arrives in one piece; see "client abort before the head"' };
    case 'key revoked mid-stream':
    case 'org blocked mid-stream':
    case 'upstream error mid-stream':
      // Cancelled (or failed) with what had arrived: the estimate of everything sent and received.
      return prompt + (streamed ? estimateOutputTokens(FIRST_CHUNK) * OUT : 0);
    case 'upstream without usage':
      return prompt + (streamed ? STREAMED_ANSWER : estimateOutputTokens(WHOLE_ANSWER)) * OUT;
  }
}

function transcription(format: string): HttpEndpoint {
  return {
    name: `transcription ${format}`,
    kind: 'multipart',
    path: '/v1/audio/transcriptions',
    body: () => ({ model: 'up-transcribe', response_format: format }),
    expected(e) {
      const upstream = UPSTREAM_SECONDS * PER_SECOND;
      const file = FILE_SECONDS * PER_SECOND;
      switch (e) {
        case 'normal':
        case 'client abort before the head':
          // Only verbose_json carries the upstream's duration; the others are billed from the file.
          return format === 'verbose_json' ? (e === 'normal' ? upstream : file) : file;
        case 'answer over 4 MiB':
          return format === 'verbose_json' ? upstream : { na: `the ${format} answer carries no duration at any size: billed from the file (row "normal")` };
        case 'abort mid-stream':
          return { na: 'a transcription answer arrives in one piece; see "client abort before the head"' };
        case 'key revoked mid-stream':
        case 'org blocked mid-stream':
        case 'upstream error mid-stream':
        case 'upstream without usage':
          return file;
      }
    },
  };
}

const ENDPOINTS: HttpEndpoint[] = [
  {
    name: 'chat JSON',
    kind: 'json',
    path: '/v1/chat/completions',
    body: () => ({ model: 'up-chat', messages: chatMessages, tools: chatTools }),
    expected: (e, body) => chatCost(e, body, false),
  },
  {
    name: 'chat SSE with include_usage',
    kind: 'sse',
    path: '/v1/chat/completions',
    body: () => ({ model: 'up-chat', stream: true, stream_options: { include_usage: true }, messages: chatMessages, tools: chatTools }),
    expected: (e, body) => chatCost(e, body, true),
  },
  {
    name: 'chat SSE without include_usage',
    kind: 'sse',
    path: '/v1/chat/completions',
    body: () => ({ model: 'up-chat', stream: true, messages: chatMessages, tools: chatTools }),
    expected: (e, body) => chatCost(e, body, true),
  },
  {
    name: 'embeddings',
    kind: 'json',
    path: '/v1/embeddings',
    body: () => ({ model: 'up-embed', input: ['the first text to embed', 'and a second one'] }),
    expected(e, body) {
      switch (e) {
        case 'normal':
        case 'answer over 4 MiB':
        case 'client abort before the head':
          return EMBED_USAGE * IN;
        case 'abort mid-stream':
          return { na: 'an embeddings answer arrives in one piece; see "client abort before the head"' };
        default:
          return estimateTokens(body) * IN;
      }
    },
  },
  {
    name: 'speech',
    kind: 'json',
    path: '/v1/audio/speech',
    body: () => ({ model: 'up-speech', voice: 'alloy', input: 'Read this sentence aloud, please.' }),
    // Speech is billed by its input characters, which the upstream synthesises whatever happens next.
    expected: (e, body) => (e === 'answer over 4 MiB' ? { na: 'speech is billed by its input, not its answer' } : (body.input as string).length * PER_CHAR),
  },
  transcription('json'),
  transcription('verbose_json'),
  transcription('text'),
  transcription('srt'),
  transcription('vtt'),
];

let up: FakeUpstream;
let rt: FakeRealtimeUpstream;
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
const audio = wavFile(FILE_SECONDS);

before(async () => {
  [up, rt] = await Promise.all([startFakeUpstream(), startFakeRealtimeUpstream()]);
  const price = { input_usd_per_mtok: String(IN), output_usd_per_mtok: String(OUT) };
  cp = await startControlPlane({
    env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
    configYaml: configYaml((cfg) => {
      cfg.tiers.matrix = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };
      addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['matrix'], price);
      addUpstreamModel(cfg, 'up-embed', up.baseUrl, ['matrix'], { kind: 'embeddings', ...price });
      addUpstreamModel(cfg, 'up-speech', up.baseUrl, ['matrix'], { kind: 'speech', audio_usd_per_unit: String((PER_CHAR * 1000) / 1e6), voices: ['alloy'], input_usd_per_mtok: undefined, output_usd_per_mtok: undefined });
      addUpstreamModel(cfg, 'up-transcribe', up.baseUrl, ['matrix'], { kind: 'transcription', audio_usd_per_unit: String(PER_SECOND / 1e6), input_usd_per_mtok: undefined, output_usd_per_mtok: undefined });
      cfg.models.push({ id: 'rt-chat', provider: 'openai', kind: 'realtime', upstream_model: 'gpt-realtime-test', input_usd_per_mtok: String(RT_IN), output_usd_per_mtok: String(RT_OUT), input_audio_usd_per_mtok: String(RT_AUDIO_IN), output_audio_usd_per_mtok: String(RT_AUDIO_OUT) });
      cfg.realtime_upstreams = [{ model: 'rt-chat', url: rt.url, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', connect_timeout_ms: 5000 }];
      cfg.tiers.matrix.models.push('rt-chat');
    }),
  });
  // Each report is sent as soon as it is journaled: a cell waits for its row, not for the once-a-second send.
  node = await startDataPlane(cp, { extraArgs: ['--report-every-ms', '0'] });
  admin = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  admin?.close();
  await stopAll();
  await Promise.all([up?.close(), rt?.close()]);
});

async function newKey(): Promise<DemoKey> {
  const k = await createKey(admin, { tier: 'matrix' });
  await waitUntilKnown(node.url, k.key);
  return k;
}

/** Revokes the key, or blocks its organisation (a cap of $0), through the console API (the CLI's client). */
async function endByGateway(e: Ending, k: DemoKey): Promise<void> {
  if (e === 'key revoked mid-stream') {
    const r = await admin.revokeKey({ keyId: k.keyId });
    assert.equal(r.apiKey?.status, 'revoked');
  } else {
    const org = await admin.setOrgCap({ orgId: k.orgId, capMicros: 0 });
    assert.equal(org.id, k.orgId);
  }
}

function requestInit(ep: HttpEndpoint, body: Record<string, unknown>, k: DemoKey, signal?: AbortSignal): RequestInit {
  const headers: Record<string, string> = { authorization: `Bearer ${k.key}` };
  if (ep.kind !== 'multipart') return { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify(body), signal };
  const form = new FormData();
  for (const [name, value] of Object.entries(body)) form.append(name, String(value));
  form.append('file', new Blob([new Uint8Array(audio)], { type: 'audio/wav' }), 'speech.wav');
  return { method: 'POST', headers, body: form, signal };
}

/** Reads a response to its end; 'error' when it was cut (a reset, or a terminal SSE error event). */
async function readAll(res: Response): Promise<{ how: 'done' | 'error'; text: string }> {
  let text = '';
  try {
    const reader = res.body!.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
    }
  } catch {
    return { how: 'error', text };
  }
  return { how: /"error"/.test(text) && res.headers.get('content-type')?.includes('event-stream') ? 'error' : 'done', text };
}

/** Runs one cell's request to its end on the node. */
async function run(ep: HttpEndpoint, e: Ending, k: DemoKey): Promise<void> {
  const body = ep.body();
  const url = `${node.url}${ep.path}`;
  up.setMode('normal');
  up.padAnswerBytes = 0;
  up.transcriptionDuration = UPSTREAM_SECONDS;
  try {
    switch (e) {
      case 'normal':
      case 'answer over 4 MiB':
      case 'upstream without usage': {
        if (e === 'answer over 4 MiB') up.padAnswerBytes = 5 * MIB;
        if (e === 'upstream without usage') {
          up.setMode('no-usage');
          up.transcriptionDuration = null;
        }
        const res = await fetch(url, requestInit(ep, body, k));
        assert.equal(res.status, 200, await res.clone().text());
        assert.equal((await readAll(res)).how, 'done');
        return;
      }
      case 'client abort before the head': {
        up.setMode('hold-head');
        const ac = new AbortController();
        const pending = fetch(url, requestInit(ep, body, k, ac.signal)).catch(() => null);
        await up.waitForHeld(1);
        ac.abort();
        await pending;
        up.release();
        return;
      }
      case 'abort mid-stream': {
        // An SSE stream is held after its first chunk; another answer is cut after its first read.
        if (ep.kind === 'sse') up.setMode('hold-stream');
        const ac = new AbortController();
        const res = await fetch(url, requestInit(ep, body, k, ac.signal));
        assert.equal(res.status, 200);
        const reader = res.body!.getReader();
        await reader.read();
        if (ep.kind === 'sse') await up.waitForHeld(1);
        ac.abort();
        await reader.read().catch(() => null);
        up.release();
        return;
      }
      case 'key revoked mid-stream':
      case 'org blocked mid-stream': {
        const upstreamLetGo = up.waitForClientClose();
        if (ep.kind === 'sse') {
          up.setMode('hold-stream');
          const res = await fetch(url, requestInit(ep, body, k));
          assert.equal(res.status, 200);
          const reader = res.body!.getReader();
          await reader.read();
          await up.waitForHeld(1);
          await endByGateway(e, k);
          let rest = '';
          for (;;) {
            const r = await reader.read().catch(() => ({ done: true, value: undefined }));
            if (r.done) break;
            rest += Buffer.from(r.value!).toString();
          }
          assert.match(rest, /"error"/, 'the stream ends with an error event');
        } else {
          up.setMode('hold-head');
          const pending = fetch(url, requestInit(ep, body, k));
          await up.waitForHeld(1);
          await endByGateway(e, k);
          const res = await pending;
          assert.equal(res.status, 401, await res.clone().text());
          await res.arrayBuffer();
        }
        // The upstream call was cancelled at once, as the client's answer was.
        await upstreamLetGo;
        up.release();
        return;
      }
      case 'upstream error mid-stream': {
        up.setMode('reset-mid-body');
        const res = await fetch(url, requestInit(ep, body, k)).catch(() => null);
        if (res) await readAll(res);
        return;
      }
    }
  } finally {
    up.setMode('normal');
    up.padAnswerBytes = 0;
    up.release();
  }
}

/** One cell: the expected micro-dollars, or why it does not apply. */
function cell(name: string, expected: Cost, go: () => Promise<string>): void {
  if (typeof expected !== 'number') {
    test(`${name}: not applicable (${expected.na})`, () => {});
    return;
  }
  const needsReaders = NEEDS_READERS.includes(name);
  test(`${name}: bills ${expected} micro-dollars${needsReaders ? ' [NEEDS_READERS: asserts the bill is still wrong here, until the usage readers are merged]' : ''}`, { timeout: 60_000 }, async () => {
    let outcome: Error | null = null;
    try {
      const keyId = await go();
      const [row] = await waitForUsageRows(cp.dbPath, keyId, 1, 15_000);
      assert.equal(row.cost_micros, expected, `${name}: recorded ${JSON.stringify(row)}`);
    } catch (err) {
      outcome = err as Error;
    }
    if (!needsReaders) {
      if (outcome) throw outcome;
      return;
    }
    assert.ok(outcome, `${name} passes now: take it out of NEEDS_READERS`);
  });
}

for (const ep of ENDPOINTS) {
  for (const e of ENDINGS) {
    const body = ep.body();
    cell(`${ep.name} × ${e}`, ep.expected(e, body), async () => {
      const k = await newKey();
      await run(ep, e, k);
      return k.keyId;
    });
  }
}

// Realtime: one session per cell; each `response.done` is billed as it passes.
const RESPONSE = REALTIME_USAGE.input_tokens * RT_IN + REALTIME_USAGE.output_tokens * RT_OUT;
/** The user message every realtime cell sends, and the text deltas the fake answers with. */
const RT_ITEM = { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello there' }] };
const RT_DELTAS = ['Hello ', 'from ', 'upstream.'];
/**
 * A realtime response without the upstream's usage (docs/billing-endings.md): what the client sent
 * into the conversation for it (the item, by the one estimator) at the input price, and every text
 * delta relayed for it at the output price.
 */
const RT_ESTIMATE = estimateTokens({ input: [RT_ITEM] }) * RT_IN + RT_DELTAS.reduce((n, d) => n + estimateTextTokens(d), 0) * RT_OUT;
const REALTIME: Record<Ending, Cost> = {
  normal: RESPONSE,
  'answer over 4 MiB': { na: 'realtime events are read one message at a time, whatever the session has sent' },
  'client abort before the head': { na: 'the fake answers a response in one burst; a client leaving between responses is "normal"' },
  'abort mid-stream': { na: 'the fake answers a response in one burst; a client leaving between responses is "normal"' },
  'key revoked mid-stream': RESPONSE,
  'org blocked mid-stream': RESPONSE,
  'upstream error mid-stream': RESPONSE,
  // Before the fix: an upstream `response.done` without usage was billed 0.
  'upstream without usage': RT_ESTIMATE,
};
// Realtime rows: a plain response, and one whose `response.metadata` (echoed back by the upstream, as
// OpenAI does) names other event types: it is billed all the same.
const REALTIME_ROWS: Array<[string, Record<string, string> | null]> = [
  ['realtime', null],
  ['realtime with response.metadata naming events', { note: 'response.created', also: 'response.output_text.delta' }],
];
for (const [row, metadata] of REALTIME_ROWS)
for (const e of ENDINGS) {
  cell(`${row} × ${e}`, REALTIME[e], async () => {
    const k = await newKey();
    rt.usage = e === 'upstream without usage' ? ({} as typeof REALTIME_USAGE) : { ...REALTIME_USAGE };
    try {
      const s = await openRealtime(node.address, { key: k.key, model: 'rt-chat' });
      if (metadata) {
        s.session.send({ type: 'conversation.item.create', item: RT_ITEM });
        s.session.send({ type: 'response.create', response: { metadata } });
      } else s.session.say('Hello there');
      await s.session.waitFor('response.done');
      if (e === 'key revoked mid-stream' || e === 'org blocked mid-stream') {
        await endByGateway(e, k);
        await s.session.waitClosed();
      } else if (e === 'upstream error mid-stream') {
        s.session.send({ type: 'test.drop' });
        await s.session.waitClosed();
      } else {
        s.ws.close();
        await s.session.waitClosed();
      }
    } finally {
      rt.usage = { ...REALTIME_USAGE };
    }
    return k.keyId;
  });
}

// A realtime response in flight when the session ends: `response.created` and its deltas relayed, no
// `response.done`. Before the fix it was not billed at all; now it is billed the estimate at the end.
const IN_FLIGHT: Record<Ending, Cost> = {
  normal: { na: 'a response that completes is the "realtime" row' },
  'answer over 4 MiB': { na: 'realtime events are read one message at a time, whatever the session has sent' },
  'client abort before the head': { na: 'a realtime session has no head after its 101; see "abort mid-stream"' },
  'abort mid-stream': RT_ESTIMATE,
  'key revoked mid-stream': RT_ESTIMATE,
  'org blocked mid-stream': RT_ESTIMATE,
  'upstream error mid-stream': RT_ESTIMATE,
  'upstream without usage': { na: 'the response never ends upstream; its usage never comes' },
};
for (const e of ENDINGS) {
  cell(`realtime response in flight × ${e}`, IN_FLIGHT[e], async () => {
    const k = await newKey();
    rt.holdResponses = true;
    try {
      const s = await openRealtime(node.address, { key: k.key, model: 'rt-chat' });
      s.session.say('Hello there');
      await s.session.waitFor('response.output_text.delta', RT_DELTAS.length);
      if (e === 'key revoked mid-stream' || e === 'org blocked mid-stream') {
        await endByGateway(e, k);
        assert.equal(await s.session.waitClosed(), 1008);
      } else if (e === 'upstream error mid-stream') {
        s.session.send({ type: 'test.drop' });
        await s.session.waitClosed();
      } else {
        s.ws.terminate();
        await s.session.waitClosed();
      }
      assert.equal(s.session.count('response.done'), 0, 'the response was still in flight');
    } finally {
      rt.holdResponses = false;
    }
    return k.keyId;
  });
}

// Audio in flight: input audio appended and audio deltas relayed are audio tokens at the model's audio
// prices, at the documented conservative rate (8,000 bytes a second, 20 tokens a second): 16,000 bytes
// in are 40 tokens, 4,000 bytes out are 10. Before the fix this response was not billed at all.
cell('realtime audio response in flight × key revoked mid-stream', estimateTokens({ input: [RT_ITEM] }) * RT_IN + 40 * RT_AUDIO_IN + RT_DELTAS.reduce((n, d) => n + estimateTextTokens(d), 0) * RT_OUT + 10 * RT_AUDIO_OUT, async () => {
  const k = await newKey();
  rt.holdResponses = true;
  rt.audioDeltaBytes = 4_000;
  try {
    const s = await openRealtime(node.address, { key: k.key, model: 'rt-chat' });
    s.session.send({ type: 'input_audio_buffer.append', audio: Buffer.alloc(16_000, 1).toString('base64') });
    s.session.say('Hello there');
    await s.session.waitFor('response.output_audio.delta');
    await endByGateway('key revoked mid-stream', k);
    assert.equal(await s.session.waitClosed(), 1008);
  } finally {
    rt.holdResponses = false;
    rt.audioDeltaBytes = 0;
  }
  return k.keyId;
});

// A node draining with a response in flight: its deadline closes the session (1001), and the response
// is billed the estimate before the node's last report. Before the fix it was not billed at all.
cell('realtime response in flight × drain', RT_ESTIMATE, async () => {
  const k = await createKey(admin, { tier: 'matrix' });
  const draining = await startDataPlane(cp, { nodeId: 'matrix-drain', extraArgs: ['--drain-seconds', '1', '--report-every-ms', '0'] });
  await waitUntilKnown(draining.url, k.key);
  rt.holdResponses = true;
  try {
    const s = await openRealtime(draining.address, { key: k.key, model: 'rt-chat' });
    s.session.say('Hello there');
    await s.session.waitFor('response.output_text.delta', RT_DELTAS.length);
    const exited = draining.proc.kill('SIGTERM');
    assert.equal(await s.session.waitClosed(), 1001);
    assert.equal(await exited, 0);
  } finally {
    rt.holdResponses = false;
  }
  return k.keyId;
});
