// What a realtime session relays to: one upstream conversation, either a WebSocket to an
// OpenAI-compatible realtime API (ws-upstream.ts) or the built-in demo model (demo-realtime.ts).
// The session drives it with these few calls and learns what it says through UpstreamEvents.

export interface UpstreamEvents {
  /** One message from the upstream (text unless `isBinary`). */
  message(data: Buffer, isBinary: boolean): void;
  /** The upstream ended the conversation (or was lost): a WebSocket close code and reason. */
  closed(code: number, reason: string): void;
}

export interface UpstreamLink {
  /** Sends one client message upstream. */
  send(data: Buffer, isBinary: boolean): void;
  /** Bytes accepted by `send` and not yet written to the upstream. */
  readonly bufferedAmount: number;
  /** Stop reading the upstream (its messages wait at the upstream) until `resume`. */
  pause(): void;
  resume(): void;
  /** Ends the conversation; no event follows. */
  close(code: number, reason: string): void;
  /** Who receives the upstream's messages; set once the client's socket is open. */
  events: UpstreamEvents | null;
}

/** Why an upstream could not be opened: rendered as the 502 the client gets before its upgrade. */
export class UpstreamRefused extends Error {}
