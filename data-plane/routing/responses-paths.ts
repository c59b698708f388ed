// The paths of stored responses (the Responses API): `/v1/responses/{id}` (GET, DELETE),
// `/v1/responses/{id}/input_items` (GET) and `/v1/responses/{id}/cancel` (POST), and of the
// Conversations API (`/v1/conversations`, `/{id}`, `/{id}/items`, `/{id}/items/{item_id}`). Pure: no I/O;
// routes.ts builds their route objects once, so matching allocates nothing but the id it reads.

export type StoredAction = 'response' | 'input_items' | 'cancel';

const BASE = '/v1/responses/';
/** An id as the upstream makes them (`resp_…`): letters, digits, `_` and `-`, at most 128. */
const ID_RE = /^[A-Za-z0-9_-]{1,128}$/;

/** The methods each stored-response path takes. */
export const STORED_METHODS: Readonly<Record<StoredAction, readonly string[]>> = {
  response: ['GET', 'DELETE'],
  input_items: ['GET'],
  cancel: ['POST'],
};

/** The stored response a path names and what is asked of it, or null when the path names none. */
export function parseStoredResponsePath(path: string): { id: string; action: StoredAction } | null {
  if (!path.startsWith(BASE)) return null;
  const rest = path.slice(BASE.length);
  const slash = rest.indexOf('/');
  const id = slash === -1 ? rest : rest.slice(0, slash);
  if (!ID_RE.test(id)) return null;
  if (slash === -1) return { id, action: 'response' };
  const tail = rest.slice(slash + 1);
  if (tail === 'input_items') return { id, action: 'input_items' };
  if (tail === 'cancel') return { id, action: 'cancel' };
  return null;
}

/** What a Conversations API path names (`/v1/conversations…`). */
export type ConversationAction = 'create' | 'conversation' | 'items' | 'item';

export interface ConversationPath {
  action: ConversationAction;
  /** The conversation (`conv_…`); '' for create. */
  id: string;
  /** The item of `/{id}/items/{item_id}`; '' otherwise. */
  itemId: string;
}

/** The methods each conversation path takes (OpenAI's Conversations API; update is a POST). */
export const CONVERSATION_METHODS: Readonly<Record<ConversationAction, readonly string[]>> = {
  create: ['POST'],
  conversation: ['GET', 'POST', 'DELETE'],
  items: ['GET', 'POST'],
  item: ['GET', 'DELETE'],
};

const CONVERSATIONS = '/v1/conversations';

/** The conversation a path names and what is asked of it, or null when the path is none of them. */
export function parseConversationPath(path: string): ConversationPath | null {
  if (path === CONVERSATIONS) return { action: 'create', id: '', itemId: '' };
  if (!path.startsWith(CONVERSATIONS + '/')) return null;
  const parts = path.slice(CONVERSATIONS.length + 1).split('/');
  if (!ID_RE.test(parts[0])) return null;
  if (parts.length === 1) return { action: 'conversation', id: parts[0], itemId: '' };
  if (parts[1] !== 'items' || parts.length > 3) return null;
  if (parts.length === 2) return { action: 'items', id: parts[0], itemId: '' };
  return ID_RE.test(parts[2]) ? { action: 'item', id: parts[0], itemId: parts[2] } : null;
}
