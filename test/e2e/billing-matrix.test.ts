// The billing conformance matrix (docs/billing-endings.md): every model endpoint × every way a
// request ends, against fake upstreams with known usage, asserting the micro-dollars the request log
// recorded for that one request. One key per cell, so each cell's row is its own. A new endpoint is
// one entry of ENDPOINTS; a new ending is one entry of ENDINGS and one case in `BillingMatrix.run`
// (test/helpers/billing-matrix.ts: the prices, the endings, the cell runner and the cost arithmetic).
//
// Before the fixes of the billing issue: a key revoked (or its organisation blocked) before the
// upstream answered was billed $0 while the upstream ran on; a client that left early was billed the
// words of its messages only; a transcription without an upstream `duration` was billed bytes / 32,000
// seconds.
import assert from 'node:assert/strict';
import { createKey } from '../helpers/console.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { openRealtime } from '../helpers/realtime.js';
import { CANCEL_USAGE } from '../helpers/fake-background-responses.js';
import { USAGE } from '../helpers/fake-responses-upstream.js';
import { startDataPlane } from '../helpers/processes.js';
import { estimateTextTokens, estimateTokens } from '../../data-plane/proxy/tokens.js';
import {
  BillingMatrix,
  chatCost,
  EMBED_USAGE,
  ENDINGS,
  IN,
  OUT,
  PER_CHAR,
  REALTIME_USAGE,
  RESPONSE,
  RT_AUDIO_IN,
  RT_AUDIO_OUT,
  RT_DELTAS,
  RT_ESTIMATE,
  RT_IN,
  RT_ITEM,
  RT_OUT,
  transcription,
  type Cost,
  type Ending,
  type HttpEndpoint,
} from '../helpers/billing-matrix.js';
import { addReportedPriceRows } from '../helpers/billing-matrix-prices.js';

/**
 * Cells whose fix belongs to the usage readers (issue 20, deliver 1: JSON and SSE usage at any size;
 * realtime events told apart by type), another branch. They run, and are expected to fail until that
 * branch is merged: the integrator empties this list then. A cell listed here that passes fails the
 * test, so the list cannot go stale silently.
 */
const NEEDS_READERS: readonly string[] = [];

