// One fixture for end-to-end tests: a control plane, N nodes and an operator console client, started
// on port 0 and stopped by the fixture itself; funded keys on demand (account, organisation on a
// tier, project, key, optional credit, known to every node before the call returns); and the shape
// assertions every file needs (Shape A/B/C error bodies, rate-limit headers). See docs/testing.md.
//
// Two ways in:
//   const gw = gatewayFixture({ nodes: 2 });        // at file level: before/after hooks of the file
//   const gw = await startGateway(t, { nodes: 1 }); // inside one test: stopped in t.after
import assert from 'node:assert/strict';
import { after, before } from 'node:test';
import { consoleClient, createKey, type Console, type DemoKey } from './console.js';
import { waitUntilKnown } from './data-plane.js';
import {
  startControlPlane,
  startDataPlane,
  type ControlPlane,
  type ControlPlaneOptions,
  type DataPlane,
  type DataPlaneOptions,
} from './processes.js';

export interface GatewayOptions {
  /** Options for the control plane (config YAML, admin listener, flags…). */
  controlPlane?: ControlPlaneOptions;
  /** How many nodes (all with `node`'s options), or one options object per node. Default 1; 0 for none. */
  nodes?: number | DataPlaneOptions[];
  /** Options for every node when `nodes` is a number. */
  node?: DataPlaneOptions;
}

export interface FundedKeyOptions {
  tier?: string;
  /** Credit added to the organisation, in integer micro-dollars (none by default). */
  creditMicros?: number;
  allowedModels?: string[];
  name?: string;
  /** Reuse an organisation/project instead of creating an account, organisation and project. */
  orgId?: string;
  projectId?: string;
  /** Nodes that must know the key before the call returns (default: every node of the gateway). */
  knownOn?: DataPlane[];
}

export interface Gateway {
  cp: ControlPlane;
  nodes: DataPlane[];
  /** The first node. */
  node: DataPlane;
  /** A console client with the operator token. */
  console: Console;
  /** Account, organisation on a tier, project and key (plus credit), known on the nodes. */
  fundedKey(opts?: FundedKeyOptions): Promise<DemoKey>;
  /** Starts one more node on this control plane, stopped with the rest. */
  addNode(opts?: DataPlaneOptions): Promise<DataPlane>;
  /** Stops everything this fixture started (idempotent). */
  close(): Promise<void>;
}

function nodeOptions(opts: GatewayOptions): DataPlaneOptions[] {
  if (Array.isArray(opts.nodes)) return opts.nodes;
  return Array.from({ length: opts.nodes ?? 1 }, () => ({ ...opts.node }));
}

/** Starts a gateway; the caller stops it with `close()` (or use startGateway/gatewayFixture). */
export async function launchGateway(opts: GatewayOptions = {}): Promise<Gateway> {
  const cp = await startControlPlane(opts.controlPlane);
  const started: DataPlane[] = [];
  const consoleC = consoleClient(cp.address, cp.secrets.operatorToken);
  let closed = false;
  const gw: Gateway = {
    cp,
    nodes: started,
    get node() {
      return started[0];
    },
    console: consoleC,
    async fundedKey(k = {}) {
      const key = await createKey(consoleC, k);
      if (k.creditMicros) await consoleC.creditOrg({ orgId: key.orgId, amountMicros: k.creditMicros, note: 'test fixture' });
      await Promise.all((k.knownOn ?? started).map((n) => waitUntilKnown(n.url, key.key)));
      return key;
    },
    async addNode(o = {}) {
      const n = await startDataPlane(cp, o);
      started.push(n);
      return n;
    },
    async close() {
      if (closed) return;
      closed = true;
      consoleC.close();
      await Promise.all([...started.map((n) => n.proc.kill('SIGKILL')), cp.proc.kill('SIGKILL')]);
    },
  };
  try {
    started.push(...(await Promise.all(nodeOptions(opts).map((o) => startDataPlane(cp, o)))));
  } catch (e) {
    await gw.close();
    throw e;
  }
  return gw;
}

/** Starts a gateway for one test and stops it in `t.after`. */
export async function startGateway(t: { after(fn: () => unknown): void }, opts: GatewayOptions = {}): Promise<Gateway> {
  const gw = await launchGateway(opts);
  t.after(() => gw.close());
  return gw;
}

/**
 * A gateway for the whole file: started in a `before` hook, stopped in an `after` hook. The returned
 * object's fields are usable once the tests run (not at module level). `then` runs in the same hook
 * once the gateway is up (file-level setup: keys, clocks, variables): on Node 20 a file's top-level
 * `before` hooks start as they are registered, so a second `before` would not wait for this one.
 */
export function gatewayFixture(
  opts: GatewayOptions | (() => GatewayOptions | Promise<GatewayOptions>) = {},
  then?: (gw: Gateway) => unknown,
): Gateway {
  let gw: Gateway | undefined;
  const ready = (): Gateway => {
    if (!gw) throw new Error('gateway fixture used before its before() hook ran');
    return gw;
  };
  before(async () => {
    gw = await launchGateway(typeof opts === 'function' ? await opts() : opts);
    await then?.(gw);
  });
  after(async () => {
    await gw?.close();
  });
  return {
    get cp() {
      return ready().cp;
    },
    get nodes() {
      return ready().nodes;
    },
    get node() {
      return ready().node;
    },
    get console() {
      return ready().console;
    },
    fundedKey: (k) => ready().fundedKey(k),
    addNode: (o) => ready().addNode(o),
    close: async () => gw?.close(),
  };
}

