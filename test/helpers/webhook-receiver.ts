// A webhook destination for tests: an HTTP server on port 0 that records every request (headers,
// body, whether its Standard Webhooks signature verified with the standardwebhooks package) and
// answers with the status the test chooses for each attempt.
import { createServer, type Server } from 'node:http';
import { randomBytes } from 'node:crypto';
import { Webhook } from 'standardwebhooks';

export interface ReceivedWebhook {
  id: string;
  timestamp: string;
  signature: string;
  body: string;
  /** verify() of standardwebhooks passed (signature and a timestamp within its tolerance of now). */
  verified: boolean;
  /** The signature matches the body under the secret, whatever the timestamp. */
  signatureMatches: boolean;
  answered: number;
  type: string;
  data: Record<string, any>;
  /** The request's path and query, as the destination saw them. */
  path: string;
}

export interface WebhookReceiver {
  url: string;
  secret: string;
  received: ReceivedWebhook[];
  /** Status for the next requests, in order; then `fallback`. */
  answers: number[];
  fallback: number;
  /** Resolves when `pred` holds for the received list (checked on every arrival). */
  waitFor(pred: (r: ReceivedWebhook[]) => boolean, timeoutMs?: number): Promise<ReceivedWebhook[]>;
  close(): Promise<void>;
}

export function newWebhookSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

export async function startWebhookReceiver(secret = newWebhookSecret()): Promise<WebhookReceiver> {
  const wh = new Webhook(secret);
  const received: ReceivedWebhook[] = [];
  const waiters = new Set<() => void>();
  const recv: WebhookReceiver = {
    url: '',
    secret,
    received,
    answers: [],
    fallback: 204,
    waitFor(pred, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          if (!pred(received)) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(received);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`webhook receiver: condition not met in ${timeoutMs} ms; received ${JSON.stringify(received.map((r) => [r.type, r.id, r.answered]))}`));
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const headers = { 'webhook-id': String(req.headers['webhook-id'] ?? ''), 'webhook-timestamp': String(req.headers['webhook-timestamp'] ?? ''), 'webhook-signature': String(req.headers['webhook-signature'] ?? '') };
      let verified = false;
      try {
        wh.verify(body, headers);
        verified = true;
      } catch {
        verified = false;
      }
      const ts = Number(headers['webhook-timestamp']);
      const signatureMatches = Number.isSafeInteger(ts) && headers['webhook-signature'].split(' ').includes(wh.sign(headers['webhook-id'], new Date(ts * 1000), body));
      let parsed: any = {};
      try {
        parsed = JSON.parse(body);
      } catch {
        parsed = {};
      }
      const answered = recv.answers.length > 0 ? recv.answers.shift()! : recv.fallback;
      received.push({ id: headers['webhook-id'], timestamp: headers['webhook-timestamp'], signature: headers['webhook-signature'], body, verified, signatureMatches, answered, type: parsed.type ?? '', data: parsed.data ?? {}, path: req.url ?? '' });
      res.writeHead(answered, { 'content-type': 'text/plain' }).end(answered < 300 ? 'ok' : 'nope');
      for (const w of [...waiters]) w();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  recv.url = `http://127.0.0.1:${(server.address() as { port: number }).port}/hooks`;
  return recv;
}
