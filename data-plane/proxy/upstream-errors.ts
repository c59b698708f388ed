// What a customer gets when a model upstream answers an error (status 400 and above). The upstream's
// body speaks to the operator's upstream account, not to the customer: an upstream 401 or 403 means
// the operator's credential was refused, which the customer can do nothing about (502
// upstream_unreachable, in the route's shape); any other error passes on with the identifiers of that
// account (organisation, project and user ids, masked keys) masked, and a 429 keeps its retry-after.
// The upstream's own body goes to the node's log, for the operator only.
import { GatewayError } from '../errors.js';
import { renderError, type ErrorShape } from '../error-shapes.js';
import type { HeaderList } from './response-sink.js';

/** Bytes of an upstream error body read; the rest is dropped (an error body is short). */
export const MAX_UPSTREAM_ERROR_BYTES = 64 * 1024;

export interface UpstreamErrorAnswer {
  status: number;
  headers: HeaderList;
  body: string;
}

/** Identifiers of an upstream account, in free text. */
const ACCOUNT_IDS: Array<[RegExp, string]> = [
  [/\borg-[A-Za-z0-9]{4,}/g, 'org-***'],
  [/\bproj_[A-Za-z0-9]{4,}/g, 'proj_***'],
  [/\buser-[A-Za-z0-9]{4,}/g, 'user-***'],
  // Keys, whole or masked as upstreams print them (`sk-proj-abc*****wxyz`).
  [/\b(?:sk|rk|pk)-[A-Za-z0-9_*.\-]{3,}/g, 'sk-***'],
];

/** Members whose value names the upstream account, whatever it looks like. */
const ACCOUNT_MEMBERS = /^(?:org|organi[sz]ation|organi[sz]ation_id|org_id|project|project_id|user_id|account|account_id|api_key)$/i;

/** A text with the upstream account's identifiers masked. */
export function maskAccountIds(text: string): string {
  let out = text;
  for (const [re, mask] of ACCOUNT_IDS) out = out.replace(re, mask);
  return out;
}

function maskValue(v: unknown, depth: number): unknown {
  if (typeof v === 'string') return maskAccountIds(v);
  if (depth > 16 || v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map((x) => maskValue(x, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) out[maskAccountIds(k)] = ACCOUNT_MEMBERS.test(k) && x !== null ? '***' : maskValue(x, depth + 1);
  return out;
}

/** A retry-after value as HTTP allows it (seconds, or an HTTP date); anything else is not passed on. */
function validRetryAfter(v: string | undefined): string | undefined {
  if (v === undefined) return undefined;
  const t = v.trim();
  if (/^\d{1,9}$/.test(t)) return t;
  if (t.length <= 64 && /^[A-Za-z0-9 ,:]+$/.test(t) && !Number.isNaN(Date.parse(t))) return t;
  return undefined;
}

/**
 * The answer for an upstream error: `body` is what was read of the upstream's (at most
 * MAX_UPSTREAM_ERROR_BYTES), `shape` the route's error shape.
 */
export function upstreamErrorAnswer(status: number, contentType: string, body: Buffer, retryAfter: string | undefined, shape: ErrorShape): UpstreamErrorAnswer {
  if (status === 401 || status === 403) {
    const r = renderError(new GatewayError('UPSTREAM_UNREACHABLE', 'The upstream refused the gateway; this is not a problem with your key. Retry later.'), shape);
    return { status: r.status, headers: r.headers, body: r.body };
  }
  const headers: Array<[string, string]> = [];
  let text = body.toString('utf8');
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  if (json !== undefined) {
    text = JSON.stringify(maskValue(json, 0));
    headers.push(['content-type', 'application/json']);
  } else {
    text = maskAccountIds(text);
    if (contentType) headers.push(['content-type', contentType]);
  }
  const retry = status === 429 || status === 503 ? validRetryAfter(retryAfter) : undefined;
  if (retry !== undefined) headers.push(['retry-after', retry]);
  return { status, headers, body: text };
}
