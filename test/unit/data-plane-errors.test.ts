// The whole error catalog of each plane, in every shape. Data plane: every code of data-plane/errors.ts
// rendered by data-plane/error-shapes.ts as Shape A, B and C must be a well-formed body of that
// shape with the catalog's status. Control plane: every code of control-plane/errors.ts must reach the
// wire as its catalog's gRPC status, the CLI as one line with the matching HTTP-style status, and an
// API client (through GET /v1/usage's reader on a node) as a well-formed body in each shape.
import assert from 'node:assert/strict';
import { STATUS_CODES } from 'node:http';
import { after, before, test } from 'node:test';
import { Server, ServerCredentials, status as GrpcStatus, type sendUnaryData, type ServerUnaryCall } from '@grpc/grpc-js';
import { CATALOG, GatewayError, type ErrorCode } from '../../data-plane/errors.js';
import { renderError, type ErrorShape, type RenderedError } from '../../data-plane/error-shapes.js';
import { UsageClient } from '../../data-plane/sync/usage-client.js';
import { CpError, ERROR_CATALOG, toServiceError, type ErrorCode as CpErrorCode } from '../../control-plane/errors.js';
import { describeError } from '../../cli/output.js';
import { SyncServiceService, type QueryUsageRequest, type QueryUsageResponse } from '../../proto/gen/tollgate/v1/sync.js';

const SHAPES: ErrorShape[] = ['openai', 'gateway', 'passthrough'];
const DATA_CODES = Object.keys(CATALOG) as ErrorCode[];
const CP_CODES = Object.keys(ERROR_CATALOG) as CpErrorCode[];

/** Both 429s answer in Shape A whatever the path (spec, "429 bodies"). */
function effectiveShape(code: ErrorCode, shape: ErrorShape): ErrorShape {
  return code === 'EDGE_RATE_LIMITED' || code === 'KEY_RATE_LIMITED' ? 'openai' : shape;
}

/** Asserts `r` is a well-formed answer of `shape` with `status`; returns the parsed body. */
function assertWellFormed(r: RenderedError, shape: ErrorShape, status: number, what: string): Record<string, any> {
  assert.equal(r.status, status, `${what}: status`);
  assert.equal(r.statusLine, `${status} ${STATUS_CODES[status]}`, `${what}: status line`);
  assert.deepEqual(r.headers.find(([k]) => k === 'content-type'), ['content-type', 'application/json'], `${what}: content-type`);
  const body = JSON.parse(r.body);
  assert.equal(typeof body, 'object', what);
  if (shape === 'openai') {
    assert.deepEqual(Object.keys(body), ['error'], `${what}: Shape A has only "error"`);
    const keys = Object.keys(body.error);
    assert.ok(
      JSON.stringify(keys) === JSON.stringify(['message', 'type', 'param', 'code']) || JSON.stringify(keys) === JSON.stringify(['message', 'type', 'code']),
      `${what}: Shape A fields, got ${keys}`,
    );
    assert.equal(typeof body.error.message, 'string');
    assert.ok(body.error.message.length > 0, `${what}: a message`);
    assert.equal(typeof body.error.type, 'string');
    assert.ok(body.error.type.length > 0, `${what}: a type`);
    assert.ok(body.error.param === undefined || body.error.param === null || typeof body.error.param === 'string', `${what}: param`);
    assert.equal(body.error.code, String(status), `${what}: code is the status as text`);
  } else if (shape === 'gateway') {
    assert.deepEqual(Object.keys(body), ['error'], `${what}: Shape B has only "error"`);
    assert.deepEqual(Object.keys(body.error), ['code', 'message'], `${what}: Shape B fields`);
    assert.match(body.error.code, /^[a-z_]+$/, `${what}: a snake_case code`);
    assert.equal(typeof body.error.message, 'string');
    assert.ok(body.error.message.length > 0, `${what}: a message`);
  } else {
    assert.deepEqual(Object.keys(body), ['detail'], `${what}: Shape C has only "detail"`);
    assert.equal(typeof body.detail, 'string');
    assert.ok(body.detail.length > 0, `${what}: a detail`);
  }
  return body;
}

