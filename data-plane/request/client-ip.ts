// The client's address as the node determines it (docs/design.md#client-ip): the socket peer, or, only
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
  // A node sees few peers (its load balancers): the last one's reading is kept.
  if (peer !== lastPeer || trusted !== lastTrusted) {
    const peerWords = parseIp(peer);
    lastPeerText = peerWords === null ? peer : formatIp(peerWords);
    lastPeerTrusted = peerWords !== null && trusted.has(peerWords);
    lastPeer = peer;
    lastTrusted = trusted;
  }
  const peerText = lastPeerText;
  if (!lastPeerTrusted) return peerText;
  const hops = forwardedFor().split(',');
  // Walking from our side: each trusted hop vouches for the one to its left.
  let nearest = peerText;
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = hops[i].trim();
    if (hop === '') continue;
    // A dotted IPv4 address in canonical form (what proxies write) is its own canonical text.
    const v4 = canonicalIpv4(hop);
    const w = v4 === -1 ? parseHop(hop) : Uint32Array.of(0, 0, 0xffff, v4);
    // Not an address: the client is unknown past this point, so the last address we can vouch for.
    if (w === null) return nearest;
    const text = v4 === -1 ? formatIp(w) : hop;
    if (!trusted.has(w)) return text;
    nearest = text;
  }
  // Every hop is one of our proxies: the left-most.
  return nearest;
}

let lastPeer = '';
let lastTrusted: IpRangeSet | null = null;
let lastPeerText = '';
let lastPeerTrusted = false;

/**
 * The value of a dotted IPv4 address written canonically (four decimal octets 0–255, no leading
 * zeros: exactly the text formatIp gives back), else -1 (the caller parses it the general way).
 */
export function canonicalIpv4(text: string): number {
  const n = text.length;
  if (n < 7 || n > 15) return -1;
  let value = 0;
  let octet = 0;
  let digits = 0;
  let dots = 0;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 46 /* . */) {
      if (digits === 0 || dots === 3) return -1;
      value = value * 256 + octet;
      octet = 0;
      digits = 0;
      dots++;
    } else if (c >= 48 && c <= 57) {
      // A leading zero is allowed only as the whole octet.
      if (digits > 0 && octet === 0) return -1;
      octet = octet * 10 + (c - 48);
      if (octet > 255) return -1;
      digits++;
    } else {
      return -1;
    }
  }
  if (digits === 0 || dots !== 3) return -1;
  return value * 256 + octet;
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
  // One callback for every request (no closure made per request): forEach calls it synchronously.
  linesName = name;
  linesOut = '';
  req.forEach(collectLine);
  const out = linesOut;
  linesOut = '';
  return out;
}

let linesName = '';
let linesOut = '';
function collectLine(k: string, v: string): void {
  if (k === linesName) linesOut = linesOut === '' ? v : `${linesOut},${v}`;
}

/** headerLines of headers already copied from the request (as uWS gave them: lower-case names, in order). */
export function copiedHeaderLines(headers: ReadonlyArray<readonly [string, string]>, name: string): string {
  let out = '';
  for (const [k, v] of headers) if (k === name) out = out === '' ? v : `${out},${v}`;
  return out;
}
