// The client's address as the node determines it (design.md, client IP): the socket peer, or, only
// when the peer is a trusted proxy, the right-most X-Forwarded-For hop that is not a trusted proxy.
// Always in canonical text (proto/lib/ip.ts), so one client has one edge window however it is written,
// and that text is the one X-Forwarded-For a tool backend receives. Pure.
import { formatIp, parseIp, type IpRangeSet, type IpWords } from '../../proto/lib/ip.js';

/**
 * `peer` is the remote address as uWS reports it; `forwardedFor` returns every X-Forwarded-For line of
 * the request joined with commas, and is called only when the peer is trusted.
 */
export function deriveClientIp(peer: string, trusted: IpRangeSet, forwardedFor: () => string): string {
  // The common case: no proxies configured, an IPv4 peer, which uWS already writes canonically.
  if (trusted.size === 0 && !peer.includes(':')) return peer;
  const peerWords = parseIp(peer);
  if (peerWords === null) return peer;
  const peerText = formatIp(peerWords);
  if (!trusted.has(peerWords)) return peerText;
  const hops = forwardedFor().split(',');
  // Walking from our side: each trusted hop vouches for the one to its left.
  let nearest = peerText;
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = hops[i].trim();
    if (hop === '') continue;
    const w = parseHop(hop);
    // Not an address: the client is unknown past this point, so the last address we can vouch for.
    if (w === null) return nearest;
    const text = formatIp(w);
    if (!trusted.has(w)) return text;
    nearest = text;
  }
  // Every hop is one of our proxies: the left-most.
  return nearest;
}

/** A hop as proxies write it: `1.2.3.4`, `1.2.3.4:port`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:port`. */
function parseHop(hop: string): IpWords | null {
  if (hop.charCodeAt(0) === 91 /* [ */) {
    const end = hop.indexOf(']');
    if (end === -1) return null;
    const rest = hop.slice(end + 1);
    if (rest !== '' && !/^:\d{1,5}$/.test(rest)) return null;
    return parseIp(hop.slice(1, end));
  }
  const colon = hop.indexOf(':');
  if (colon !== -1 && hop.indexOf(':', colon + 1) === -1) {
    // One colon: IPv4 with a port.
    if (!/^\d{1,5}$/.test(hop.slice(colon + 1))) return null;
    return parseIp(hop.slice(0, colon));
  }
  return parseIp(hop);
}

/** Every value of a header, all lines joined with commas (uWS getHeader returns only the first line). */
export function headerLines(req: { forEach(cb: (key: string, value: string) => void): void }, name: string): string {
  let out = '';
  req.forEach((k, v) => {
    if (k === name) out = out === '' ? v : `${out},${v}`;
  });
  return out;
}
