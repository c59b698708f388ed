// One path classifier: for every path, the edge budgets, the body cap, the error shape and the route
// kind must come from the same family (data-plane/routing/path-families.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ToolBackend } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../../data-plane/errors.js';
import { RouteTable, shapeOf } from '../../data-plane/routing/routes.js';
import { bodyCapBytes, matchEdgeBudgets } from '../../data-plane/limits/edge-budgets.js';
import { familyOf, PATH_FAMILIES } from '../../data-plane/routing/path-families.js';

const MIB = 1024 * 1024;
const routes = new RouteTable([
  ToolBackend.fromPartial({ prefix: '/v1/files', baseUrl: 'http://files', timeoutMs: 1 }),
  ToolBackend.fromPartial({ prefix: '/v1/pdf', baseUrl: 'http://pdf', timeoutMs: 1 }),
  ToolBackend.fromPartial({ prefix: '/v1/route', baseUrl: 'http://route', timeoutMs: 1 }),
]);

/** The route kind a path reaches (whatever the method), or 404. */
function routeOf(path: string): string {
  for (const method of ['GET', 'POST']) {
    const r = routes.match(path, method);
    if (!(r instanceof GatewayError)) return r.kind;
    if (r.code === 'NOT_FOUND') return '404';
  }
  return '405';
}

// [path, path budget on top of the general /v1 one (null: none; 'outside': no budget at all), cap MiB, shape, route]
type Row = [string, string | null, number, 'openai' | 'gateway', string];
const rows: Row[] = [
  // Model endpoints: the general budget only, 32 MiB, Shape A; the router knows exact paths.
  ['/v1/chat/completions', null, 32, 'openai', 'chat'],
  ['/v1/chat/completionz', null, 32, 'openai', '404'],
  ['/v1/chat', null, 32, 'gateway', '404'],
  ['/v1/embeddings', null, 32, 'openai', 'embeddings'],
  ['/v1/embeddings/x', null, 32, 'openai', '404'],
  ['/v1/embeddingsx', null, 32, 'gateway', '404'],
  ['/v1/completions', null, 32, 'openai', '404'],
  // `/v1/models` and `/v1/models/{id}`: the 120 group, 64 MiB, Shape A; `/v1/modelsx` is not a model path.
  ['/v1/models', 'group120', 64, 'openai', 'models'],
  ['/v1/models/demo-chat', 'group120', 64, 'openai', 'model'],
  ['/v1/models/demo-chat/x', 'group120', 64, 'openai', '404'],
  ['/v1/models/', 'group120', 64, 'openai', '404'],
  ['/v1/modelsx', null, 32, 'gateway', '404'],
  // `/v1/usage` (Tollgate's own): the general budget only, Shape A; only the exact path is a route.
  ['/v1/usage', null, 32, 'openai', 'usage'],
  ['/v1/usage/proj_x', null, 32, 'openai', '404'],
  ['/v1/usagex', null, 32, 'gateway', '404'],
  // `/v1/audio/voices` (and below it) before `/v1/audio/*`; `/v1/audio` itself is neither.
  ['/v1/audio/voices', 'voices', 32, 'openai', 'voices'],
  ['/v1/audio/voices/alloy', 'voices', 32, 'openai', '404'],
  ['/v1/audio/voicesx', 'audio', 200, 'openai', '404'],
  ['/v1/audio/speech', 'audio', 200, 'openai', 'speech'],
  ['/v1/audio/transcriptions', 'audio', 200, 'openai', 'transcriptions'],
  ['/v1/audio/', 'audio', 200, 'openai', '404'],
  ['/v1/audio', null, 32, 'gateway', '404'],
  // `/v1/files*` as written: a plain prefix, so `/v1/filesystem` is a files path everywhere.
  ['/v1/files', 'files', 256, 'gateway', 'tool'],
  ['/v1/files/file-1/content', 'files', 256, 'gateway', 'tool'],
  ['/v1/filesystem', 'files', 256, 'gateway', 'tool'],
  // `/v1/pdf*`, `/v1/skills*`, `/v1/mcp*`, `/v1/vector_stores*`: plain prefixes too.
  ['/v1/pdf', 'group120', 64, 'gateway', 'tool'],
  ['/v1/pdf/render', 'group120', 64, 'gateway', 'tool'],
  ['/v1/pdfx', 'group120', 64, 'gateway', 'tool'],
  ['/v1/skills', 'group120', 64, 'gateway', 'tool'],
  ['/v1/skills/x', 'group120', 64, 'gateway', 'tool'],
  ['/v1/skillset', 'group120', 64, 'gateway', 'tool'],
  ['/v1/mcp', 'group120', 64, 'gateway', 'tool'],
  ['/v1/mcp/server/x', 'group120', 64, 'gateway', 'tool'],
  ['/v1/mcpx', 'group120', 64, 'gateway', 'tool'],
  ['/v1/vector_stores', 'group120', 64, 'gateway', 'tool'],
  ['/v1/vector_stores/vs_1/files', 'group120', 64, 'gateway', 'tool'],
  ['/v1/vector_storesx', 'group120', 64, 'gateway', 'tool'],
  // `/v1/sandbox/*` needs the slash.
  ['/v1/sandbox/run', 'group120', 64, 'gateway', 'tool'],
  ['/v1/sandbox/', 'group120', 64, 'gateway', 'tool'],
  ['/v1/sandbox', null, 32, 'gateway', '404'],
  ['/v1/sandboxx', null, 32, 'gateway', '404'],
  // `/v1/route`: the path and its sub-paths, not `/v1/router`.
  ['/v1/route', 'group120', 64, 'gateway', 'tool'],
  ['/v1/route/x', 'group120', 64, 'gateway', 'tool'],
  ['/v1/route/', 'group120', 64, 'gateway', 'tool'],
  ['/v1/router', null, 32, 'gateway', '404'],
  ['/v1/routes', null, 32, 'gateway', '404'],
  // `/v1/realtime*`: a plain prefix; no body cap of its own; refusals in the model endpoints' shape.
  ['/v1/realtime', 'realtime', 32, 'openai', 'realtime'],
  ['/v1/realtime/sessions', 'realtime', 32, 'openai', 'realtime'],
  ['/v1/realtimex', 'realtime', 32, 'openai', 'realtime'],
  // Anything else under /v1: the general budget, 32 MiB, Shape B, 404.
  ['/v1', null, 32, 'gateway', '404'],
  ['/v1/', null, 32, 'gateway', '404'],
  ['/v1/nope', null, 32, 'gateway', '404'],
  // Outside /v1: no edge budget at all.
  ['/v1x', 'outside', 32, 'gateway', '404'],
  ['/V1/models', 'outside', 32, 'gateway', '404'],
  ['/healthz', 'outside', 32, 'gateway', '404'],
  ['/', 'outside', 32, 'gateway', '404'],
];

