// The deployment (upstream account) of a pooled model that holds each stored response, conversation
// or item: requests naming one go to that deployment only (docs/design.md#upstream-pools). Empty for
// a model with one upstream, and for records made before.
export const sql = `
ALTER TABLE stored_responses ADD COLUMN deployment TEXT NOT NULL DEFAULT '';
`;
