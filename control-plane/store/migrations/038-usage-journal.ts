// Usage is journaled, then folded (docs/design.md#usage-is-journaled-then-folded). A report's usage
// rows are appended to usage_journal in the report's own transaction (a few pages at the table's tail,
// whatever the keys), and folded into usage_folded, summed per project, minute, key and model, every
// few seconds for every report since, in one transaction that also deletes what it folded. The view
// usage_minutes is both, so every reader sums acknowledged usage whether or not it is folded yet.
export const sql = `
ALTER TABLE usage_minutes RENAME TO usage_folded;
CREATE TABLE usage_journal (
  id INTEGER PRIMARY KEY,
  project_id TEXT NOT NULL,
  minute INTEGER NOT NULL,
  key_id TEXT NOT NULL,
  model TEXT NOT NULL,
  org_id TEXT NOT NULL,
  requests INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  cost_micros INTEGER NOT NULL
);
CREATE VIEW usage_minutes AS
  SELECT project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros FROM usage_folded
  UNION ALL
  SELECT project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros FROM usage_journal;
`;
