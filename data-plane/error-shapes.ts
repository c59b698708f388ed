// THE one place that turns an error into status, headers and body. Pure: no I/O, no clock.
// The spec's three error shapes, named for whose errors they are:
// 'openai' (the spec's Shape A, model endpoints, OpenAI's error object): {"error":{"message","type","param","code"}};
//   `code` is the HTTP status as text; the edge 429 has no `param` at all.
// 'gateway' (Shape B, the gateway layer in front of tools, and unknown paths): {"error":{"code","message"}}.
// 'passthrough' (Shape C, what pass-through backends answer, so ours look like theirs): {"detail": "..."}.
import { STATUS_CODES } from 'node:http';
import { CATALOG, GatewayError, isGatewayError, type ErrorShape } from './errors.js';

export type { ErrorShape };

export interface RenderedError {
  status: number;
  /** "401 Unauthorized": what uWS writeStatus wants. */
  statusLine: string;
  headers: Array<[string, string]>;
  body: string;
}

const STATUS_LINES: string[] = [];
for (let s = 100; s < 600; s++) STATUS_LINES[s] = STATUS_CODES[s] ? `${s} ${STATUS_CODES[s]}` : `${s} Unknown`;

/** "200 OK" for a status code, from a table built once. */
export function statusLine(status: number): string {
  return STATUS_LINES[status] ?? `${status} Unknown`;
}

const JSON_TYPE: [string, string] = ['content-type', 'application/json'];

/**
 * THE one choice of an error's shape: the code's own where the catalog fixes one (errors.ts
 * CatalogEntry.shape), else the shape of the path it answers (`Reply.shape`: its family's, or the
 * gateway's for a path the router does not know). No call site names a shape.
 */
export function errorShape(err: unknown, pathShape: ErrorShape): ErrorShape {
  return CATALOG[isGatewayError(err) ? err.code : 'INTERNAL'].shape ?? pathShape;
}

/** The error rendered in `routeShape` (the 429s always in Shape A); errorShape picks the shape. */
export function renderError(err: unknown, routeShape: ErrorShape): RenderedError {
  const e = isGatewayError(err) ? err : new GatewayError('INTERNAL');
  // Both 429 bodies are Shape A ('openai') whatever the path (spec, "429 bodies").
  const shape = e.code === 'EDGE_RATE_LIMITED' || e.code === 'KEY_RATE_LIMITED' ? 'openai' : routeShape;
  const entry = CATALOG[e.code];
  const status = entry.status;
  const headers: Array<[string, string]> = [JSON_TYPE];
  if (e.retryAfterSec !== undefined) headers.push(['retry-after', String(Math.max(1, Math.ceil(e.retryAfterSec)))]);
  if (e.allow !== undefined) headers.push(['allow', e.allow]);
  let body: string;
  if (shape === 'openai') {
    const type = e.type ?? entry.typeA;
    // The edge 429 carries no param (spec, "429 bodies").
    if (e.code === 'EDGE_RATE_LIMITED') {
      body = JSON.stringify({ error: { message: e.message, type, code: String(status) } });
    } else {
      body = JSON.stringify({ error: { message: e.message, type, param: e.param ?? null, code: String(status) } });
    }
  } else if (shape === 'gateway') {
    body = JSON.stringify({ error: { code: entry.codeB, message: e.message } });
  } else {
    body = JSON.stringify({ detail: e.message });
  }
  return { status, statusLine: statusLine(status), headers, body };
}

/**
 * A refusal on a socket, as an in-band `error` event: the HTTP answer's status and Shape A error
 * object, and for a 429 the seconds to wait (`retry_after`, as the header says over HTTP).
 */
export function renderErrorEvent(err: unknown): Buffer {
  const r = renderError(err, 'openai');
  const retry = r.headers.find(([k]) => k === 'retry-after');
  const body = JSON.parse(r.body) as { error: unknown };
  return Buffer.from(JSON.stringify({ type: 'error', status: r.status, error: body.error, ...(retry ? { retry_after: Number(retry[1]) } : {}) }));
}
