// The official `openai` npm client (v6) against a real node served by a real control plane.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import OpenAI from 'openai';
import { type DemoKey } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { type DataPlane } from '../helpers/processes.js';

let dp: DataPlane;
let key: DemoKey;
let client: OpenAI;

const gw = gatewayFixture({}, async () => {
  dp = gw.node;
  key = await gw.fundedKey();
  client = new OpenAI({ apiKey: key.key, baseURL: `${dp.url}/v1`, maxRetries: 0 });
});

test('models.list returns the models of the plan in OpenAI list format', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.deepEqual(ids, ['demo-chat', 'demo-embed', 'demo-transcribe', 'demo-speech', 'demo-realtime']);
  for (const m of page.data) {
    assert.equal(m.object, 'model');
    assert.equal(typeof m.created, 'number');
    assert.equal(typeof m.owned_by, 'string');
  }
});

test('chat completion from the demo provider with real token counts', async () => {
  const r = await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'Hello there, gateway!' }] });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'demo-chat');
  assert.match(r.choices[0].message.content ?? '', /Hello there, gateway!/);
  assert.equal(r.choices[0].finish_reason, 'stop');
  // "Hello there, gateway!" is Hello / there / , / gateway / ! = 5 tokens.
  assert.equal(r.usage?.prompt_tokens, 5);
  assert.ok((r.usage?.completion_tokens ?? 0) > 5);
  assert.equal(r.usage?.total_tokens, (r.usage?.prompt_tokens ?? 0) + (r.usage?.completion_tokens ?? 0));
});

test('streaming chat arrives in several chunks and the usage chunk only when asked', async () => {
  const stream = await client.chat.completions.create({
    model: 'demo-chat',
    stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'Tell me something' }],
  });
  let text = '';
  let chunks = 0;
  let usage: OpenAI.CompletionUsage | null | undefined;
  for await (const c of stream) {
    chunks++;
    text += c.choices[0]?.delta?.content ?? '';
    if (c.usage) usage = c.usage;
  }
  assert.ok(chunks >= 4, `expected several chunks, got ${chunks}`);
  assert.match(text, /Tell me something/);
  assert.equal(usage?.prompt_tokens, 3);

  const plain = await client.chat.completions.create({ model: 'demo-chat', stream: true, messages: [{ role: 'user', content: 'again' }] });
  for await (const c of plain) assert.equal(c.usage, undefined);
});

test('embeddings: one 64-dimensional unit vector per input', async () => {
  const r = await client.embeddings.create({ model: 'demo-embed', input: ['alpha beta', 'gamma'] });
  assert.equal(r.data.length, 2);
  for (const d of r.data) {
    assert.equal(d.embedding.length, 64);
    const norm = Math.sqrt(d.embedding.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-5);
  }
  assert.equal(r.usage.prompt_tokens, 3);
  const again = await client.embeddings.create({ model: 'demo-embed', input: 'alpha beta' });
  assert.deepEqual(again.data[0].embedding, r.data[0].embedding);
});

test('error classes see the status and message for 400, 401 and 404', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.status, 400);
      assert.match(err.message, /no-such-model/);
      assert.equal((err.error as any).param, 'model');
      return true;
    },
  );
  const bad = new OpenAI({ apiKey: 'sk-tollgate-notARealKey', baseURL: `${dp.url}/v1`, maxRetries: 0 });
  await assert.rejects(bad.models.list(), (err: unknown) => {
    assert.ok(err instanceof OpenAI.AuthenticationError);
    assert.equal(err.status, 401);
    assert.match(err.message, /Invalid API key/);
    return true;
  });
  await assert.rejects(client.get('/no/such/path'), (err: unknown) => {
    assert.ok(err instanceof OpenAI.NotFoundError);
    assert.equal(err.status, 404);
    assert.match(err.message, /No route/);
    return true;
  });
});

test('speech and voices and a transcription through the demo provider', async () => {
  const voices = await client.get<{ data: Array<{ id: string }> }>('/audio/voices');
  assert.deepEqual(voices.data.map((v) => v.id), ['alloy', 'echo', 'nova']);
  const speech = await client.audio.speech.create({ model: 'demo-speech', voice: 'echo', input: 'Hello world' });
  const wav = Buffer.from(await speech.arrayBuffer());
  assert.equal(wav.subarray(0, 4).toString(), 'RIFF');
  assert.equal(wav.readUInt32LE(40) + 44, wav.length);
  const audio = Buffer.alloc(100_000, 1);
  const t = await client.audio.transcriptions.create({ model: 'demo-transcribe', file: await OpenAI.toFile(audio, 'a.wav') });
  assert.match(t.text, /4 seconds of audio/);
});
