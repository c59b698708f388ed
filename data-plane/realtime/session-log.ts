// The request-log entry of one realtime session (issue 9's request log): what the session was, how
// long it lasted, what crossed it and what it cost. Built when the session ends and handed to ONE
// function, `logSession` in the gateway's options: the seam where the node's request-log journal
// takes it. Money and tokens are NOT recorded through this entry: they go out as usage records per
// `response.done` (session.ts), so the organisation is charged while the session runs.

import type { LogRow } from '../../proto/lib/log-columns.js';

export interface RealtimeSessionLog {
  requestId: string;
  keyId: string;
  orgId: string;
  projectId: string;
  model: string;
  path: string;
  clientIp: string;
  userAgent: string;
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

/**
 * The session as one request-log row: GET on the realtime path with status 101, its duration as the
 * latency, bytes each way, the tokens and cost of all its responses, and the close code as the reason.
 */
export function sessionLogRow(e: RealtimeSessionLog): LogRow {
  return {
    requestId: e.requestId,
    atMs: e.startedAtMs,
    keyId: e.keyId,
    projectId: e.projectId,
    orgId: e.orgId,
    clientIp: e.clientIp,
    userAgent: e.userAgent,
    method: 'GET',
    path: e.path,
    status: 101,
    latencyUs: e.durationMs * 1000,
    bytesIn: e.bytesFromClient,
    bytesOut: e.bytesToClient,
    model: e.model,
    promptTokens: e.promptTokens,
    completionTokens: e.completionTokens,
    costMicros: e.costMicros,
    reason: e.closeCode === 1000 || e.closeCode === 1005 ? '' : `ws_close_${e.closeCode}${e.closeReason ? `: ${e.closeReason.slice(0, 100)}` : ''}`,
    keyPrefix: '',
  };
}