test('each path has one family: edge budgets, body cap, error shape and route kind agree', () => {
  // Before: `/v1/route/x` was routed as a tool but counted outside the 120 group, and `/v1/filesX` was
  // routed as files but counted and capped as a general path.
  for (const [path, budget, capMib, shape, route] of rows) {
    const wantBudgets = budget === 'outside' ? [] : budget === null ? ['credentialed'] : ['credentialed', budget];
    assert.deepEqual(matchEdgeBudgets(path, true), wantBudgets, `${path}: edge budgets`);
    assert.deepEqual(matchEdgeBudgets(path, false), wantBudgets.map((b) => (b === 'credentialed' ? 'anonymous' : b)), `${path}: edge budgets without a credential`);
    assert.equal(bodyCapBytes(path), capMib * MIB, `${path}: body cap`);
    assert.equal(shapeOf(path), shape, `${path}: error shape`);
    assert.equal(routeOf(path), route, `${path}: route`);
  }
});

test('a query never changes the family', () => {
  for (const [path, , capMib] of rows) {
    assert.deepEqual(matchEdgeBudgets(`${path}?x=/v1/files`, true), matchEdgeBudgets(path, true), path);
    assert.equal(bodyCapBytes(`${path}?x=1`), capMib * MIB, path);
  }
});

test('the family table: tool families answer in Shape B, model families in Shape A, and the catch-alls come last', () => {
  for (const f of PATH_FAMILIES) {
    if (f.router === 'tool') assert.equal(f.shape, 'gateway', f.name);
    if (f.router === 'model') assert.equal(f.shape, 'openai', f.name);
  }
  assert.equal(PATH_FAMILIES.at(-2)!.name, 'v1');
  assert.equal(PATH_FAMILIES.at(-1)!.name, 'outside');
  // Classification is stable for the same string (the memo) and for an equal one.
  assert.equal(familyOf('/v1/route/x'), familyOf(`/v1/route/${'x'}`));
});
