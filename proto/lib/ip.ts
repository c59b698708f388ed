// IP addresses and ranges, shared by the control plane (validating `trusted_proxies`) and the nodes
// (matching peers and X-Forwarded-For hops). Pure.
//
// Every address is held as its IPv6 form in four 32-bit words; an IPv4 address is held IPv4-mapped
// (::ffff:a.b.c.d), so `10.0.0.0/8` and `::ffff:10.0.0.0/104` are the same range and both match
// 10.1.2.3 however it is written (uWS reports peers of a dual-stack socket as
// `0000:…:ffff:0a01:0203`). node:net's BlockList matches the same way (the unit test checks it
// against this), but costs a native SocketAddress per check and gives no canonical text, which the
// edge budgets (one window per client) and the forwarded address need anyway.

/** Four 32-bit words of an address's IPv6 form, most significant first. */
export type IpWords = Uint32Array;

export interface IpRange {
  /** The network address, host bits zero. */
  readonly words: IpWords;
  /** Prefix length in the IPv6 space (an IPv4 /8 is 104). */
  readonly prefixLen: number;
}

const DEC_OCTET = /^(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]\d|\d)$/;
const HEX_GROUP = /^[0-9A-Fa-f]{1,4}$/;

function parseIpv4(text: string): number | null {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  let v = 0;
  for (const p of parts) {
    if (!DEC_OCTET.test(p)) return null;
    v = v * 256 + Number(p);
  }
  return v;
}

/** Up to 8 16-bit groups, or null. A trailing dotted IPv4 counts as two groups. */
function parseGroups(text: string): number[] | null {
  if (text === '') return [];
  const out: number[] = [];
  const parts = text.split(':');
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i];
    if (i === parts.length - 1 && p.includes('.')) {
      const v4 = parseIpv4(p);
      if (v4 === null) return null;
      out.push(v4 >>> 16, v4 & 0xffff);
    } else {
      if (!HEX_GROUP.test(p)) return null;
      out.push(parseInt(p, 16));
    }
  }
  return out;
}

