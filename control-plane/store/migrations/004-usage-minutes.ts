// Usage is kept summed per project, key, model and minute instead of one row per model call: nodes
// send it summed that way (Report.usage_totals), so a report costs the control plane one upsert per
// key and model in it, however many requests it covers. Each call's own record (status, path, latency,
// tokens, cost) is in the request logs. The rows of the older `usage` table are summed into the new one.
export const sql = `
CREATE TABLE usage_minutes (
  project_id TEXT NOT NULL,
  minute INTEGER NOT NULL,
  key_id TEXT NOT NULL,
  model TEXT NOT NULL,
  org_id TEXT NOT NULL,
  requests INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  cost_micros INTEGER NOT NULL,
  PRIMARY KEY (project_id, minute, key_id, model)
) WITHOUT ROWID;
CREATE INDEX usage_minutes_by_org ON usage_minutes(org_id, minute);

INSERT INTO usage_minutes (project_id, minute, key_id, model, org_id, requests, prompt_tokens, completion_tokens, cost_micros)
  SELECT project_id, at_ms / 60000, key_id, model, MIN(org_id), COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_micros)
  FROM usage GROUP BY project_id, at_ms / 60000, key_id, model;

DROP TABLE usage;
`;
