// The request-log entry of one realtime session (issue 9's request log): what the session was, how
// long it lasted, what crossed it and what it cost. Built when the session ends and handed to ONE
// function, `logSession` in the gateway's options: the seam where the node's request-log journal
// takes it. Money and tokens are NOT recorded through this entry: they go out as usage records per
// `response.done` (session.ts), so the organisation is charged while the session runs.

export interface RealtimeSessionLog {
  requestId: string;
  keyId: string;
  orgId: string;
  projectId: string;
  model: string;
  path: string;
  /** When the socket opened (ms since epoch, the node's clock). */
  startedAtMs: number;
  durationMs: number;
  messagesFromClient: number;
  messagesToClient: number;
  bytesFromClient: number;
  bytesToClient: number;
  /** `response.done` events billed. */
  responses: number;
  promptTokens: number;
  completionTokens: number;
  costMicros: number;
  /** The WebSocket close code and reason the client was given (or sent). */
  closeCode: number;
  closeReason: string;
}

export type SessionLogSink = (entry: RealtimeSessionLog) => void;