// ---- Shape assertions (spec, Errors) ----

interface ErrorResponse {
  status: number;
  body: any;
  text?: string;
}

function show(r: ErrorResponse): string {
  return r.text ?? JSON.stringify(r.body);
}

/**
 * Shape A (model endpoints): `{ error: { message, type, param, code } }`, `code` the status as text.
 * `param: 'absent'` for the edge 429, which has no `param`.
 */
export function assertShapeA(
  r: ErrorResponse,
  status: number,
  expect: { type?: string; param?: string | null | 'absent'; message?: RegExp } = {},
): void {
  assert.equal(r.status, status, show(r));
  assert.ok(r.body && typeof r.body === 'object', `a JSON body: ${show(r)}`);
  assert.deepEqual(Object.keys(r.body), ['error'], show(r));
  const e = r.body.error;
  const keys = expect.param === 'absent' ? ['code', 'message', 'type'] : ['code', 'message', 'param', 'type'];
  assert.deepEqual(Object.keys(e).sort(), keys, show(r));
  assert.equal(e.code, String(status), show(r));
  assert.equal(typeof e.message, 'string', show(r));
  assert.equal(typeof e.type, 'string', show(r));
  if (expect.param !== 'absent') assert.ok(e.param === null || typeof e.param === 'string', `param is a string or null: ${show(r)}`);
  if (expect.type !== undefined) assert.equal(e.type, expect.type, show(r));
  if (expect.param !== undefined && expect.param !== 'absent') assert.equal(e.param, expect.param, show(r));
  if (expect.message) assert.match(e.message, expect.message, show(r));
}

/** The gateway layer's codes in front of tool endpoints (spec, Shape B). */
export const SHAPE_B_CODES = ['invalid_api_key', 'not_found', 'bad_path', 'payload_too_large', 'upstream_unreachable'] as const;

/** Shape B (the gateway in front of tool endpoints): exactly `{ error: { code, message } }`. */
export function assertShapeB(r: ErrorResponse, status: number, code: (typeof SHAPE_B_CODES)[number], message?: RegExp): void {
  assert.equal(r.status, status, show(r));
  assert.ok(r.body && typeof r.body === 'object', `a JSON body: ${show(r)}`);
  assert.deepEqual(Object.keys(r.body), ['error'], show(r));
  assert.deepEqual(Object.keys(r.body.error).sort(), ['code', 'message'], show(r));
  assert.equal(r.body.error.code, code, show(r));
  assert.equal(typeof r.body.error.message, 'string', show(r));
  if (message) assert.match(r.body.error.message, message, show(r));
}

/** Shape C (a backend's own answer passed through): a JSON object with a string `detail`. */
export function assertShapeC(r: ErrorResponse, status: number, detail?: string | RegExp): void {
  assert.equal(r.status, status, show(r));
  assert.ok(r.body && typeof r.body === 'object', `a JSON body: ${show(r)}`);
  assert.equal(typeof r.body.detail, 'string', show(r));
  if (typeof detail === 'string') assert.equal(r.body.detail, detail, show(r));
  else if (detail) assert.match(r.body.detail, detail, show(r));
}

/**
 * The rate-limit headers (spec, Limits: Response headers): limit and remaining for requests and for
 * tokens, non-negative integers with remaining ≤ limit; the limits equal `expect`'s when given.
 * Returns the four values.
 */
export function assertRateLimitHeaders(
  headers: Headers,
  expect: { requests?: number; tokens?: number; remainingRequests?: number } = {},
): { limitRequests: number; remainingRequests: number; limitTokens: number; remainingTokens: number } {
  const num = (name: string): number => {
    const v = headers.get(name);
    assert.ok(v !== null, `${name} present`);
    assert.match(v, /^\d+$/, `${name} is a non-negative integer: ${v}`);
    return Number(v);
  };
  const out = {
    limitRequests: num('x-ratelimit-limit-requests'),
    remainingRequests: num('x-ratelimit-remaining-requests'),
    limitTokens: num('x-ratelimit-limit-tokens'),
    remainingTokens: num('x-ratelimit-remaining-tokens'),
  };
  assert.ok(out.remainingRequests <= out.limitRequests, `remaining requests ≤ limit: ${JSON.stringify(out)}`);
  assert.ok(out.remainingTokens <= out.limitTokens, `remaining tokens ≤ limit: ${JSON.stringify(out)}`);
  if (expect.requests !== undefined) assert.equal(out.limitRequests, expect.requests);
  if (expect.tokens !== undefined) assert.equal(out.limitTokens, expect.tokens);
  if (expect.remainingRequests !== undefined) assert.equal(out.remainingRequests, expect.remainingRequests);
  return out;
}

/** A 429's `retry-after`: present, whole seconds, at most a minute. */
export function assertRetryAfter(headers: Headers): number {
  const v = headers.get('retry-after');
  assert.ok(v !== null, 'retry-after present on a 429');
  assert.match(v, /^\d+$/);
  const s = Number(v);
  assert.ok(s >= 0 && s <= 60, `retry-after within a minute: ${s}`);
  return s;
}
