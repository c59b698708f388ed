// HMAC-SHA256(pepper, key): the hash a presented API key is looked up by (key-table.ts), computed once
// per request. Same digest as createHmac('sha256', pepper).update(key).digest(), cheaper: the pepper is
// fixed, so the hash states after its inner and outer pad blocks are computed once (RFC 2104 allows
// this), and a key is two SHA-256 blocks in plain integer arithmetic, with no OpenSSL look-up of the
// algorithm by name, no Hmac object and no Buffer allocated per request (issue 37, measured in
// test/bench/README.md). No branch or table index depends on the key's bytes. Nothing here keeps the
// key: the scratch holding its bytes is overwritten by the next key.
import { createHash } from 'node:crypto';

const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
  0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
  0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const IV = new Int32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);

/** The message schedule of the block being compressed (words 0–15 are the block, big-endian). */
const W = new Int32Array(64);
const state = new Int32Array(8);

/** SHA-256's compression of the block in W[0..15] into `h`. */
function compress(h: Int32Array): void {
  const w = W;
  const k = K;
  for (let t = 16; t < 64; t++) {
    const x = w[t - 15];
    const y = w[t - 2];
    const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
    const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
    w[t] = (w[t - 16] + s0 + w[t - 7] + s1) | 0;
  }
  let a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (let t = 0; t < 64; t++) {
    const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + k[t] + w[t]) | 0;
    const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
    hh = g;
    g = f;
    f = e;
    e = (d + t1) | 0;
    d = c;
    c = b;
    b = a;
    a = (t1 + t2) | 0;
  }
  h[0] = (h[0] + a) | 0;
  h[1] = (h[1] + b) | 0;
  h[2] = (h[2] + c) | 0;
  h[3] = (h[3] + d) | 0;
  h[4] = (h[4] + e) | 0;
  h[5] = (h[5] + f) | 0;
  h[6] = (h[6] + g) | 0;
  h[7] = (h[7] + hh) | 0;
}

/** Loads the 64 bytes of `bytes` at `off` into W[0..15], big-endian. */
function load(bytes: Uint8Array, off: number): void {
  const w = W;
  for (let i = 0; i < 16; i++, off += 4) w[i] = (bytes[off] << 24) | (bytes[off + 1] << 16) | (bytes[off + 2] << 8) | bytes[off + 3];
}

/** The states after the pepper's inner (0x36) and outer (0x5c) pad blocks; kept for the last pepper seen. */
let lastPepper: Buffer | null = null;
const innerStart = new Int32Array(8);
const outerStart = new Int32Array(8);

function padStates(pepper: Buffer): void {
  // A key longer than a block is hashed first (RFC 2104); a shorter one is zero-padded.
  const k = new Uint8Array(64);
  k.set(pepper.length > 64 ? createHash('sha256').update(pepper).digest() : pepper);
  const block = new Uint8Array(64);
  for (const [pad, into] of [[0x36, innerStart], [0x5c, outerStart]] as const) {
    for (let i = 0; i < 64; i++) block[i] = k[i] ^ pad;
    load(block, 0);
    into.set(IV);
    compress(into);
  }
  lastPepper = pepper;
}

/** The key's bytes then SHA-256's padding; grown when a longer key comes. */
let scratch = new Uint8Array(256);
const out = Buffer.alloc(32);

/**
 * HMAC-SHA256 of `key` (UTF-8) under `pepper`, in a buffer that the next call overwrites: read it (or
 * copy it) before calling again.
 */
export function keyHmac(pepper: Buffer, key: string): Buffer {
  if (pepper !== lastPepper) padStates(pepper);
  // Bytes of the key: ASCII (every key the control plane issues) copied as is, else UTF-8 as Buffer encodes it.
  let n = key.length;
  if (scratch.length < n * 3 + 72) scratch = new Uint8Array(n * 3 + 72);
  const b = scratch;
  let ascii = true;
  for (let i = 0; i < n; i++) {
    const c = key.charCodeAt(i);
    if (c > 0x7f) {
      ascii = false;
      break;
    }
    b[i] = c;
  }
  if (!ascii) n = Buffer.from(b.buffer, b.byteOffset, b.length).write(key, 0, 'utf8');
  // Padding: 0x80, zeros, then the bit length of pad block + key as a 64-bit big-endian number.
  const end = (((n + 8) >>> 6) + 1) * 64;
  b[n] = 0x80;
  for (let i = n + 1; i < end - 8; i++) b[i] = 0;
  const bits = (64 + n) * 8;
  const hi = Math.floor(bits / 0x100000000);
  b[end - 8] = hi >>> 24;
  b[end - 7] = hi >>> 16;
  b[end - 6] = hi >>> 8;
  b[end - 5] = hi;
  b[end - 4] = bits >>> 24;
  b[end - 3] = bits >>> 16;
  b[end - 2] = bits >>> 8;
  b[end - 1] = bits;
  const h = state;
  h.set(innerStart);
  for (let off = 0; off < end; off += 64) {
    load(b, off);
    compress(h);
  }
  for (let i = 0; i < n; i++) b[i] = 0;
  // Outer: the 32-byte inner digest after the outer pad block, 96 bytes in all, one padded block.
  const w = W;
  for (let i = 0; i < 8; i++) w[i] = h[i];
  w[8] = 0x80000000 | 0;
  for (let i = 9; i < 15; i++) w[i] = 0;
  w[15] = 96 * 8;
  h.set(outerStart);
  compress(h);
  const o = out;
  for (let i = 0, j = 0; i < 8; i++, j += 4) {
    const s = h[i];
    o[j] = s >>> 24;
    o[j + 1] = s >>> 16;
    o[j + 2] = s >>> 8;
    o[j + 3] = s;
  }
  return out;
}
