// The deployment (upstream account) of a pooled model that holds each stored response, conversation
// or item: requests naming one go to that deployment only (docs/design.md#upstream-pools). Empty for
// a model with one upstream, and for records made before. And an index by project: a node holds
// the records of the projects it serves, and asks for a project's when it starts serving it.
export const sql = `
ALTER TABLE stored_responses ADD COLUMN deployment TEXT NOT NULL DEFAULT '';
CREATE INDEX stored_responses_by_project ON stored_responses(project_id, seq);
`;
