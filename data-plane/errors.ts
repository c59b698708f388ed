// The data plane's error catalog (fastify's lib/errors.js is the model): one stable code per failure,
// with its HTTP status and how each error shape names it. Domain code throws or returns GatewayError
// only; anything else reaching the HTTP layer is a bug, rendered as 500 and logged once.
// Codes are stable; messages may change. No message may contain a secret.

/**
 * The spec's three error body shapes, named for whose errors they are (rendered by error-shapes.ts):
 * 'openai' is Shape A (model endpoints), 'gateway' Shape B (the gateway layer in front of tools, and
 * unknown paths), 'passthrough' Shape C (`{"detail"}`, as pass-through backends answer).
 */
export type ErrorShape = 'openai' | 'gateway' | 'passthrough';

export type ErrorCode =
  | 'EDGE_RATE_LIMITED'
  | 'KEY_RATE_LIMITED'
  | 'BODY_TOO_LARGE'
  | 'BODY_TOO_SLOW'
  | 'BAD_PATH'
  | 'KEY_MISSING'
  | 'KEY_INVALID'
  | 'KEY_STALE'
  | 'ORG_BLOCKED'
  | 'SPEND_LIMIT_REACHED'
  | 'MODEL_NOT_ALLOWED'
  | 'NOT_FOUND'
  | 'METHOD_NOT_ALLOWED'
  | 'INVALID_REQUEST'
  | 'UNKNOWN_MODEL'
  | 'UPSTREAM_UNREACHABLE'
  | 'UPSTREAM_ERROR'
  | 'MODEL_AT_CAPACITY'
  | 'STORED_OBJECT_UNAVAILABLE'
  | 'OWNER_RECORDS_LOADING'
  | 'NOT_READY'
  | 'NODE_BUSY'
  | 'NODE_DRAINING'
  | 'CONTROL_PLANE_UNAVAILABLE'
  | 'REMOTE_REFERENCE'
  | 'ENCODED_BODY'
  | 'INTERNAL';

export interface CatalogEntry {
  status: number;
  /** Shape A `error.type`. */
  typeA: string;
  /** Shape B `error.code`. */
  codeB: string;
  message: string;
  /**
   * The shape this code is answered in whatever the path (error-shapes.ts errorShape): the 429s are
   * Shape A everywhere (spec, "429 bodies"), a malformed path is the gateway layer's, a `/v1/pdf`
   * refusal looks like its backends' answers. Absent: the path's shape.
   */
  shape?: ErrorShape;
}

