// The API key of an `Authorization: Bearer <key>` header: "Bearer", one or more spaces, the key (no
// whitespace in it), optional trailing spaces; anything else presents no key. The same as the
// pattern /^Bearer +(\S+) *$/, without a match array per request.

const SPACE = /\s/;

/** The key an Authorization header presents, or null when it is not of that form. */
export function bearerToken(authorization: string): string | null {
  if (!authorization.startsWith('Bearer ')) return null;
  let start = 7;
  while (authorization.charCodeAt(start) === 32) start++;
  let end = authorization.length;
  while (end > start && authorization.charCodeAt(end - 1) === 32) end--;
  if (end === start) return null;
  for (let i = start; i < end; i++) {
    const c = authorization.charCodeAt(i);
    // Printable ASCII is never whitespace; anything else asks the pattern.
    if ((c <= 32 || c >= 127) && SPACE.test(authorization[i])) return null;
  }
  return authorization.slice(start, end);
}
