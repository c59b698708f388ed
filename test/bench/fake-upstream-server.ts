// A fast OpenAI-compatible upstream and tool backend for benchmarks, in its own process. Prints
// `upstream listening on PORT`. It answers:
// - POST …/chat/completions: a ~400-byte JSON completion, or, when the body asks for `"stream":true`,
//   a 5-chunk SSE stream (then a usage chunk when `include_usage` is asked for, then `[DONE]`);
// - POST /idle/…/chat/completions: SSE headers and one event, then nothing until the client leaves
//   (the idle streams of the scale benchmark);
// - GET …/models: a model list (what the bare proxy and direct runs get for GET /v1/models);
// - anything else (tool pass-through): GET answers a small JSON object, a body is read to its end and
//   answered with its size.
import uWS, { type HttpResponse } from 'uWebSockets.js';

const json = JSON.stringify({
  id: 'chatcmpl-bench-0123456789abcdef',
  object: 'chat.completion',
  created: 1735689600,
  model: 'bench-upstream',
  system_fingerprint: 'fp_bench',
  choices: [
    {
      index: 0,
      message: { role: 'assistant', content: 'Hello from the bench upstream. This answer is about four hundred bytes long, like a short reply.', refusal: null },
      logprobs: null,
      finish_reason: 'stop',
    },
  ],
  usage: { prompt_tokens: 9, completion_tokens: 21, total_tokens: 30 },
});

const sseEvent = (delta: object, finish: string | null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1735689600, model: 'bench-upstream', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const sseChunks = [
  sseEvent({ role: 'assistant', content: '' }, null),
  sseEvent({ content: 'Hello' }, null),
  sseEvent({ content: ' from the' }, null),
  sseEvent({ content: ' bench upstream.' }, null),
  sseEvent({}, 'stop'),
];
const sseUsage = `data: ${JSON.stringify({ id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1735689600, model: 'bench-upstream', choices: [], usage: { prompt_tokens: 9, completion_tokens: 5, total_tokens: 14 } })}\n\n`;
const sseDone = 'data: [DONE]\n\n';

const models = JSON.stringify({ object: 'list', data: [{ id: 'bench-chat', object: 'model', created: 1735689600, owned_by: 'bench' }] });
const toolGet = JSON.stringify({ object: 'vector_store', id: 'vs_bench', name: 'bench', status: 'completed', file_counts: { total: 0 } });

let idle = 0;

function readBody(res: HttpResponse, done: (body: string, size: number) => void, keep: boolean): void {
  let size = 0;
  let text = '';
  res.onData((chunk, isLast) => {
    size += chunk.byteLength;
    if (keep) text += Buffer.from(chunk).toString();
    if (isLast) done(text, size);
  });
}

function chat(res: HttpResponse, body: string): void {
  if (!body.includes('"stream":true')) {
    res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'application/json').end(json));
    return;
  }
  const usage = body.includes('"include_usage":true');
  res.cork(() => {
    res.writeStatus('200 OK').writeHeader('content-type', 'text/event-stream').writeHeader('cache-control', 'no-cache');
    for (const c of sseChunks) res.write(c);
    if (usage) res.write(sseUsage);
    res.end(sseDone);
  });
}

uWS
  .App()
  .any('/*', (res, req) => {
    const url = req.getUrl();
    const method = req.getMethod();
    res.onAborted(() => {
      if (url.startsWith('/idle/')) idle--;
    });
    if (url.startsWith('/idle/')) {
      readBody(
        res,
        () => {
          idle++;
          res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'text/event-stream').write(sseChunks[0]));
        },
        false,
      );
      return;
    }
    if (url.endsWith('/chat/completions')) return readBody(res, (body) => chat(res, body), true);
    if (method === 'get' && url.endsWith('/models')) {
      res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'application/json').end(models));
      return;
    }
    if (method === 'get' || method === 'head') {
      res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'application/json').end(toolGet));
      return;
    }
    readBody(res, (_t, size) => res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'application/json').end(`{"object":"file","bytes":${size}}`)), false);
  })
  // How many idle streams are open (the scale benchmark checks every one reached the upstream).
  .get('/_idle', (res) => void res.cork(() => res.end(String(idle))))
  .listen('127.0.0.1', 0, (token) => {
    if (!token) process.exit(1);
    console.log(`upstream listening on ${uWS.us_socket_local_port(token)}`);
  });
