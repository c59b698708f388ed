// Client IP derivation (data-plane/request/client-ip.ts): the socket peer, or, only when the peer is a
// trusted proxy, the right-most X-Forwarded-For hop that is not one; always in canonical form.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { canonicalIpv4, deriveClientIp } from '../../data-plane/request/client-ip.js';
import { formatIp, IpRangeSet, parseIp } from '../../proto/lib/ip.js';

const TRUSTED = IpRangeSet.parse(['10.0.0.0/8', 'fd00::/8', '127.0.0.1']);
const NONE = IpRangeSet.parse([]);

test('client IP: the right-most untrusted X-Forwarded-For hop, only behind a trusted peer', () => {
  // Before: trusted_proxies held exact strings, so ranges never matched and the IPv4-mapped form of a
  // trusted address (as uWS reports it on a dual-stack socket) was not trusted.
  // [peer as uWS reports it, X-Forwarded-For lines joined, trusted ranges, client IP]
  const rows: Array<[string, string, IpRangeSet, string]> = [
    // No trusted proxies: the peer, whatever the header says.
    ['203.0.113.7', '198.51.100.1', NONE, '203.0.113.7'],
    ['0000:0000:0000:0000:0000:ffff:cb00:7107', '198.51.100.1', NONE, '203.0.113.7'],
    ['0000:0000:0000:0000:0000:0000:0000:0001', '', NONE, '::1'],
    // An untrusted peer: its header is ignored.
    ['203.0.113.7', '198.51.100.1', TRUSTED, '203.0.113.7'],
    ['11.0.0.1', '198.51.100.1', TRUSTED, '11.0.0.1'],
    // A trusted peer (by range, in either form): the right-most hop that is not trusted.
    ['10.1.2.3', '198.51.100.1', TRUSTED, '198.51.100.1'],
    ['0000:0000:0000:0000:0000:ffff:0a01:0203', '198.51.100.1', TRUSTED, '198.51.100.1'],
    ['0000:0000:0000:0000:0000:ffff:7f00:0001', '198.51.100.1', TRUSTED, '198.51.100.1'],
    ['fd00:0000:0000:0000:0000:0000:0000:0009', '2001:DB8::7', TRUSTED, '2001:db8::7'],
    ['10.1.2.3', 'spoofed, 198.51.100.1', TRUSTED, '198.51.100.1'],
    ['10.1.2.3', '1.1.1.1, 198.51.100.1, 10.9.9.9', TRUSTED, '198.51.100.1'],
    ['10.1.2.3', '1.1.1.1, 198.51.100.1, ::ffff:10.9.9.9', TRUSTED, '198.51.100.1'],
    ['10.1.2.3', '1.1.1.1,198.51.100.1,,10.9.9.9 ', TRUSTED, '198.51.100.1'],
    // Hops in the forms proxies write: with a port, in brackets, IPv4-mapped.
    ['10.1.2.3', '198.51.100.1:4711', TRUSTED, '198.51.100.1'],
    ['10.1.2.3', '[2001:db8::7]:443', TRUSTED, '2001:db8::7'],
    ['10.1.2.3', '[2001:db8::7]', TRUSTED, '2001:db8::7'],
    ['10.1.2.3', '::ffff:198.51.100.1', TRUSTED, '198.51.100.1'],
    // Every hop is one of ours: the left-most.
    ['10.1.2.3', '10.0.0.5, 10.0.0.6', TRUSTED, '10.0.0.5'],
    // No header from a trusted peer: the peer itself.
    ['10.1.2.3', '', TRUSTED, '10.1.2.3'],
    ['10.1.2.3', ' , ', TRUSTED, '10.1.2.3'],
    // The hop next to a trusted one is not an address: the nearest address we can vouch for.
    ['10.1.2.3', '198.51.100.1, unknown', TRUSTED, '10.1.2.3'],
    ['10.1.2.3', '198.51.100.1, garbage, 10.0.0.5', TRUSTED, '10.0.0.5'],
    ['10.1.2.3', '198.51.100.1:99999x', TRUSTED, '10.1.2.3'],
  ];
  for (const [peer, xff, trusted, want] of rows) {
    assert.equal(
      deriveClientIp(peer, trusted, () => xff),
      want,
      `peer ${peer}, X-Forwarded-For ${JSON.stringify(xff)}`,
    );
  }
});

test('the X-Forwarded-For lines are read only when the peer is trusted', () => {
  let reads = 0;
  const xff = () => {
    reads++;
    return '198.51.100.1';
  };
  deriveClientIp('203.0.113.7', TRUSTED, xff);
  deriveClientIp('203.0.113.7', NONE, xff);
  assert.equal(reads, 0);
  deriveClientIp('10.0.0.1', TRUSTED, xff);
  assert.equal(reads, 1);
});

test('the IPv4 fast path accepts exactly the canonical dotted addresses, with the value parseIp reads', () => {
  const octet = fc.oneof(fc.integer({ min: 0, max: 300 }).map(String), fc.constantFrom('00', '01', '007', '255', '256', '', '1a', ' 1', '+1', '-1', '1e2'));
  const text = fc.oneof(
    fc.array(octet, { minLength: 1, maxLength: 6 }).map((parts) => parts.join('.')),
    fc.string({ unit: fc.constantFrom('0', '1', '2', '5', '9', '.', ':', 'a', ' '), maxLength: 17 }),
  );
  fc.assert(
    fc.property(text, (t) => {
      const v = canonicalIpv4(t);
      const w = parseIp(t);
      const canonical = w !== null && !t.includes(':') && formatIp(w) === t;
      assert.equal(v !== -1, canonical, t);
      if (v !== -1) assert.deepEqual([...w!], [0, 0, 0xffff, v], t);
    }),
    // A fixed seed: the same cases on every run.
    { numRuns: 3000, seed: 20261123 },
  );
  for (const t of ['0.0.0.0', '255.255.255.255', '10.0.0.1', '192.168.1.100']) assert.notEqual(canonicalIpv4(t), -1, t);
  for (const t of ['01.0.0.0', '1.2.3', '1.2.3.4.5', '256.0.0.1', '1.2.3.4 ', '1..2.3', '']) assert.equal(canonicalIpv4(t), -1, t);
});

test('a peer read once is read again for another trusted set', () => {
  // The peer's reading is kept between requests: it must follow a changed list of trusted proxies.
  assert.equal(deriveClientIp('10.1.2.3', TRUSTED, () => '203.0.113.9'), '203.0.113.9');
  assert.equal(deriveClientIp('10.1.2.3', IpRangeSet.parse(['192.0.2.0/24']), () => '203.0.113.9'), '10.1.2.3');
  assert.equal(deriveClientIp('10.1.2.3', TRUSTED, () => '203.0.113.9, 10.0.0.7'), '203.0.113.9');
});
