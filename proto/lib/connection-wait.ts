// How long a client waits for a control plane's connection to be made before it tries another
// address: grpc-js itself waits for ever on a peer that takes the connection and never answers (a
// machine gone, not a process), so a node or the CLI given several addresses tried no other
// (docs/design.md#several-control-planes-on-one-database).
import { connectivityState, type ChannelInterface } from '@grpc/grpc-js';

/** The longest wait for one address's connection to be made. */
export const CONNECT_TIMEOUT_MS = 2_000;

/**
 * `done(true)` once the channel is connected, or its connection failed (a call then fails at once
 * with the reason, as it always did); `done(false)` if it is still being made after `timeoutMs`.
 */
export function whenConnectionSettled(channel: ChannelInterface, timeoutMs: number, done: (settled: boolean) => void): void {
  // grpc-js deadlines are on the wall clock.
  const deadline = Date.now() + timeoutMs;
  const check = (): void => {
    const state = channel.getConnectivityState(true);
    if (state === connectivityState.READY || state === connectivityState.TRANSIENT_FAILURE || state === connectivityState.SHUTDOWN) return done(true);
    channel.watchConnectivityState(state, deadline, (err) => (err ? done(false) : check()));
  };
  check();
}