const chatMessages = [
  { role: 'system', content: 'You answer in one short sentence.' },
  { role: 'user', content: [{ type: 'text', text: 'What is in this picture?' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=', detail: 'low' } }] },
];
const chatTools = [{ type: 'function', function: { name: 'lookup', description: 'Looks a thing up', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];

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

const matrix = new BillingMatrix(NEEDS_READERS);

for (const ep of ENDPOINTS) {
  for (const e of ENDINGS) {
    const body = ep.body();
    matrix.cell(`${ep.name} × ${e}`, ep.expected(e, body), async () => {
      const k = await matrix.newKey();
      await matrix.run(ep, e, k);
      return k.keyId;
    });
  }
}

// Realtime: one session per cell; each `response.done` is billed as it passes.
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
  matrix.cell(`${row} × ${e}`, REALTIME[e], async () => {
    const k = await matrix.newKey();
    matrix.rt.usage = e === 'upstream without usage' ? ({} as typeof REALTIME_USAGE) : { ...REALTIME_USAGE };
    try {
      const s = await openRealtime(matrix.node.address, { key: k.key, model: 'rt-chat', diagnose: matrix.nodeTail });
      if (metadata) {
        s.session.send({ type: 'conversation.item.create', item: RT_ITEM });
        s.session.send({ type: 'response.create', response: { metadata } });
      } else s.session.say('Hello there');
      await s.session.waitFor('response.done');
      if (e === 'key revoked mid-stream' || e === 'org blocked mid-stream') {
        await matrix.endByGateway(e, k);
        await s.session.waitClosed();
      } else if (e === 'upstream error mid-stream') {
        s.session.send({ type: 'test.drop' });
        await s.session.waitClosed();
      } else {
        s.ws.close();
        await s.session.waitClosed();
      }
    } finally {
      matrix.rt.usage = { ...REALTIME_USAGE };
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
  matrix.cell(`realtime response in flight × ${e}`, IN_FLIGHT[e], async () => {
    const k = await matrix.newKey();
    matrix.rt.holdResponses = true;
    try {
      const s = await openRealtime(matrix.node.address, { key: k.key, model: 'rt-chat', diagnose: matrix.nodeTail });
      s.session.say('Hello there');
      await s.session.waitFor('response.output_text.delta', RT_DELTAS.length);
      if (e === 'key revoked mid-stream' || e === 'org blocked mid-stream') {
        await matrix.endByGateway(e, k);
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
      matrix.rt.holdResponses = false;
    }
    return k.keyId;
  });
}

// Audio in flight: input audio appended and audio deltas relayed are audio tokens at the model's audio
// prices, at the documented conservative rate (8,000 bytes a second, 20 tokens a second): 16,000 bytes
// in are 40 tokens, 4,000 bytes out are 10. Before the fix this response was not billed at all.
matrix.cell('realtime audio response in flight × key revoked mid-stream', estimateTokens({ input: [RT_ITEM] }) * RT_IN + 40 * RT_AUDIO_IN + RT_DELTAS.reduce((n, d) => n + estimateTextTokens(d), 0) * RT_OUT + 10 * RT_AUDIO_OUT, async () => {
  const k = await matrix.newKey();
  matrix.rt.holdResponses = true;
  matrix.rt.audioDeltaBytes = 4_000;
  try {
    const s = await openRealtime(matrix.node.address, { key: k.key, model: 'rt-chat', diagnose: matrix.nodeTail });
    s.session.send({ type: 'input_audio_buffer.append', audio: Buffer.alloc(16_000, 1).toString('base64') });
    s.session.say('Hello there');
    await s.session.waitFor('response.output_audio.delta');
    await matrix.endByGateway('key revoked mid-stream', k);
    assert.equal(await s.session.waitClosed(), 1008);
  } finally {
    matrix.rt.holdResponses = false;
    matrix.rt.audioDeltaBytes = 0;
  }
  return k.keyId;
});

// A node draining with a response in flight: its deadline closes the session (1001), and the response
// is billed the estimate before the node's last report. Before the fix it was not billed at all.
matrix.cell('realtime response in flight × drain', RT_ESTIMATE, async () => {
  const k = await createKey(matrix.admin, { tier: 'matrix' });
  const draining = await startDataPlane(matrix.cp, { nodeId: 'matrix-drain', extraArgs: ['--drain-seconds', '1', '--report-every-ms', '0'] });
  await waitUntilKnown(draining.url, k.key);
  matrix.rt.holdResponses = true;
  try {
    const s = await openRealtime(draining.address, { key: k.key, model: 'rt-chat', diagnose: matrix.nodeTail });
    s.session.say('Hello there');
    await s.session.waitFor('response.output_text.delta', RT_DELTAS.length);
    const exited = draining.proc.kill('SIGTERM');
    assert.equal(await s.session.waitClosed(), 1001);
    assert.equal(await exited, 0);
  } finally {
    matrix.rt.holdResponses = false;
  }
  return k.keyId;
});

// Background responses (`POST /v1/responses` with `background: true`; issue 32): answered `queued`
// without usage, followed by the node to their end upstream and billed once from the final usage.
// Before the fix every cell here was billed the create's input estimate (a few tokens). The fake's
// response runs until the cell finishes it; its usage is the Responses fake's USAGE (no cached price
// on up-responses: all input at IN), a cancelled one's CANCEL_USAGE.
const BG_BODY = { model: 'up-responses', input: 'Think about otters, slowly.', background: true };
const BG_USAGE = USAGE.input_tokens * IN + USAGE.output_tokens * OUT;
const BG_CANCELLED = CANCEL_USAGE.input_tokens * IN + CANCEL_USAGE.output_tokens * OUT;
/** A terminal response without usage: the input estimate and its output text counted. */
const bgEstimate = (body: Record<string, unknown>) => estimateTokens(body) * IN + estimateTextTokens('Upstream says hello.') * OUT;
const BACKGROUND: Record<'JSON' | 'SSE', Record<Ending, Cost>> = {
  JSON: {
    normal: BG_USAGE,
    // The terminal object the node polls holds 5 MiB of output before its usage.
    'answer over 4 MiB': BG_USAGE,
    'client abort before the head': { na: 'the `queued` answer comes at once; a client that leaves after it is the "normal" cell (the response runs on, followed)' },
    'abort mid-stream': { na: 'the `queued` answer is one small piece' },
    'key revoked mid-stream': BG_CANCELLED,
    'org blocked mid-stream': BG_CANCELLED,
    'upstream error mid-stream': { na: 'the `queued` answer is one small piece; its stream is the SSE row' },
    'upstream without usage': bgEstimate(BG_BODY),
  },
  SSE: {
    normal: BG_USAGE,
    'answer over 4 MiB': { na: 'the terminal object a node polls is the JSON row' },
    'client abort before the head': { na: 'the stream starts at once; a client leaving mid-stream is "abort mid-stream"' },
    'abort mid-stream': BG_USAGE,
    'key revoked mid-stream': BG_CANCELLED,
    'org blocked mid-stream': BG_CANCELLED,
    'upstream error mid-stream': BG_USAGE,
    'upstream without usage': bgEstimate({ ...BG_BODY, stream: true }),
  },
};

/** Reads an SSE answer until `until` is in it, or to its end (null, or the stream closed). */
async function sseUntil(res: Response, until: string | null): Promise<string> {
  const reader = res.body!.getReader();
  let text = '';
  try {
    while (until === null || !text.includes(until)) {
      const r = await reader.read();
      if (r.done) break;
      text += Buffer.from(r.value).toString();
    }
  } catch {
    // cut: what arrived is the answer
  }
  reader.releaseLock();
  return text;
}

for (const row of ['JSON', 'SSE'] as const) {
  for (const e of ENDINGS) {
    matrix.cell(`background response ${row} × ${e}`, BACKGROUND[row][e], async () => {
      const k = await matrix.newKey();
      const bg = matrix.rsp.background;
      matrix.rsp.setMode(e === 'answer over 4 MiB' ? 'big-json' : 'normal');
      bg.noUsage = e === 'upstream without usage';
      bg.cutCreateStream = e === 'upstream error mid-stream';
      try {
        const ac = new AbortController();
        const res = await fetch(`${matrix.node.url}/v1/responses`, {
          method: 'POST',
          headers: { authorization: `Bearer ${k.key}`, 'content-type': 'application/json' },
          body: JSON.stringify(row === 'SSE' ? { ...BG_BODY, stream: true } : BG_BODY),
          signal: ac.signal,
        });
        assert.equal(res.status, 200);
        let id: string;
        if (row === 'JSON') {
          const queued = await res.json();
          assert.equal(queued.status, 'queued');
          id = queued.id;
        } else {
          id = /"id":"(resp_[0-9a-f]+)"/.exec(await sseUntil(res, 'response.output_text.delta'))![1];
        }
        if (e === 'key revoked mid-stream' || e === 'org blocked mid-stream') {
          await matrix.endByGateway(e, k);
          // The node cancels the running response upstream and bills what the cancel reports.
          return k.keyId;
        }
        if (e === 'abort mid-stream') {
          ac.abort();
          // Finished only once the node let go of the create stream (after its read-on): only following sees the end.
          await eventually(async () => bg.streamsOpen(id) === 0, 'the node let go of the create stream');
        }
        bg.finish(id);
        if (row === 'SSE' && e !== 'abort mid-stream') await sseUntil(res, null);
      } finally {
        matrix.rsp.setMode('normal');
        bg.noUsage = false;
        bg.cutCreateStream = false;
      }
      return k.keyId;
    });
  }
}

// A node draining while it follows a background response: it follows on for its drain time, then bills
// the response safely above what it could use (the input estimate plus its max_output_tokens) before
// its last report; the response runs on upstream. Before the fix: the input estimate only.
const BG_DRAIN_BODY = { ...BG_BODY, max_output_tokens: 100 };
matrix.cell('background response JSON × drain', estimateTokens(BG_DRAIN_BODY) * IN + 100 * OUT, async () => {
  const k = await createKey(matrix.admin, { tier: 'matrix' });
  const draining = await startDataPlane(matrix.cp, { nodeId: 'matrix-bg-drain', extraArgs: ['--drain-seconds', '1', '--report-every-ms', '0'] });
  await waitUntilKnown(draining.url, k.key);
  const res = await fetch(`${draining.url}/v1/responses`, { method: 'POST', headers: { authorization: `Bearer ${k.key}`, 'content-type': 'application/json' }, body: JSON.stringify(BG_DRAIN_BODY) });
  assert.equal((await res.json()).status, 'queued');
  assert.equal(await draining.proc.kill('SIGTERM'), 0);
  return k.keyId;
});

// Turns on a Responses WebSocket (`/v1/responses?model=up-responses`; issue 32): each response.create
// is a request admitted and billed on its own, from its final event's usage, or, ended without it, its
// input estimate and the output that passed. Before the fix a cut turn billed 0 input tokens for a
// top-level string input (OpenAI's own shape).
const TURN = { type: 'response.create', model: 'up-responses', input: 'Think about otters, slowly.' };
const TURN_CUT = estimateTokens(TURN) * IN + estimateTextTokens('hi') * OUT;
const SOCKET_TURN: Record<Ending, Cost> = {
  normal: BG_USAGE,
  'answer over 4 MiB': { na: 'socket events are read one message at a time, whatever the response has sent' },
  'client abort before the head': { na: 'a socket has no head after its 101; see "abort mid-stream"' },
  'abort mid-stream': TURN_CUT,
  'key revoked mid-stream': TURN_CUT,
  'org blocked mid-stream': TURN_CUT,
  'upstream error mid-stream': TURN_CUT,
  'upstream without usage': TURN_CUT,
};
for (const e of ENDINGS) {
  matrix.cell(`responses socket turn × ${e}`, SOCKET_TURN[e], async () => {
    const k = await matrix.newKey();
    const mode = e === 'normal' ? 'normal' : e === 'upstream without usage' ? 'no-usage' : e === 'upstream error mid-stream' ? 'drop' : 'hold';
    matrix.rsp.setSocketMode(mode);
    try {
      const s = await openRealtime(matrix.node.address, { key: k.key, model: 'up-responses', path: '/v1/responses', diagnose: matrix.nodeTail });
      s.session.send(TURN);
      await s.session.waitFor('response.output_text.delta');
      if (e === 'key revoked mid-stream' || e === 'org blocked mid-stream') {
        await matrix.endByGateway(e, k);
        assert.equal(await s.session.waitClosed(), 1008);
      } else if (e === 'abort mid-stream') {
        s.ws.terminate();
        await s.session.waitClosed();
      } else if (e === 'upstream error mid-stream') {
        await s.session.waitClosed();
      } else {
        await s.session.waitFor('response.completed');
        s.ws.close(1000);
        await s.session.waitClosed();
      }
    } finally {
      matrix.rsp.setSocketMode('normal');
    }
    return k.keyId;
  });
}

// Prices by what the upstream reports (issue 34): tiers as reported, a long prompt, each built-in tool call.
addReportedPriceRows(matrix);
