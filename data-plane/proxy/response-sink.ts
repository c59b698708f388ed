// What proxy/ writes an answer into: the one response of one request. request/reply.ts `Reply`
// implements it over a uWebSockets.js response and keeps every uWS lifetime rule behind it, so
// providers, tool routing and stream-proxy.ts never see uWS and never import request/reply.ts
// (docs/design.md#the-response-sink).
//
// The contract a writer keeps: check `done` before producing (the client may be gone); after
// `headersSent` the status is fixed; `write` returning false means stop producing until `onDrain`.
import type { RecognizedString } from 'uWebSockets.js';
import type { ErrorShape } from '../error-shapes.js';

export type HeaderList = ReadonlyArray<readonly [string, string]>;

export interface ResponseSink {
  /** True once nothing more may be written (the client went away, or the answer ended). */
  readonly done: boolean;
  /** Whether status and headers went out (after that the status is fixed). */
  readonly headersSent: boolean;
  /** The request's id (`x-request-id`), for ids the answer carries. */
  readonly requestId: string;
  /** When the upstream call began (performance.now(); 0: none), for the latency metrics. */
  upstreamAt: number;
  /** Set before answering or closing because the upstream failed (metrics). */
  upstreamError: boolean;
  /** A whole answer at once. */
  send(status: number, headers: HeaderList | null, body: RecognizedString, closeConnection?: boolean): void;
  /**
   * The error shape of the path this answers (its family's; the gateway's for a path with no route).
   * sendError answers in it, unless the error's code has a shape of its own (error-shapes.ts errorShape).
   */
  readonly shape: ErrorShape;
  /** An error, in the shape error-shapes.ts errorShape picks (and renders). */
  sendError(err: unknown, closeConnection?: boolean): void;
  /** Starts a streamed answer: status and headers go out with its first chunk (totalSize ≥ 0: a known length). */
  startStream(status: number, headers: HeaderList, totalSize?: number): void;
  /** One chunk; false under backpressure (stop until `onDrain`). */
  write(chunk: Uint8Array | string): boolean;
  /** Calls `cb` once after a write returned false and the client took the data. */
  onDrain(cb: () => void): void;
  /** Ends a streamed answer, optionally with a last chunk. */
  end(chunk?: Uint8Array | string): void;
  /** Force-closes the connection (a stream that failed after its head). */
  close(): void;
}
