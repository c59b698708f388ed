// How a realtime message goes to the client's uWS socket: corked, and never by uWS's direct write.
//
// uWS v20.30.0, the build this node runs (docs/design.md#dependencies), sends a message of 16 KiB or
// more that is not to be compressed, on a socket with nothing buffered, by writing it to the kernel at
// once (WebSocket::send's `us_socket_write2` path). That path is broken when the kernel does not
// take the whole frame:
// - a frame's payload can be lost behind its header (fixed upstream after this version,
//   uNetworking/uWebSockets pull request 1662): the client reads the next frames as its payload and
//   fails the connection on invalid UTF-8 (1007 at the node, 1006 at the client). Seen as a flaky
//   `realtime-node-memory` test, 532 of 800 chunks and then 1006, which stopped with this change.
// - when the send is made inside uWS's `drain` callback (a resumed upstream's messages can be), the
//   rest is buffered but uWS stops watching the socket for room: it is never written, and the client
//   waits forever for the end of the message (test/unit/data-plane-realtime-client-send.test.ts).
//
// The direct path is taken only for a message sent without compression. This node negotiates no
// compression (`compression: DISABLED`), so asking for it is ignored for the bytes (uWS checks the
// socket's compression status and sends them as they are) but takes the ordinary path, which
// buffers what the kernel does not take and watches the socket until it is written.
import type { WebSocket } from 'uWebSockets.js';

/** uWS's send status: 0 backpressure (buffered), 1 written, 2 dropped (past `maxBackpressure`). */
export type SendStatus = 0 | 1 | 2;

/**
 * Sends one message to a client socket (corked) by uWS's ordinary path; the socket must be open.
 * Returns uWS's status: 2 means the message was dropped.
 */
export function sendToClientSocket<T>(ws: WebSocket<T>, data: Uint8Array | string, isBinary: boolean): SendStatus {
  let status: SendStatus = 1;
  ws.cork(() => {
    // `true`: see the module's comment. No compression is negotiated, so none is applied.
    status = ws.send(data, isBinary, true) as SendStatus;
  });
  return status;
}
