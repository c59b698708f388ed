// A fake OpenAI-compatible realtime upstream (a `ws` WebSocketServer on loopback) for gateway tests.
// It records each connection's URL and headers, greets with session.created, and answers
// `response.create` with response.created, text deltas and response.done carrying the usage the test
// set. Test-only client events drive it: `test.spontaneous` begins a response without a
// response.create (as voice activity does), `test.flood` sends `count` messages of `bytes` bytes as fast
// as its socket takes them (recording how far it got), `test.drop` kills the connection without a
// close frame. `refuseWith` makes the handshake answer an HTTP status instead.
import { WebSocketServer, type WebSocket } from 'ws';
import type { AddressInfo } from 'node:net';
import type { IncomingMessage } from 'node:http';

export interface FakeRealtimeConnection {
  url: string;
  headers: IncomingMessage['headers'];
  socket: WebSocket;
  /** Client events received (parsed). */
  received: any[];
  /** Binary frames received (the fake answers none of them). */
  receivedBinary: Buffer[];
  /** Flood progress: messages handed to the socket so far. */
  floodSent: number;
  closed: boolean;
}

export interface FakeRealtimeUpstream {
  /** ws://127.0.0.1:PORT/v1/realtime */
  url: string;
  connections: FakeRealtimeConnection[];
  /** Usage reported in each response.done (details such as input_token_details are passed as given). */
  usage: { input_tokens: number; output_tokens: number; [detail: string]: unknown };
  /** True: a response is left in flight after its deltas (no response.done), as an upstream mid-answer. */
  holdResponses: boolean;
  /** Non-zero: each response also sends this many bytes of audio, base64, in one response.output_audio.delta. */
  audioDeltaBytes: number;
  /** Non-zero: refuse handshakes with this HTTP status. */
  refuseWith: number;
  /** True: handshakes wait (unanswered) until releaseHandshakes(). */
  holdHandshakes: boolean;
  /** Resolves once `n` handshakes are waiting. */
  waitForHeldHandshakes(n: number): Promise<void>;
  /** Lets every waiting handshake go on (stops holding new ones). */
  releaseHandshakes(): void;
  waitForConnection(n: number): Promise<FakeRealtimeConnection>;
  close(): Promise<void>;
}

export async function startFakeRealtimeUpstream(): Promise<FakeRealtimeUpstream> {
  const connections: FakeRealtimeConnection[] = [];
  let waiters: Array<() => void> = [];
  let held: Array<() => void> = [];
  let heldWaiters: Array<() => void> = [];
  const fake: FakeRealtimeUpstream = {
    url: '',
    connections,
    usage: { input_tokens: 10, output_tokens: 20 },
    holdResponses: false,
    audioDeltaBytes: 0,
    refuseWith: 0,
    holdHandshakes: false,
    waitForHeldHandshakes(n) {
      return new Promise((resolve) => {
        const check = () => {
          if (held.length >= n) {
            heldWaiters = heldWaiters.filter((w) => w !== check);
            resolve();
          }
        };
        heldWaiters.push(check);
        check();
      });
    },
    releaseHandshakes() {
      fake.holdHandshakes = false;
      const h = held;
      held = [];
      for (const go of h) go();
    },
    waitForConnection(n) {
      return new Promise((resolve) => {
        const check = () => {
          if (connections.length >= n) {
            waiters = waiters.filter((w) => w !== check);
            resolve(connections[n - 1]);
          }
        };
        waiters.push(check);
        check();
      });
    },
    close: () => new Promise((resolve) => {
      for (const c of connections) c.socket.terminate();
      wss.close(() => resolve());
    }),
  };
  const wss = new WebSocketServer({
    port: 0,
    host: '127.0.0.1',
    maxPayload: 64 * 1024 * 1024,
    verifyClient: (_info, cb) => {
      const answer = () => (fake.refuseWith ? cb(false, fake.refuseWith, 'refused by the fake upstream') : cb(true));
      if (!fake.holdHandshakes) return answer();
      held.push(answer);
      for (const w of [...heldWaiters]) w();
    },
  });
  await new Promise<void>((r) => wss.once('listening', () => r()));
  fake.url = `ws://127.0.0.1:${(wss.address() as AddressInfo).port}/v1/realtime`;
  let n = 0;
  wss.on('connection', (socket, req) => {
    const conn: FakeRealtimeConnection = { url: req.url ?? '', headers: req.headers, socket, received: [], receivedBinary: [], floodSent: 0, closed: false };
    connections.push(conn);
    for (const w of [...waiters]) w();
    const send = (ev: Record<string, unknown>) => socket.send(JSON.stringify({ event_id: `event_fake_${++n}`, ...ev }));
    socket.on('close', () => (conn.closed = true));
    socket.on('error', () => {});
    send({ type: 'session.created', session: { type: 'realtime', object: 'realtime.session', id: `sess_fake_${n}`, model: new URL(req.url ?? '/', 'ws://x').searchParams.get('model') } });
    socket.on('message', (data, isBinary) => {
      if (isBinary) return void conn.receivedBinary.push(Buffer.from(data as Buffer));
      const ev = JSON.parse(data.toString());
      conn.received.push(ev);
      // A create marked `response.metadata.reject` is refused with an error event naming the client
      // event's id and no response, as OpenAI refuses one while a response is active.
      if (ev.type === 'response.create' && ev.response?.metadata?.reject) {
        return send({ type: 'error', error: { type: 'invalid_request_error', code: 'conversation_already_has_active_response', message: 'Conversation already has an active response', param: null, event_id: ev.event_id ?? null } });
      }
      // `test.spontaneous`: a response the upstream begins on its own, as server voice activity does.
      if (ev.type === 'response.create' || ev.type === 'test.spontaneous') {
        const id = `resp_fake_${++n}`;
        // The client's response.metadata is echoed back in both events, as OpenAI does.
        const metadata = ev.response?.metadata ?? null;
        send({ type: 'response.created', response: { object: 'realtime.response', id, status: 'in_progress', output: [], metadata, usage: null } });
        for (const d of ['Hello ', 'from ', 'upstream.']) send({ type: 'response.output_text.delta', response_id: id, item_id: 'item_1', output_index: 0, content_index: 0, delta: d });
        if (fake.audioDeltaBytes > 0) send({ type: 'response.output_audio.delta', response_id: id, item_id: 'item_1', output_index: 0, content_index: 0, delta: Buffer.alloc(fake.audioDeltaBytes, 7).toString('base64') });
        if (fake.holdResponses) return;
        const usage = { ...fake.usage, total_tokens: fake.usage.input_tokens + fake.usage.output_tokens };
        send({ type: 'response.done', response: { object: 'realtime.response', id, status: 'completed', output: [], metadata, usage } });
      } else if (ev.type === 'test.flood') {
        const payload = 'x'.repeat(Math.max(0, ev.bytes - 64));
        const pump = () => {
          // As fast as the socket takes them: stop while ws holds more than 8 MiB unsent.
          while (conn.floodSent < ev.count && socket.readyState === socket.OPEN) {
            if (socket.bufferedAmount > 8 * 1024 * 1024) return void setTimeout(pump, 5);
            socket.send(JSON.stringify({ type: 'test.chunk', seq: conn.floodSent, pad: payload }));
            conn.floodSent++;
          }
        };
        pump();
      } else if (ev.type === 'test.big') {
        socket.send(JSON.stringify({ type: 'test.big', pad: 'x'.repeat(ev.bytes) }));
      } else if (ev.type === 'test.drop') {
        socket.terminate();
      }
    });
  });
  return fake;
}
