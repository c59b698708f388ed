// How realtime messages go to a client's socket (data-plane/realtime/client-send.ts), against the real
// uWS build the node runs: a sender that sends from uWS's `drain` callback whenever nothing is
// buffered, as a resumed upstream does, to a client that reads in bursts. Before, with a plain
// `send`, the stream stopped within the first few hundred messages (uWS's direct write left the rest
// of a message buffered and stopped watching the socket), or the client read garbage.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import uWS from 'uWebSockets.js';
import WebSocket from 'ws';
import { sendToClientSocket } from '../../data-plane/realtime/client-send.js';

const COUNT = 3000;
const MESSAGE_BYTES = 32 * 1024;

test('messages of 32 KiB sent from the drain callback to a client reading in bursts all arrive whole and in order', async () => {
  const pad = 'x'.repeat(MESSAGE_BYTES - 40);
  let sent = 0;
  // (Nothing may throw inside a uWS callback: a dropped message is recorded and asserted after.)
  let dropped = 0;
  const pump = (ws: uWS.WebSocket<unknown>) => {
    // Send while nothing is buffered for the client, as a session does once its upstream resumes.
    while (sent < COUNT && ws.getBufferedAmount() === 0) {
      if (sendToClientSocket(ws, JSON.stringify({ seq: sent, pad }), false) === 2) dropped++;
      sent++;
    }
  };
  let serverClose: number | null = null;
  const app = uWS.App().ws('/*', {
    maxPayloadLength: 1024 * 1024,
    maxBackpressure: 64 * 1024 * 1024,
    closeOnBackpressureLimit: 0,
    idleTimeout: 120,
    compression: uWS.DISABLED,
    open: (ws) => pump(ws),
    drain: (ws) => pump(ws),
    close: (_ws, code) => {
      serverClose = code;
    },
  });
  const listenSocket = await new Promise<uWS.us_listen_socket>((resolve, reject) =>
    app.listen('127.0.0.1', 0, (s) => (s ? resolve(s) : reject(new Error('could not listen')))),
  );
  const client = new WebSocket(`ws://127.0.0.1:${uWS.us_socket_local_port(listenSocket)}/`);
  let burst: NodeJS.Timeout | undefined;
  let giveUp: NodeJS.Timeout | undefined;
  try {
    const outcome = await new Promise<{ got: number; bad: string | null; closed: number | null }>((resolve) => {
      let got = 0;
      let bad: string | null = null;
      client.on('message', (data) => {
        let seq: unknown;
        try {
          seq = (JSON.parse(data.toString()) as { seq: unknown }).seq;
        } catch {
          seq = 'unparsable';
        }
        if (seq !== got) bad ??= `message ${got} was ${String(seq)}`;
        got++;
        if (got === COUNT) resolve({ got, bad, closed: null });
      });
      client.on('error', () => {});
      client.on('close', (code) => resolve({ got, bad, closed: code }));
      // Reads and pauses by turns, a millisecond each.
      let reading = true;
      client.on('open', () => {
        // The node negotiates no compression: the flag client-send.ts sets compresses nothing.
        if (client.extensions !== '') bad ??= `extensions negotiated: ${client.extensions}`;
        burst = setInterval(() => {
          reading = !reading;
          if (reading) client.resume();
          else client.pause();
        }, 1);
      });
      // A stream that stopped never completes: give up long after a working one is done (about 1 s).
      giveUp = setTimeout(() => resolve({ got, bad: bad ?? `stopped after ${got} of ${COUNT} (${sent} sent)`, closed: null }), 15_000);
    });
    assert.equal(outcome.bad, null);
    assert.equal(outcome.closed, null, `the client's socket closed (${outcome.closed}, node saw ${serverClose})`);
    assert.equal(outcome.got, COUNT);
    assert.equal(dropped, 0);
  } finally {
    clearInterval(burst);
    clearTimeout(giveUp);
    client.terminate();
    uWS.us_listen_socket_close(listenSocket);
  }
});
