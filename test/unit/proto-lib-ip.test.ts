// IP addresses and ranges (proto/lib/ip.ts): parsing, one canonical text per address, and range
// matching across IPv4 and IPv4-mapped IPv6 forms, checked against node:net's BlockList.
import assert from 'node:assert/strict';
import { BlockList } from 'node:net';
import { test } from 'node:test';
import { canonicalIp, edgeClientOf, IpRangeSet, parseIpRange } from '../../proto/lib/ip.js';

test('every form of an address has one canonical text', () => {
  const rows: Array<[string, string | null]> = [
    ['127.0.0.1', '127.0.0.1'],
    ['0.0.0.0', '0.0.0.0'],
    ['255.255.255.255', '255.255.255.255'],
    // uWS reports peers of a dual-stack socket in this long form.
    ['0000:0000:0000:0000:0000:ffff:7f00:0001', '127.0.0.1'],
    ['::ffff:127.0.0.1', '127.0.0.1'],
    ['::FFFF:7F00:1', '127.0.0.1'],
    ['0000:0000:0000:0000:0000:0000:0000:0001', '::1'],
    ['::1', '::1'],
    ['::', '::'],
    ['2001:DB8:0:0:0:0:0:1', '2001:db8::1'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'],
    ['2001:0db8:0000:0000:0000:0000:0002:0001', '2001:db8::2:1'],
    ['2001:db8::0:1', '2001:db8::1'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2:3:4:5:6'],
    ['2001:db8:0:1:2:3:4:5', '2001:db8:0:1:2:3:4:5'],
    ['fd00::', 'fd00::'],
    ['1::', '1::'],
    ['::1.2.3.4', '::102:304'],
    ['64:ff9b::10.1.2.3', '64:ff9b::a01:203'],
    // Not addresses.
    ['', null],
    ['localhost', null],
    ['1.2.3', null],
    ['1.2.3.4.5', null],
    ['256.1.1.1', null],
    ['01.2.3.4', null],
    ['1.2.3.4 ', null],
    ['1.2.3.-4', null],
    ['1.2.3.4:80', null],
    ['::1::', null],
    ['1:2:3:4:5:6:7:8:9', null],
    ['1:2:3:4:5:6:7', null],
    [':1:2:3:4:5:6:7', null],
    ['12345::1', null],
    ['fe80::1%eth0', null],
    ['::ffff:1.2.3', null],
    ['g::1', null],
    ['[::1]', null],
  ];
  for (const [text, want] of rows) assert.equal(canonicalIp(text), want, JSON.stringify(text));
});

test('ranges: CIDR or a single address, IPv4 or IPv6; anything else names what is wrong', () => {
  const ok = ['10.0.0.0/8', '10.1.2.3', '10.1.2.3/32', '0.0.0.0/0', 'fd00::/8', '::/0', '2001:db8::1', '::ffff:10.0.0.0/104', '::ffff:10.1.2.3'];
  for (const t of ok) assert.equal(typeof parseIpRange(t), 'object', t);
  const bad: Array<[string, RegExp]> = [
    ['10.1.2.3/8', /host bits.*10\.0\.0\.0\/8/],
    ['fd00::1/8', /host bits.*fd00::\/8/],
    ['10.0.0.0/33', /prefix length/],
    ['fd00::/129', /prefix length/],
    ['10.0.0.0/', /prefix length/],
    ['10.0.0.0/08', /prefix length/],
    ['10.0.0.0/-1', /prefix length/],
    ['proxy.internal', /not an IP address/],
    ['10.0.0.0/8/9', /not an IP address|prefix length/],
    ['', /not an IP address/],
  ];
  for (const [t, want] of bad) {
    const r = parseIpRange(t);
    assert.equal(typeof r, 'string', t);
    assert.match(r as string, want, t);
  }
});

// [range, address, matches]
const MATCHES: Array<[string, string, boolean]> = [
  ['10.0.0.0/8', '10.1.2.3', true],
  ['10.0.0.0/8', '11.0.0.1', false],
  ['10.0.0.0/8', '::ffff:10.1.2.3', true],
  ['10.0.0.0/8', '0000:0000:0000:0000:0000:ffff:0a01:0203', true],
  ['10.0.0.0/8', '::ffff:11.0.0.1', false],
  ['::ffff:10.0.0.0/104', '10.1.2.3', true],
  ['::ffff:10.0.0.0/104', '11.1.2.3', false],
  ['::ffff:10.1.2.3', '10.1.2.3', true],
  ['10.1.2.3', '::ffff:10.1.2.3', true],
  ['10.1.2.3', '10.1.2.4', false],
  ['127.0.0.1', '127.0.0.1', true],
  ['192.168.0.0/16', '192.168.255.255', true],
  ['192.168.0.0/16', '192.169.0.0', false],
  ['172.16.0.0/12', '172.31.255.255', true],
  ['172.16.0.0/12', '172.32.0.0', false],
  ['0.0.0.0/0', '203.0.113.9', true],
  ['0.0.0.0/0', '::1', false],
  ['0.0.0.0/0', 'fd00::1', false],
  ['::/0', '203.0.113.9', true],
  ['::/0', '2001:db8::1', true],
  ['fd00::/8', 'fd12:3456::1', true],
  ['fd00::/8', 'fe80::1', false],
  ['fd00::/8', '10.0.0.1', false],
  ['2001:db8::/32', '2001:db8:ffff::1', true],
  ['2001:db8::/32', '2001:db9::1', false],
  ['2001:db8::/33', '2001:db8:7fff::1', true],
  ['2001:db8::/33', '2001:db8:8000::1', false],
  ['2001:db8::1', '2001:0db8:0000:0000:0000:0000:0000:0001', true],
  ['::1', '0000:0000:0000:0000:0000:0000:0000:0001', true],
  ['::1', '127.0.0.1', false],
];

test('range matching: IPv4 ranges match IPv4-mapped addresses and the other way round', () => {
  for (const [range, addr, want] of MATCHES) {
    const set = IpRangeSet.parse([range]);
    assert.equal(set.hasText(addr), want, `${range} ∋ ${addr}`);
  }
  const set = IpRangeSet.parse(['10.0.0.0/8', 'fd00::/8', '127.0.0.1']);
  assert.equal(set.size, 3);
  for (const [addr, want] of [['10.9.9.9', true], ['fd00::9', true], ['127.0.0.1', true], ['127.0.0.2', false], ['not an ip', false], ['', false]] as const) {
    assert.equal(set.hasText(addr), want, addr);
  }
  assert.equal(IpRangeSet.parse([]).hasText('10.0.0.1'), false);
});

test('range matching agrees with node:net BlockList', () => {
  for (const [range, addr, want] of MATCHES) {
    const bl = new BlockList();
    const [net, len] = range.split('/');
    const rangeFamily = net.includes(':') ? 'ipv6' : 'ipv4';
    bl.addSubnet(net, len === undefined ? (rangeFamily === 'ipv4' ? 32 : 128) : Number(len), rangeFamily);
    assert.equal(bl.check(addr, addr.includes(':') ? 'ipv6' : 'ipv4'), want, `BlockList: ${range} ∋ ${addr}`);
  }
});

test('parsing a list skips nothing silently: the first bad entry is named', () => {
  assert.throws(() => IpRangeSet.parse(['10.0.0.0/8', 'nope']), /"nope": not an IP address/);
  // A lenient parse for nodes, whose control plane already validated the list: bad entries trust nothing.
  const lenient = IpRangeSet.parse(['nope', '10.0.0.0/8'], { skipInvalid: true });
  assert.equal(lenient.size, 1);
  assert.equal(lenient.hasText('10.0.0.1'), true);
});

test('edgeClientOf: IPv4 per address, IPv6 per /64', () => {
  const rows: Array<[string, string]> = [
    ['10.1.2.3', '10.1.2.3'],
    ['2001:db8:1:2::1', '2001:db8:1:2::/64'],
    ['2001:db8:1:2:aaaa:bbbb:cccc:dddd', '2001:db8:1:2::/64'],
    ['2001:DB8:0:0:1::', '2001:db8::/64'],
    ['::1', '::/64'],
    ['fe80::1', 'fe80::/64'],
    ['::ffff:10.1.2.3', '10.1.2.3'],
    ['not an address', 'not an address'],
  ];
  for (const [ip, want] of rows) assert.equal(edgeClientOf(ip), want, ip);
});
