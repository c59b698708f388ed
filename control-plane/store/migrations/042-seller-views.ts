// Stable views for a seller's own queries (issue 35, deliverable 6; docs/operating.md#reading-the-database):
// usage per UTC day by organisation, project, key and model (from usage_minutes), and each
// organisation's balance. The balance needs the tiers' free grants, which live in the config file:
// the control plane writes them to tier_settings whenever it publishes a config (start, reload).
export const sql = `
CREATE TABLE tier_settings (
  tier TEXT PRIMARY KEY,
  free_grant_micros INTEGER NOT NULL,
  monthly_cap_micros INTEGER
);

CREATE VIEW usage_daily AS
  SELECT strftime('%Y-%m-%d', minute * 60, 'unixepoch') AS day, org_id, project_id, key_id, model,
    SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens, SUM(cost_micros) AS cost_micros
  FROM usage_minutes
  GROUP BY strftime('%Y-%m-%d', minute * 60, 'unixepoch'), org_id, project_id, key_id, model;

CREATE VIEW org_balances AS
  SELECT o.id AS org_id, o.name, o.tier, o.credits_micros,
    CASE WHEN o.free_grant = 0 THEN 0 ELSE COALESCE(t.free_grant_micros, 0) END AS free_grant_micros,
    o.spend_total_micros,
    CASE WHEN o.free_grant = 0 THEN 0 ELSE COALESCE(t.free_grant_micros, 0) END + o.credits_micros - o.spend_total_micros AS balance_micros,
    o.synced_blocked_reason AS blocked_reason
  FROM orgs o LEFT JOIN tier_settings t ON t.tier = o.tier;
`;

/** PostgreSQL's text: the day of a minute is written with to_char, the rest as pgDdl writes it. */
export const pgSql = `
CREATE TABLE tier_settings (
  tier TEXT COLLATE "C" PRIMARY KEY,
  free_grant_micros BIGINT NOT NULL,
  monthly_cap_micros BIGINT
);

CREATE VIEW usage_daily AS
  SELECT to_char(to_timestamp(minute * 60) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, org_id, project_id, key_id, model,
    SUM(requests)::bigint AS requests, SUM(prompt_tokens)::bigint AS prompt_tokens, SUM(completion_tokens)::bigint AS completion_tokens, SUM(cost_micros)::bigint AS cost_micros
  FROM usage_minutes
  GROUP BY 1, org_id, project_id, key_id, model;

CREATE VIEW org_balances AS
  SELECT o.id AS org_id, o.name, o.tier, o.credits_micros,
    CASE WHEN o.free_grant = 0 THEN 0 ELSE COALESCE(t.free_grant_micros, 0) END AS free_grant_micros,
    o.spend_total_micros,
    CASE WHEN o.free_grant = 0 THEN 0 ELSE COALESCE(t.free_grant_micros, 0) END + o.credits_micros - o.spend_total_micros AS balance_micros,
    o.synced_blocked_reason AS blocked_reason
  FROM orgs o LEFT JOIN tier_settings t ON t.tier = o.tier;
`;
