// The one path classifier. Every raw path (no query) falls in exactly one family, and the family alone
// decides the path-specific edge budget, the body cap, the error shape before routing and which part of
// the router handles it, so edge budgets, body caps and the router can never disagree about a path.
// Pure and I/O-free.
//
// Match rules, read from the spec's tables (docs/design.md#path-families):
// - 'prefix': the path starts with `base`. Used where the spec writes `*` right after a name
//   (`/v1/files*`, `/v1/pdf*`, `/v1/skills*`, `/v1/mcp*`, `/v1/vector_stores*`, `/v1/realtime*`), and
//   where it writes `/*` (`/v1/audio/*`, `/v1/sandbox/*`: the slash is part of `base`).
// - 'under': `base` itself or a sub-path of it (`base/…`). Used for paths the spec names without a
//   wildcard: `/v1/models` (and `/v1/models/{id}`), `/v1/route`, `/v1/audio/voices`, `/v1/embeddings`,
//   and Tollgate's own `/v1/usage`.
// Matching is on the raw path as sent, case-sensitive; the first family that matches wins, so
// `/v1/audio/voices` comes before `/v1/audio/`. Paths that fail path sanity never get past the edge
// budgets and body cap counted here (they answer 400 `bad_path` right after).

import type { ErrorShape } from '../errors.js';

/** Path-specific edge budgets, counted on top of the general `/v1/*` budget. */
export type PathBudget = 'voices' | 'audio' | 'files' | 'group120' | 'realtime';

/** Which part of the router serves a family: exact model routes, tool pass-through, realtime, or nothing (404). */
export type RouterKind = 'model' | 'tool' | 'realtime' | 'none';

export interface PathFamily {
  readonly name: string;
  readonly match: 'prefix' | 'under' | 'any';
  readonly base: string;
  /** False only outside `/v1`: such paths count in no edge budget at all. */
  readonly generalBudget: boolean;
  readonly pathBudget: PathBudget | null;
  readonly bodyCapBytes: number;
  /** The error shape of every answer before routing (a 401 on a mistyped chat path looks like one on chat). */
  readonly shape: Exclude<ErrorShape, 'passthrough'>;
  readonly router: RouterKind;
}

// MB in the spec means MiB (1024 × 1024 bytes) here: the binary reading is the more generous one, so
// no client sending "32 MB" as its tools count it is ever refused.
const MIB = 1024 * 1024;
export const BODY_CAP_GENERAL_BYTES = 32 * MIB;
export const BODY_CAP_AUDIO_BYTES = 200 * MIB;
export const BODY_CAP_FILES_BYTES = 256 * MIB;
export const BODY_CAP_GROUP120_BYTES = 64 * MIB;

function family(name: string, match: PathFamily['match'], base: string, pathBudget: PathBudget | null, bodyCapBytes: number, shape: PathFamily['shape'], router: RouterKind): PathFamily {
  return Object.freeze({ name, match, base, generalBudget: name !== 'outside', pathBudget, bodyCapBytes, shape, router });
}

/** The spec's edge table as families, in matching order. */
export const PATH_FAMILIES: readonly PathFamily[] = Object.freeze([
  // Model endpoints of the general budget. `/v1/chat/` keeps mistyped chat paths in Shape A.
  family('chat', 'prefix', '/v1/chat/', null, BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  family('embeddings', 'under', '/v1/embeddings', null, BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  family('completions', 'under', '/v1/completions', null, BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  // The Responses API and its stored responses (`/v1/responses/{id}…`): a model endpoint, general budget.
  family('responses', 'under', '/v1/responses', null, BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  // The Conversations API (conversations and their items, kept by the upstream): the same.
  family('conversations', 'under', '/v1/conversations', null, BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  // The spec gives voices no cap of its own: the general 32 MiB applies.
  family('voices', 'under', '/v1/audio/voices', 'voices', BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  family('audio', 'prefix', '/v1/audio/', 'audio', BODY_CAP_AUDIO_BYTES, 'openai', 'model'),
  family('models', 'under', '/v1/models', 'group120', BODY_CAP_GROUP120_BYTES, 'openai', 'model'),
  // GET /v1/usage: the caller's own project's usage. Not in the spec's edge table: the general budget only.
  family('usage', 'under', '/v1/usage', null, BODY_CAP_GENERAL_BYTES, 'openai', 'model'),
  family('files', 'prefix', '/v1/files', 'files', BODY_CAP_FILES_BYTES, 'gateway', 'tool'),
  family('pdf', 'prefix', '/v1/pdf', 'group120', BODY_CAP_GROUP120_BYTES, 'gateway', 'tool'),
  family('skills', 'prefix', '/v1/skills', 'group120', BODY_CAP_GROUP120_BYTES, 'gateway', 'tool'),
  family('mcp', 'prefix', '/v1/mcp', 'group120', BODY_CAP_GROUP120_BYTES, 'gateway', 'tool'),
  family('vector_stores', 'prefix', '/v1/vector_stores', 'group120', BODY_CAP_GROUP120_BYTES, 'gateway', 'tool'),
  family('sandbox', 'prefix', '/v1/sandbox/', 'group120', BODY_CAP_GROUP120_BYTES, 'gateway', 'tool'),
  family('route', 'under', '/v1/route', 'group120', BODY_CAP_GROUP120_BYTES, 'gateway', 'tool'),
  // Connection attempts; the spec gives realtime no cap of its own. Shape A: its refusals are the
  // model endpoints' (a realtime model is a model).
  family('realtime', 'prefix', '/v1/realtime', 'realtime', BODY_CAP_GENERAL_BYTES, 'openai', 'realtime'),
  // Any other `/v1` path: the general budget, 32 MiB, Shape B, 404 after authentication.
  family('v1', 'under', '/v1', null, BODY_CAP_GENERAL_BYTES, 'gateway', 'none'),
  family('outside', 'any', '', null, BODY_CAP_GENERAL_BYTES, 'gateway', 'none'),
]);

function matches(f: PathFamily, path: string): boolean {
  switch (f.match) {
    case 'prefix':
      return path.startsWith(f.base);
    case 'under':
      return path.startsWith(f.base) && (path.length === f.base.length || path.charCodeAt(f.base.length) === 47 /* / */);
    case 'any':
      return true;
  }
}

// One request asks for its family several times (shape, edge, cap, route) with the same string.
let lastPath = '';
let lastFamily: PathFamily = PATH_FAMILIES[PATH_FAMILIES.length - 1];

/** The family of a raw path. A query, if left on, is ignored. */
export function familyOf(path: string): PathFamily {
  if (path === lastPath) return lastFamily;
  const q = path.indexOf('?');
  const p = q === -1 ? path : path.slice(0, q);
  let found = PATH_FAMILIES[PATH_FAMILIES.length - 1];
  for (const f of PATH_FAMILIES) {
    if (matches(f, p)) {
      found = f;
      break;
    }
  }
  lastPath = path;
  lastFamily = found;
  return found;
}