test('every data-plane catalog entry is an error status with a message', () => {
  assert.ok(DATA_CODES.length >= 20, 'the catalog was read');
  for (const code of DATA_CODES) {
    const e = CATALOG[code];
    assert.ok(e.status >= 400 && e.status <= 599 && STATUS_CODES[e.status], `${code}: ${e.status}`);
    assert.ok(e.message.length > 0 && e.typeA.length > 0 && e.codeB.length > 0, code);
  }
});

test('every data-plane code renders a well-formed body in every shape, with the catalog status', () => {
  for (const code of DATA_CODES) {
    for (const shape of SHAPES) {
      const what = `${code} in Shape ${shape}`;
      const entry = CATALOG[code];
      const eff = effectiveShape(code, shape);
      const body = assertWellFormed(renderError(new GatewayError(code), shape), eff, entry.status, what);
      if (eff === 'openai') {
        assert.equal(body.error.message, entry.message, what);
        assert.equal(body.error.type, entry.typeA, what);
        // The edge 429 carries no param at all (spec, "429 bodies"); every other Shape A has one.
        if (code === 'EDGE_RATE_LIMITED') assert.equal('param' in body.error, false, what);
        else assert.equal(body.error.param, null, what);
      } else if (eff === 'gateway') {
        assert.deepEqual(body, { error: { code: entry.codeB, message: entry.message } }, what);
      } else {
        assert.deepEqual(body, { detail: entry.message }, what);
      }
    }
  }
});

test('options of an error reach every shape: retry-after, Allow, a named param and a tripped dimension', () => {
  for (const code of DATA_CODES) {
    for (const shape of SHAPES) {
      const what = `${code} in Shape ${shape} with options`;
      const err = new GatewayError(code, 'Something specific.', { param: 'messages', type: 'tokens', retryAfterSec: 2.1, allow: 'GET, POST' });
      const r = renderError(err, shape);
      const eff = effectiveShape(code, shape);
      const body = assertWellFormed(r, eff, CATALOG[code].status, what);
      assert.deepEqual(r.headers.find(([k]) => k === 'retry-after'), ['retry-after', '3'], `${what}: retry-after rounded up`);
      assert.deepEqual(r.headers.find(([k]) => k === 'allow'), ['allow', 'GET, POST'], what);
      if (eff === 'openai') {
        assert.equal(body.error.message, 'Something specific.');
        assert.equal(body.error.type, 'tokens');
        if (code !== 'EDGE_RATE_LIMITED') assert.equal(body.error.param, 'messages', what);
      } else if (eff === 'gateway') assert.equal(body.error.message, 'Something specific.');
      else assert.equal(body.detail, 'Something specific.');
    }
  }
});

test('anything that is not a catalog error renders as a well-formed 500 in every shape, without its text', () => {
  for (const thrown of [new Error('secret sk-tollgate-abc leaked in a stack'), 'a string', null, undefined, { code: 'KEY_INVALID' }]) {
    for (const shape of SHAPES) {
      const r = renderError(thrown, shape);
      assertWellFormed(r, shape, 500, `${String(thrown)} in Shape ${shape}`);
      assert.doesNotMatch(r.body, /sk-tollgate|a string/);
    }
  }
});

test("the spec's Shape B codes have the statuses the spec's table gives them", () => {
  const byCodeB = new Map<string, Set<number>>();
  for (const code of DATA_CODES) {
    const { codeB, status } = CATALOG[code];
    if (!byCodeB.has(codeB)) byCodeB.set(codeB, new Set());
    byCodeB.get(codeB)!.add(status);
  }
  assert.deepEqual(byCodeB.get('invalid_api_key'), new Set([401]));
  assert.deepEqual(byCodeB.get('not_found'), new Set([404]));
  assert.deepEqual(byCodeB.get('bad_path'), new Set([400]));
  assert.deepEqual(byCodeB.get('payload_too_large'), new Set([413]));
  assert.deepEqual(byCodeB.get('upstream_unreachable'), new Set([502]));
});

// --- control plane ---

