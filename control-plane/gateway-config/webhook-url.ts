// A webhook destination's URL as Tollgate shows and stores it: its origin and path. A query (or a
// fragment) may carry the receiver's token, so it reaches only the destination itself: never a log
// line, the outbox, the audit log or an answer of `tollgate webhooks` (docs/webhooks-and-audit.md).

/** The one redaction of a destination URL; '' for what is not a URL. */
export function redactedUrl(raw: unknown): string {
  try {
    const u = new URL(String(raw));
    return `${u.origin}${u.pathname}`;
  } catch {
    return '';
  }
}