function parseIpv6(text: string): IpWords | null {
  const gap = text.indexOf('::');
  let groups: number[];
  if (gap === -1) {
    const all = parseGroups(text);
    if (all === null || all.length !== 8) return null;
    groups = all;
  } else {
    if (text.indexOf('::', gap + 1) !== -1) return null;
    const head = parseGroups(text.slice(0, gap));
    const tail = parseGroups(text.slice(gap + 2));
    // `::` stands for at least one group; a dotted IPv4 may only end the address.
    if (head === null || tail === null || head.length + tail.length > 7 || text.slice(0, gap).includes('.')) return null;
    groups = [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
  }
  const w = new Uint32Array(4);
  for (let i = 0; i < 4; i++) w[i] = ((groups[2 * i] << 16) | groups[2 * i + 1]) >>> 0;
  return w;
}

/** An IPv4 or IPv6 address (no port, brackets or zone), or null. */
export function parseIp(text: string): IpWords | null {
  if (!text.includes(':')) {
    const v4 = parseIpv4(text);
    if (v4 === null) return null;
    return Uint32Array.of(0, 0, 0xffff, v4);
  }
  return parseIpv6(text);
}

function isMappedV4(w: IpWords): boolean {
  return w[0] === 0 && w[1] === 0 && w[2] === 0xffff;
}

/** Canonical text: dotted IPv4 for IPv4 and IPv4-mapped addresses, else RFC 5952 (lower case, longest zero run as `::`). */
export function formatIp(w: IpWords): string {
  if (isMappedV4(w)) return `${w[3] >>> 24}.${(w[3] >>> 16) & 255}.${(w[3] >>> 8) & 255}.${w[3] & 255}`;
  const g: number[] = [];
  for (let i = 0; i < 4; i++) g.push(w[i] >>> 16, w[i] & 0xffff);
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (g[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && g[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (from: number, to: number) => g.slice(from, to).map((x) => x.toString(16)).join(':');
  if (bestStart === -1) return hex(0, 8);
  return `${hex(0, bestStart)}::${hex(bestStart + bestLen, 8)}`;
}

/** The canonical text of an address in any form, or null if it is not one. */
export function canonicalIp(text: string): string | null {
  const w = parseIp(text);
  return w === null ? null : formatIp(w);
}

/**
 * The client an edge budget counts (docs/hardening.md): an IPv4 address is its own client; an IPv6
 * address counts as its /64, the smallest block a provider hands one subscriber (a host picks any of
 * its 2^64 interface addresses at will, so a budget per full address would be no budget). The text is
 * the /64's network in canonical form with `/64` (`2001:db8:1:2::/64`); IPv4 and IPv4-mapped
 * addresses are returned as given (callers pass canonical text, dotted for IPv4).
 */
export function edgeClientOf(ip: string): string {
  if (ip.indexOf(':') === -1) return ip;
  const w = parseIp(ip);
  if (w === null || isMappedV4(w)) return w === null ? ip : formatIp(w);
  return `${formatIp(Uint32Array.of(w[0], w[1], 0, 0))}/64`;
}

/** Bits of word `i` (0..3) that a prefix of `prefixLen` bits covers, as a mask. */
function maskOf(prefixLen: number, i: number): number {
  const bits = Math.min(32, Math.max(0, prefixLen - 32 * i));
  return bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
}

/** `10.0.0.0/8`, `fd00::/8`, or a single address; otherwise a short reason naming what is wrong. */
export function parseIpRange(text: string): IpRange | string {
  const slash = text.indexOf('/');
  const addrText = slash === -1 ? text : text.slice(0, slash);
  const words = parseIp(addrText);
  if (words === null) return 'not an IP address or CIDR range (like 10.0.0.0/8 or fd00::/8)';
  const v4 = !addrText.includes(':');
  const maxLen = v4 ? 32 : 128;
  let len = maxLen;
  if (slash !== -1) {
    const lenText = text.slice(slash + 1);
    if (!/^(?:0|[1-9]\d{0,2})$/.test(lenText) || Number(lenText) > maxLen) return `prefix length must be a whole number from 0 to ${maxLen}`;
    len = Number(lenText);
  }
  const prefixLen = v4 ? 96 + len : len;
  const net = new Uint32Array(4);
  for (let i = 0; i < 4; i++) net[i] = (words[i] & maskOf(prefixLen, i)) >>> 0;
  if (net.some((x, i) => x !== words[i])) {
    return `has host bits set below the /${len} prefix; write ${formatIp(net)}/${len}`;
  }
  return { words: net, prefixLen };
}

/** A set of ranges, matched against addresses in any form. Built once per config version. */
export class IpRangeSet {
  private constructor(private readonly ranges: readonly IpRange[]) {}

  /**
   * Parses a list of ranges. Throws on the first bad entry, naming it, unless `skipInvalid` (a node
   * taking a list its control plane already validated: an entry it cannot read trusts nothing).
   */
  static parse(list: readonly string[], opts: { skipInvalid?: boolean } = {}): IpRangeSet {
    const ranges: IpRange[] = [];
    for (const text of list) {
      const r = parseIpRange(text);
      if (typeof r === 'string') {
        if (opts.skipInvalid) continue;
        throw new Error(`${JSON.stringify(text)}: ${r}`);
      }
      ranges.push(r);
    }
    return new IpRangeSet(ranges);
  }

  get size(): number {
    return this.ranges.length;
  }

  has(w: IpWords): boolean {
    for (const r of this.ranges) {
      let hit = true;
      for (let i = 0; i < 4 && hit; i++) {
        const m = maskOf(r.prefixLen, i);
        if (m === 0) break;
        hit = ((w[i] & m) >>> 0) === r.words[i];
      }
      if (hit) return true;
    }
    return false;
  }

  /** Whether an address, in any form, is in the set; false for anything that is not an address. */
  hasText(text: string): boolean {
    const w = parseIp(text);
    return w !== null && this.has(w);
  }
}