const HTTP_OF: Record<number, number> = {
  [GrpcStatus.UNAUTHENTICATED]: 401,
  [GrpcStatus.PERMISSION_DENIED]: 403,
  [GrpcStatus.NOT_FOUND]: 404,
  [GrpcStatus.INVALID_ARGUMENT]: 400,
  [GrpcStatus.FAILED_PRECONDITION]: 400,
  [GrpcStatus.RESOURCE_EXHAUSTED]: 429,
  [GrpcStatus.INTERNAL]: 500,
};

test('every control-plane code goes on the wire as its catalog gRPC status, and to the CLI as one line with its HTTP status', () => {
  assert.ok(CP_CODES.length >= 9, 'the catalog was read');
  for (const code of CP_CODES) {
    const logged: string[] = [];
    const se = toServiceError(new CpError(code, `why ${code}`), (l) => logged.push(l));
    assert.equal(se.code, ERROR_CATALOG[code], code);
    assert.equal(se.details, `why ${code}`, code);
    assert.deepEqual(logged, [], `${code}: a catalog error is not a bug and is not logged`);
    const http = HTTP_OF[se.code!];
    assert.ok(http, `${code}: gRPC status ${se.code} has an HTTP-style status`);
    const line = describeError(se, '127.0.0.1:50051');
    assert.equal(line.exitCode, 1, code);
    assert.ok(line.line.startsWith(`${http} why ${code}`), `${code}: ${line.line}`);
    assert.doesNotMatch(line.line, /\n/, `${code}: one line`);
  }
  // Anything else is INTERNAL with a reference, logged once, its text kept off the wire.
  const logged: string[] = [];
  const se = toServiceError(new Error('boom sk-tollgate-secret'), (l) => logged.push(l));
  assert.equal(se.code, GrpcStatus.INTERNAL);
  assert.match(String(se.details), /^internal error \(reference [0-9a-f]{12}\)$/);
  assert.equal(logged.length, 1);
  assert.match(describeError(se, 'x').line, /^500 internal error \(reference/);
});

// An API client meets control-plane errors only through GET /v1/usage: the node's usage reader turns
// each into a catalog error of the data plane, which must render well in every shape.
let server: Server;
let usage: UsageClient;

before(async () => {
  server = new Server();
  server.addService(SyncServiceService, {
    connect: (call: any) => call.end(),
    queryUsage: (call: ServerUnaryCall<QueryUsageRequest, QueryUsageResponse>, cb: sendUnaryData<QueryUsageResponse>) => {
      const code = call.request.keyId as CpErrorCode;
      cb(toServiceError(new CpError(code, `why ${code}`), () => {}) as any);
    },
  });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  usage = new UsageClient({ address: `127.0.0.1:${port}`, nodeToken: 'node_test', tls: null, connected: () => true, timeoutMs: 10_000 });
});

after(() => {
  usage?.close();
  server?.forceShutdown();
});

test('every control-plane code, as GET /v1/usage meets it on a node, renders a well-formed body in every shape', async () => {
  for (const code of CP_CODES) {
    const err = await new Promise<GatewayError | null>((resolve) => usage.query({ keyId: code, sinceMs: 0, untilMs: 0, groupBy: 'day' }, (e) => resolve(e)));
    assert.ok(err instanceof GatewayError, `${code} becomes a data-plane catalog error`);
    // A key the control plane no longer knows is the client's 401; every other refusal is not the
    // client's fault: 500 for a query the node should not have sent, else 503 with retry-after.
    const expected: ErrorCode = code === 'NOT_FOUND' ? 'KEY_INVALID' : ERROR_CATALOG[code] === GrpcStatus.INVALID_ARGUMENT ? 'INTERNAL' : 'CONTROL_PLANE_UNAVAILABLE';
    assert.equal(err.code, expected, code);
    for (const shape of SHAPES) {
      const r = renderError(err, shape);
      assertWellFormed(r, shape, CATALOG[expected].status, `${code} via /v1/usage in Shape ${shape}`);
      assert.doesNotMatch(r.body, new RegExp(`why ${code}`), `${code}: the control plane's text stays on the node`);
      if (expected === 'CONTROL_PLANE_UNAVAILABLE') assert.ok(r.headers.some(([k]) => k === 'retry-after'), `${code}: retry-after`);
    }
  }
});
