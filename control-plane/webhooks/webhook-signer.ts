// Standard Webhooks signing (https://www.standardwebhooks.com): `webhook-signature` is
// `v1,<base64 HMAC-SHA256 of "id.timestamp.body">` under the destination's `whsec_` secret. The
// standardwebhooks package does the signing, so a receiver verifying with it (or any conforming
// library) agrees byte for byte.
import { Webhook } from 'standardwebhooks';

export interface SignedHeaders {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
}

/** The three headers of one attempt: the id is the event's (stable across retries), the timestamp the attempt's. */
export function signWebhook(secret: string, id: string, atMs: number, body: string): SignedHeaders {
  const at = new Date(Math.floor(atMs / 1000) * 1000);
  return {
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(id, at, body),
  };
}
