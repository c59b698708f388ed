// Path sanity (docs/design.md#bad-path): a path that could mean something else to a backend, or to
// whatever decodes it along the way, is refused with 400 before anything is routed or forwarded. A path
// that passes is forwarded exactly as it was sent. Pure.
//
// Refused:
// - raw: not starting with `/`, longer than 2048 characters, an empty segment (`//`), a backslash, a
//   `;`, and any character that must be percent-encoded in a request line (controls, space, DEL,
//   non-ASCII; uWS already drops most controls before the handler sees them);
// - at every depth of decoding: invalid percent-encoding (`%zz`, `%4`, a lone `%`, also a `%` that a
//   previous round produced), invalid UTF-8 (overlong forms such as `%c0%ae`, lone surrogates, stray
//   bytes), an encoded `/` or `\`, decoded control characters (NUL, CR, LF, DEL …), `\` and `;`, and
//   dot segments: `.`, `..`, and any segment of only dots and spaces (Windows trims trailing dots and
//   spaces, so `...` and `.. ` can mean `..` there);
// - the same after NFKC normalisation of decoded non-ASCII segments (fullwidth `．．`, `／`, `＼`, `﹔`
//   become `..`, `/`, `\`, `;` in backends that normalise);
// - a path still changing after MAX_DECODE_ROUNDS rounds of decoding.

export const MAX_PATH_CHARS = 2048;
/** Decoding rounds tried; a path that still holds a `%` after them is refused as still changing. */
export const MAX_DECODE_ROUNDS = 3;

const ENCODED_SEPARATOR = /%(?:2f|5c)/i;

export function isBadPath(path: string): boolean {
  if (path.length === 0 || path.length > MAX_PATH_CHARS) return true;
  if (path.charCodeAt(0) !== 47 /* / */) return true;
  let hasPercent = false;
  let hasDot = false;
  for (let i = 0; i < path.length; i++) {
    const c = path.charCodeAt(i);
    if (c <= 0x20 || c >= 0x7f || c === 0x5c /* \ */ || c === 0x3b /* ; */) return true;
    if (c === 0x2f /* / */ && path.charCodeAt(i + 1) === 0x2f) return true;
    if (c === 0x25 /* % */) hasPercent = true;
    else if (c === 0x2e /* . */) hasDot = true;
  }
  if (hasDot && hasDotSegment(path)) return true;
  // The common case: nothing encoded, nothing more to look at.
  if (!hasPercent) return false;

  let s = path;
  for (let round = 0; round < MAX_DECODE_ROUNDS; round++) {
    // Checked before decoding: once decoded, an encoded separator can no longer be told from a real one.
    if (ENCODED_SEPARATOR.test(s)) return true;
    let decoded: string;
    try {
      // Throws on invalid percent-encoding and on invalid UTF-8, overlong forms included.
      decoded = decodeURIComponent(s);
    } catch {
      return true;
    }
    if (hasForbiddenDecoded(decoded) || hasDotSegment(decoded)) return true;
    if (!decoded.includes('%')) return false;
    s = decoded;
  }
  return true;
}

/** Decoded control characters, `\` and `;`, and their NFKC look-alikes in non-ASCII segments. */
function hasForbiddenDecoded(s: string): boolean {
  let nonAscii = false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x7f || c === 0x5c || c === 0x3b) return true;
    if (c > 0x7f) nonAscii = true;
  }
  if (!nonAscii) return false;
  for (const seg of s.split('/')) {
    const n = seg.normalize('NFKC');
    if (n === seg) continue;
    if (n.includes('/') || n.includes('\\') || n.includes(';') || isDotSegment(n)) return true;
  }
  return false;
}

function hasDotSegment(s: string): boolean {
  let start = 0;
  for (;;) {
    const end = s.indexOf('/', start);
    if (isDotSegment(end === -1 ? s.slice(start) : s.slice(start, end))) return true;
    if (end === -1) return false;
    start = end + 1;
  }
}

/** `.`, `..`, or any segment of only dots and spaces that starts with a dot. */
function isDotSegment(seg: string): boolean {
  if (seg.length === 0 || seg.charCodeAt(0) !== 0x2e) return false;
  for (let i = 1; i < seg.length; i++) {
    const c = seg.charCodeAt(i);
    if (c !== 0x2e && c !== 0x20) return false;
  }
  return true;
}
