// The WebSocket close codes and reasons a realtime session sends.

/** Close codes the gateway uses (RFC 6455 §7.4 and the IANA registry). */
export const CLOSE = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  POLICY: 1008,
  INTERNAL: 1011,
  TRY_AGAIN_LATER: 1013,
  BAD_GATEWAY: 1014,
});

/** A code a server may send in a close frame (not 1005, 1006, 1015 or out of range). */
export function isSendableCode(code: number): boolean {
  return (code >= 1000 && code <= 1014 && code !== 1004 && code !== 1005 && code !== 1006) || (code >= 3000 && code <= 4999);
}

/** A close reason is at most 123 bytes of UTF-8. */
export function truncateReason(reason: string): string {
  if (Buffer.byteLength(reason) <= 123) return reason;
  const chars = [...reason];
  while (Buffer.byteLength(chars.join('')) > 123) chars.pop();
  return chars.join('');
}
