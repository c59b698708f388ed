// Who created each stored response of the Responses API (`resp_…`): nodes report the responses they
// create, every node is sent every record (after `seq`, its own numbering, apart from the key version:
// responses are many and short-lived, keys few), and a record is deleted once past the upstream's
// retention (30 days), by `created_at_ms`.
export const sql = `
CREATE TABLE stored_responses (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  response_id TEXT NOT NULL UNIQUE,
  project_id TEXT NOT NULL,
  model TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL
);
CREATE INDEX stored_responses_by_created ON stored_responses(created_at_ms);
`;
