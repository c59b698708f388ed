// A fast OpenAI-compatible upstream for benchmarks, in its own process: answers every
// POST /v1/chat/completions with one fixed completion. Prints `upstream listening on PORT`.
import uWS from 'uWebSockets.js';

const body = JSON.stringify({
  id: 'chatcmpl-bench',
  object: 'chat.completion',
  created: 1,
  model: 'bench-upstream',
  choices: [{ index: 0, message: { role: 'assistant', content: 'Hello from the bench upstream.' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 9, completion_tokens: 7, total_tokens: 16 },
});

uWS
  .App()
  .any('/*', (res) => {
    res.onAborted(() => {});
    // Consume the request body, then answer.
    res.onData((_chunk, isLast) => {
      if (isLast) res.cork(() => res.writeStatus('200 OK').writeHeader('content-type', 'application/json').end(body));
    });
  })
  .listen('127.0.0.1', 0, (token) => {
    if (!token) process.exit(1);
    console.log(`upstream listening on ${uWS.us_socket_local_port(token)}`);
  });
