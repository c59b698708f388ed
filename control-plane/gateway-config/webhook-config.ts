// The `webhooks:` key of the gateway config file, and `webhook_balance_low_usd`. Pure: the
// environment is passed in (config.ts is the only reader of process.env). Secrets stay in memory,
// never in the database, a log line or what nodes receive.
import { redactedUrl } from './webhook-url.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { parseUsd } from '../../proto/lib/money.js';

/** Every event type a destination may subscribe to ("*": all of them). */
export const WEBHOOK_EVENT_TYPES = [
  'org.cap.threshold',
  'org.balance.low',
  'org.blocked',
  'org.unblocked',
  'key.created',
  'key.revoked',
  'key.revoked_used',
  'key.expiring',
  'node.disconnected',
  'project.cap.threshold',
  'key.limit.threshold',
] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number] | 'webhook.test';

export interface WebhookDestination {
  url: string;
  /** The name of the environment variable the secret came from (shown by `webhooks list`). */
  secretEnv: string;
  /** `whsec_` + base64, the Standard Webhooks form. */
  secret: string;
  events: ReadonlySet<string>;
  /** The first retry's delay; each later one doubles it (with jitter). */
  retryInitialMs: number;
}

export interface WebhookSettings {
  destinations: WebhookDestination[];
  /** org.balance.low fires when an organisation's balance falls to this or below. */
  balanceLowMicros: number;
}

const DEST_KEYS = new Set(['url', 'secret_env', 'events', 'retry_initial_ms']);
export const DEFAULT_BALANCE_LOW_MICROS = 1_000_000;
const DEFAULT_RETRY_INITIAL_MS = 5_000;

function fail(where: string, what: string): never {
  throw new ConfigError(`${where}: ${what}`);
}

export function parseWebhooksConfig(raw: unknown, rawBalanceLow: unknown, env: NodeJS.ProcessEnv): WebhookSettings {
  let balanceLowMicros = DEFAULT_BALANCE_LOW_MICROS;
  if (rawBalanceLow !== undefined && rawBalanceLow !== null) {
    const micros = typeof rawBalanceLow === 'number' || typeof rawBalanceLow === 'string' ? parseUsd(String(rawBalanceLow)) : null;
    if (micros === null || micros < 0) fail('webhook_balance_low_usd', `must be a USD amount of at least 0, got ${JSON.stringify(rawBalanceLow)}`);
    balanceLowMicros = micros;
  }
  if (raw === undefined || raw === null) return { destinations: [], balanceLowMicros };
  if (!Array.isArray(raw)) fail('webhooks', 'must be a list of { url, secret_env, events }');
  const seen = new Set<string>();
  const destinations = raw.map((d: unknown, i): WebhookDestination => {
    const where = `webhooks[${i}]`;
    if (typeof d !== 'object' || d === null || Array.isArray(d)) fail(where, 'must be a mapping with url, secret_env and events');
    const o = d as Record<string, unknown>;
    for (const k of Object.keys(o)) if (!DEST_KEYS.has(k)) fail(where, `unknown key ${JSON.stringify(k)}; expected url, secret_env, events, retry_initial_ms`);
    if (typeof o.url !== 'string' || o.url.trim() === '') fail(`${where}.url`, 'is required');
    let url: URL;
    try {
      url = new URL(o.url.trim());
    } catch {
      // Never echo a query: it may hold the receiver's token.
      fail(`${where}.url`, `is not a URL: ${JSON.stringify(o.url.split(/[?#]/)[0].slice(0, 200))}`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') fail(`${where}.url`, `must be http:// or https://, got ${JSON.stringify(redactedUrl(url.href))}`);
    if (url.username || url.password) fail(`${where}.url`, 'must not carry credentials; the signature authenticates the sender');
    // Destinations are known by their redacted URL (the outbox holds no query): two may not share one.
    const shown = redactedUrl(url.href);
    if (seen.has(shown)) fail(`${where}.url`, `${shown} is listed twice (destinations must differ in more than their query)`);
    seen.add(shown);
    if (typeof o.secret_env !== 'string' || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(o.secret_env)) fail(`${where}.secret_env`, 'must name an environment variable');
    const secret = env[o.secret_env] ?? '';
    if (secret === '') fail(`${where}.secret_env`, `environment variable ${o.secret_env} is not set`);
    // Never echo the secret: the messages name the variable only.
    const m = /^whsec_([A-Za-z0-9+/]+={0,2})$/.exec(secret);
    if (!m || Buffer.from(m[1], 'base64').length < 24) fail(`${where}.secret_env`, `${o.secret_env} must hold a Standard Webhooks secret: whsec_ and at least 24 random bytes in base64 (echo whsec_$(openssl rand -base64 32))`);
    if (!Array.isArray(o.events) || o.events.length === 0) fail(`${where}.events`, `must be a non-empty list of event types (${WEBHOOK_EVENT_TYPES.join(', ')}) or ["*"]`);
    const events = new Set<string>();
    for (const e of o.events) {
      if (e === '*') WEBHOOK_EVENT_TYPES.forEach((t) => events.add(t));
      else if (typeof e === 'string' && (WEBHOOK_EVENT_TYPES as readonly string[]).includes(e)) events.add(e);
      else fail(`${where}.events`, `unknown event type ${JSON.stringify(e)}; known: ${WEBHOOK_EVENT_TYPES.join(', ')}`);
    }
    let retryInitialMs = DEFAULT_RETRY_INITIAL_MS;
    if (o.retry_initial_ms !== undefined) {
      if (typeof o.retry_initial_ms !== 'number' || !Number.isSafeInteger(o.retry_initial_ms) || o.retry_initial_ms < 100 || o.retry_initial_ms > 3_600_000) {
        fail(`${where}.retry_initial_ms`, 'must be whole milliseconds from 100 to 3600000');
      }
      retryInitialMs = o.retry_initial_ms;
    }
    return { url: url.href, secretEnv: o.secret_env, secret, events, retryInitialMs };
  });
  return { destinations, balanceLowMicros };
}
