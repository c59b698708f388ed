// The paths of stored responses (the Responses API): `/v1/responses/{id}` (GET, DELETE),
// `/v1/responses/{id}/input_items` (GET) and `/v1/responses/{id}/cancel` (POST). Pure: no I/O;
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