export const CATALOG: Readonly<Record<ErrorCode, CatalogEntry>> = Object.freeze({
  EDGE_RATE_LIMITED: { status: 429, typeA: 'api_error', codeB: 'rate_limited', message: 'Too many requests from this address; retry after the time in the retry-after header.', shape: 'openai' },
  KEY_RATE_LIMITED: { status: 429, typeA: 'requests', codeB: 'rate_limited', message: 'Rate limit reached for this API key.', shape: 'openai' },
  BODY_TOO_LARGE: { status: 413, typeA: 'invalid_request_error', codeB: 'payload_too_large', message: 'Request body is larger than this path allows.' },
  BODY_TOO_SLOW: { status: 408, typeA: 'invalid_request_error', codeB: 'request_timeout', message: 'The request body arrived too slowly; send it at a steady rate.' },
  BAD_PATH: { status: 400, typeA: 'invalid_request_error', codeB: 'bad_path', message: 'Malformed request path.', shape: 'gateway' },
  KEY_MISSING: { status: 401, typeA: 'authentication_error', codeB: 'invalid_api_key', message: 'Missing API key: send it as "Authorization: Bearer <API_KEY>".' },
  KEY_INVALID: { status: 401, typeA: 'authentication_error', codeB: 'invalid_api_key', message: 'Invalid API key: the key does not exist or was revoked.' },
  KEY_STALE: { status: 401, typeA: 'authentication_error', codeB: 'invalid_api_key', message: 'This gateway node cannot currently verify API keys; retry later.' },
  ORG_BLOCKED: { status: 401, typeA: 'insufficient_quota', codeB: 'invalid_api_key', message: "The organisation's balance is exhausted or its monthly spend cap was reached." },
  // A project's monthly cap or a key's own limit (docs/money-limits.md); the message names which and when it lifts.
  SPEND_LIMIT_REACHED: { status: 401, typeA: 'insufficient_quota', codeB: 'invalid_api_key', message: "A spend limit of this API key or of its project was reached." },
  MODEL_NOT_ALLOWED: { status: 401, typeA: 'model_not_allowed', codeB: 'invalid_api_key', message: 'This API key may not use this model.' },
  NOT_FOUND: { status: 404, typeA: 'invalid_request_error', codeB: 'not_found', message: 'No such path.' },
  METHOD_NOT_ALLOWED: { status: 405, typeA: 'invalid_request_error', codeB: 'method_not_allowed', message: 'Method not allowed on this path.' },
  INVALID_REQUEST: { status: 400, typeA: 'invalid_request_error', codeB: 'invalid_request', message: 'Invalid request.' },
  UNKNOWN_MODEL: { status: 400, typeA: 'invalid_request_error', codeB: 'invalid_request', message: 'The model does not exist.' },
  UPSTREAM_UNREACHABLE: { status: 502, typeA: 'api_error', codeB: 'upstream_unreachable', message: 'The upstream could not be reached.' },
  // Every deployment of a pooled model is at its own limits or cooling after a 429 (issue 36).
  MODEL_AT_CAPACITY: { status: 429, typeA: 'api_error', codeB: 'rate_limited', message: "The model's upstream capacity is used up; retry after the time in the retry-after header.", shape: 'openai' },
  // A stored response or conversation lives in one deployment's upstream account, and that one is down (issue 36, affinity).
  STORED_OBJECT_UNAVAILABLE: { status: 503, typeA: 'api_error', codeB: 'stored_object_unavailable', message: 'What this request names lives on an upstream that is unavailable right now; retry later.', shape: 'openai' },
  // A node that holds the owner records of the projects it serves only has not received this project's yet (docs/design.md#owner-records).
  OWNER_RECORDS_LOADING: { status: 503, typeA: 'api_error', codeB: 'not_ready', message: "This gateway node is still loading the project's stored responses and conversations; retry after the time in the retry-after header.", shape: 'openai' },
  UPSTREAM_ERROR: { status: 502, typeA: 'api_error', codeB: 'upstream_unreachable', message: 'The upstream failed before answering.' },
  NOT_READY: { status: 503, typeA: 'api_error', codeB: 'not_ready', message: 'This gateway node has not received its configuration yet; retry shortly.' },
  NODE_DRAINING: { status: 503, typeA: 'api_error', codeB: 'node_draining', message: 'This gateway node is shutting down; reconnect (a load balancer sends you to another node).' },
  NODE_BUSY: { status: 503, typeA: 'api_error', codeB: 'node_busy', message: 'This gateway node is holding too many request bodies right now; retry after the time in the retry-after header.' },
  CONTROL_PLANE_UNAVAILABLE: { status: 503, typeA: 'api_error', codeB: 'control_plane_unreachable', message: 'Usage cannot be read right now: this gateway node cannot reach the control plane; retry after the time in the retry-after header.' },
  // `/v1/pdf*` HTML that references a remote resource; answered in Shape C (docs/design.md#pdf-remote-references).
  REMOTE_REFERENCE: { status: 400, typeA: 'invalid_request_error', codeB: 'bad_request', message: 'The HTML references a remote resource.', shape: 'passthrough' },
  ENCODED_BODY: { status: 400, typeA: 'invalid_request_error', codeB: 'bad_request', message: 'This path accepts bodies without a Content-Encoding only.', shape: 'passthrough' },
  INTERNAL: { status: 500, typeA: 'api_error', codeB: 'internal_error', message: 'Internal error.' },
});

/**
 * The one rule for a refusal after admission (docs/design.md#what-counts-as-a-request), the same for
 * an HTTP request and a socket turn: a refusal for what the request holds (its body, its query, its
 * event: a 400) keeps its one request of rpm and gives back its tokens, slot and money, so bad
 * requests are not free to send; every other refusal after admission (the model's scope, a stored
 * object that is not the key's, a later limit, no upstream) is given back whole.
 */
