// Pure helpers for API keys and secrets, shared by the control plane and the data plane.
// No I/O here: the callers own where the pepper comes from.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
/** 43 base62 characters carry 256 bits (62^43 > 2^256). */
export const KEY_RANDOM_CHARS = 43;
export const MIN_PEPPER_BYTES = 32;
const PEPPER_CHECK_LABEL = 'tollgate pepper check v1';

/** `sk-<service>-` + 43 base62 characters drawn from crypto.randomBytes by rejection sampling (no modulo bias). */
export function generateKey(serviceName: string): string {
  let out = '';
  while (out.length < KEY_RANDOM_CHARS) {
    for (const byte of randomBytes(64)) {
      // 248 = 62 * 4: bytes at or above it would bias the low characters.
      if (byte < 248 && out.length < KEY_RANDOM_CHARS) out += BASE62[byte % 62];
    }
  }
  return `sk-${serviceName}-${out}`;
}

export function keyPattern(serviceName: string): RegExp {
  return new RegExp(`^sk-${serviceName.replace(/[^A-Za-z0-9_-]/g, '')}-[0-9A-Za-z]{${KEY_RANDOM_CHARS}}$`);
}

/** The only part of a key ever shown after creation: first 12 characters, `...`, last four. */
export function maskKey(key: string): string {
  return `${key.slice(0, 12)}...${key.slice(-4)}`;
}

/** hex HMAC-SHA256(pepper, key): the only form in which a key is stored or synced. */
export function hashKey(pepper: Buffer, key: string): string {
  return createHmac('sha256', pepper).update(key).digest('hex');
}

/** Proves two processes hold the same pepper without revealing it. */
export function pepperCheck(pepper: Buffer): string {
  return createHmac('sha256', pepper).update(PEPPER_CHECK_LABEL).digest('hex');
}

/** Hashes a console or node token (not peppered: tokens are 256-bit random, not guessable). */
export function hashToken(token: string): string {
  return createHmac('sha256', 'tollgate console token').update(token).digest('hex');
}

/** Constant-time equality of two strings (hex digests, tokens). */
export function secretsEqual(a: string, b: string): boolean {
  const ab = Buffer.from(a);
  const bb = Buffer.from(b);
  if (ab.length !== bb.length) {
    // Still spend the time of a comparison so the length is all that leaks.
    timingSafeEqual(ab, ab);
    return false;
  }
  return timingSafeEqual(ab, bb);
}

/** A random opaque token (console tokens, operator token, node tokens). */
export function generateToken(prefix: string): string {
  return `${prefix}_${randomBytes(32).toString('base64url')}`;
}

/** Short random identifiers for records: `org_…`, `proj_…`, `key_…`. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(9).toString('base64url').replace(/[-_]/g, 'x')}`;
}

/** Validates a pepper read from the environment or a file. Returns an error line, or null when good. */
export function checkPepper(pepper: Buffer | undefined): string | null {
  if (!pepper || pepper.length === 0) return 'no key pepper: set TOLLGATE_PEPPER or pass --pepper-file';
  if (pepper.length < MIN_PEPPER_BYTES) return `key pepper too short: ${pepper.length} bytes, need at least ${MIN_PEPPER_BYTES}`;
  return null;
}
