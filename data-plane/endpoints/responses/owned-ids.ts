// Every upstream object id a Responses API request names, checked against the caller's project before
// the upstream is asked (docs/design.md#owned-ids). All customers share the operator's one upstream
// account, so an id is accepted only when Tollgate recorded it for the key's project (owner records,
// state/response-owners.ts): `previous_response_id`, `conversation` (a string or `{id}`), and
// `item_reference` input items (items seen in answers to the project). Prompt ids are the operator's:
// the tier's list in the config (`responses.prompts`), and so are vector stores (`responses.vector_stores`).
// Upstream files and containers are never created through Tollgate, so naming one is refused. Anything refused is 404 Shape A, the
// same whether the id exists or not. Pure: no I/O.
import type { GatewayState, KeyRecord } from '../../state/key-table.js';
import { GatewayError } from '../../errors.js';
import type { ResponseOwner } from '../../state/response-owners.js';

type Obj = Record<string, unknown>;

/** What the checks need of the owner records. */
export interface OwnerLookup {
  get(id: string, nowMs: number): ResponseOwner | undefined;
}

function isObj(v: unknown): v is Obj {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function notFound(what: string, id: string, param: string): GatewayError {
  return new GatewayError('NOT_FOUND', `No ${what} found with id '${id.slice(0, 128)}'.`, { param });
}

function badType(param: string, expected: string): GatewayError {
  return new GatewayError('INVALID_REQUEST', `Invalid type for '${param}': expected ${expected}.`, { param });
}

/** The owner record of `id` when it is the key's project's and of a model the key may use. */
export function ownedBy(owners: OwnerLookup, key: KeyRecord, id: string, state: GatewayState, nowMs: number): ResponseOwner | undefined {
  const o = owners.get(id, nowMs);
  return o && o.projectId === key.projectId && state.mayUseModel(key, o.model) ? o : undefined;
}

/** The conversation a body names (`conversation` as a string or `{id}`), '' for none, or the 400. */
export function conversationOf(body: Obj): string | GatewayError {
  const c = body.conversation;
  if (c === undefined || c === null) return '';
  if (typeof c === 'string') return c;
  if (isObj(c) && typeof c.id === 'string') return c.id;
  return badType('conversation', 'a conversation id or an object with a string `id`');
}

/** Whether a tier may name the operator's prompt `id` (config `responses.prompts`). */
function tierMayUsePrompt(state: GatewayState, tier: string, id: string): boolean {
  for (const p of state.view.config.responses?.prompts ?? []) if (p.tier === tier && p.promptIds.includes(id)) return true;
  return false;
}

/** Whether a tier may name the operator's vector store `id` (config `responses.vector_stores`). */
function tierMayUseVectorStore(state: GatewayState, tier: string, id: string): boolean {
  for (const v of state.view.config.responses?.vectorStores ?? []) if (v.tier === tier && v.vectorStoreIds.includes(id)) return true;
  return false;
}

/**
 * An item that names a stored item by id: `type: item_reference`, or no type and an id without content
 * (a message needs its content: one without it can only be read as a reference, whatever else it has).
 */
export function isItemReference(item: Obj): boolean {
  if (item.type === 'item_reference') return true;
  return (item.type === undefined || item.type === null) && item.id !== undefined && (item.content === undefined || item.content === null);
}

/**
 * The refusal for the first id a request body names that is not the key's project's (null: all are
 * its own). `itemsField`: where the body's items stand (`input` for a response, `items` for a
 * conversation).
 */
export function namedIdRefusal(body: Obj, key: KeyRecord, state: GatewayState, owners: OwnerLookup, nowMs: number, itemsField: 'input' | 'items' = 'input'): GatewayError | null {
  const owned = (id: string) => ownedBy(owners, key, id, state, nowMs) !== undefined;
  const prev = body.previous_response_id;
  if (prev !== undefined && prev !== null) {
    if (typeof prev !== 'string') return badType('previous_response_id', 'a string');
    if (!owned(prev)) return notFound('response', prev, 'previous_response_id');
  }
  const conv = conversationOf(body);
  if (conv instanceof GatewayError) return conv;
  if (conv !== '' && !owned(conv)) return notFound('conversation', conv, 'conversation');
  const prompt = body.prompt;
  if (prompt !== undefined && prompt !== null) {
    if (!isObj(prompt) || typeof prompt.id !== 'string') return badType('prompt', 'an object with a string `id`');
    if (!tierMayUsePrompt(state, key.org.tier, prompt.id)) return notFound('prompt', prompt.id, 'prompt');
  }
  const items = body[itemsField];
  if (Array.isArray(items)) {
    for (let i = 0; i < items.length; i++) {
      const item = items[i];
      if (!isObj(item)) continue;
      if (isItemReference(item)) {
        const at = `${itemsField}[${i}].id`;
        if (typeof item.id !== 'string') return badType(at, 'a string');
        if (!owned(item.id)) return notFound('item', item.id, at);
      }
      // A file wherever an item can name one: a message's content, a tool output's parts, a screenshot.
      const file = fileIdIn(item, `${itemsField}[${i}]`, 0);
      if (file) return file;
    }
  }
  if (isObj(prompt) && prompt.variables !== undefined) {
    const file = fileIdIn(prompt.variables, 'prompt.variables', 0);
    if (file) return file;
  }
  const tools = body.tools;
  if (Array.isArray(tools)) {
    for (let i = 0; i < tools.length; i++) {
      const t = tools[i];
      if (!isObj(t)) continue;
      const stores = t.vector_store_ids;
      if (Array.isArray(stores)) {
        for (let j = 0; j < stores.length; j++) {
          if (typeof stores[j] !== 'string' || !tierMayUseVectorStore(state, key.org.tier, stores[j] as string)) return notFound('vector store', String(stores[j]), `tools[${i}].vector_store_ids[${j}]`);
        }
      }
      if (typeof t.container === 'string') return notFound('container', t.container, `tools[${i}].container`);
      const files = isObj(t.container) ? t.container.file_ids : undefined;
      if (Array.isArray(files) && files.length > 0) return notFound('file', String(files[0]), `tools[${i}].container.file_ids[0]`);
      const mask = isObj(t.input_image_mask) ? t.input_image_mask.file_id : undefined;
      if (mask !== undefined && mask !== null) return notFound('file', String(mask), `tools[${i}].input_image_mask.file_id`);
    }
  }
  return null;
}

/** The 404 for the first `file_id` named inside `v` (parts of parts, bounded in depth), or null. */
function fileIdIn(v: unknown, at: string, depth: number): GatewayError | null {
  if (depth > 8 || v === null || typeof v !== 'object') return null;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const e = fileIdIn(v[i], `${at}[${i}]`, depth + 1);
      if (e) return e;
    }
    return null;
  }
  for (const [k, x] of Object.entries(v)) {
    if (k === 'file_id' && x !== undefined && x !== null) return notFound('file', String(x), `${at}.file_id`);
    const e = fileIdIn(x, `${at}.${k}`, depth + 1);
    if (e) return e;
  }
  return null;
}