const KEEPS_REQUEST: Readonly<Record<ErrorCode, boolean>> = Object.freeze(
  Object.fromEntries((Object.keys(CATALOG) as ErrorCode[]).map((code) => [code, CATALOG[code].status === 400])) as Record<ErrorCode, boolean>,
);

/** Whether a refusal after admission keeps its one request of rpm (the rule above). */
export function keepsRequest(err: unknown): boolean {
  return err instanceof GatewayError && KEEPS_REQUEST[err.code];
}

export interface GatewayErrorOptions {
  /** Shape A `param`; undefined renders as null (except where the catalog omits it). */
  param?: string | null;
  /** Overrides Shape A `type` (the gateway 429 names its tripped dimension). */
  type?: string;
  retryAfterSec?: number;
  /** Methods for the `Allow` header of a 405. */
  allow?: string;
}

export class GatewayError extends Error {
  readonly code: ErrorCode;
  readonly param: string | null | undefined;
  readonly type: string | undefined;
  readonly retryAfterSec: number | undefined;
  readonly allow: string | undefined;

  constructor(code: ErrorCode, message?: string, opts: GatewayErrorOptions = {}) {
    super(message ?? CATALOG[code].message);
    this.name = 'GatewayError';
    this.code = code;
    this.param = opts.param;
    this.type = opts.type;
    this.retryAfterSec = opts.retryAfterSec;
    this.allow = opts.allow;
  }
}

export function isGatewayError(err: unknown): err is GatewayError {
  return err instanceof GatewayError;
}

/**
 * Why the gateway refused a request: the catalog code of the error it answered with (and a 429's
 * tripped dimension). One value, read two ways: as the metrics' `reason` label (the code) and as the
 * request log's `reason` (request/request-log.ts `refusalReason`).
 */
export type Refusal = Pick<GatewayError, 'code' | 'type'>;

const INTERNAL_REFUSAL: Refusal = Object.freeze({ code: 'INTERNAL', type: undefined });

/** The refusal of an error answered: a catalog error's own, anything else INTERNAL (a bug). */
export function refusalOf(err: unknown): Refusal {
  return isGatewayError(err) ? err : INTERNAL_REFUSAL;
}

/** The one text of a blocked organisation, whichever way it is answered (a 401, an ended stream, a closed socket). */
export function orgBlockedMessage(blockedReason: string): string {
  if (blockedReason === 'monthly_cap_reached') return "The organisation's monthly spend cap was reached; raise the cap or wait for next month.";
  if (blockedReason === 'balance_exhausted') return "The organisation's balance is exhausted; add credits to continue.";
  return CATALOG.ORG_BLOCKED.message;
}

/**
 * Why the node ends something a key has open (state/open-streams.ts decides, in this order of
 * precedence): the node can no longer vouch for any key, the key no longer authenticates, its
 * expiry passed, its organisation is blocked, or the key may no longer use the model it was opened for.
 */
export type EndReason = 'node_stale' | 'key_revoked' | 'key_expired' | 'org_blocked' | 'model_not_allowed';

/** The one error (catalog code and text) of each reason to end what a key has open. */
export function endError(why: EndReason, detail: { blockedReason?: string; modelId?: string } = {}): GatewayError {
  switch (why) {
    case 'node_stale':
      return new GatewayError('KEY_STALE');
    case 'key_revoked':
      return new GatewayError('KEY_INVALID', 'This API key was revoked.');
    case 'key_expired':
      // What a request of the expired key is answered (gate.ts: an expired key is not found).
      return new GatewayError('KEY_INVALID');
    case 'org_blocked':
      return new GatewayError('ORG_BLOCKED', orgBlockedMessage(detail.blockedReason ?? ''));
    case 'model_not_allowed':
      return new GatewayError('MODEL_NOT_ALLOWED', `This API key may no longer use the model \`${detail.modelId ?? ''}\`.`, { param: 'model' });
  }
}

/**
 * The same error as a WebSocket close reason: a word a client can branch on, then the text
 * (`insufficient_quota: the organisation's …`). The caller keeps it within 123 bytes.
 */
export function closeReasonOf(err: GatewayError): string {
  const entry = CATALOG[err.code];
  const word = entry.status === 401 && entry.typeA === 'authentication_error' ? entry.codeB : entry.typeA;
  return `${word}: ${err.message.charAt(0).toLowerCase()}${err.message.slice(1)}`;
}
