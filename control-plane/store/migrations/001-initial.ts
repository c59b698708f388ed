// Initial schema. Timestamps are RFC 3339 UTC strings ('' = never) except *_ms columns (ms since epoch).
export const sql = `
CREATE TABLE accounts (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  token_hash TEXT NOT NULL UNIQUE,
  created_at TEXT NOT NULL
);

CREATE TABLE orgs (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  tier TEXT NOT NULL,
  own_cap_micros INTEGER,
  credits_micros INTEGER NOT NULL DEFAULT 0,
  spend_total_micros INTEGER NOT NULL DEFAULT 0,
  -- The blocked reason last published to nodes ('' = not blocked): compared to detect a change.
  synced_blocked_reason TEXT NOT NULL DEFAULT '',
  created_at TEXT NOT NULL
);

CREATE TABLE memberships (
  org_id TEXT NOT NULL REFERENCES orgs(id),
  account_id TEXT NOT NULL REFERENCES accounts(id),
  role TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
  PRIMARY KEY (org_id, account_id)
);
CREATE INDEX memberships_by_account ON memberships(account_id);

CREATE TABLE projects (
  id TEXT PRIMARY KEY,
  org_id TEXT NOT NULL REFERENCES orgs(id),
  name TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE INDEX projects_by_org ON projects(org_id);

CREATE TABLE api_keys (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects(id),
  org_id TEXT NOT NULL REFERENCES orgs(id),
  name TEXT NOT NULL,
  key_prefix TEXT NOT NULL,
  allowed_models TEXT NOT NULL DEFAULT '[]',
  status TEXT NOT NULL CHECK (status IN ('active', 'revoked')),
  rpm_limit INTEGER NOT NULL,
  tpm_limit INTEGER NOT NULL,
  max_parallel_requests INTEGER NOT NULL,
  created_at TEXT NOT NULL,
  revoked_at TEXT NOT NULL DEFAULT '',
  last_used_at TEXT NOT NULL DEFAULT ''
);
CREATE INDEX api_keys_by_project ON api_keys(project_id);

-- The gateway's credential table: a key authenticates exactly when its hash is here.
CREATE TABLE credentials (
  key_hash TEXT PRIMARY KEY,
  key_id TEXT NOT NULL UNIQUE REFERENCES api_keys(id)
);

CREATE TABLE credit_ledger (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  org_id TEXT NOT NULL REFERENCES orgs(id),
  amount_micros INTEGER NOT NULL,
  note TEXT NOT NULL DEFAULT '',
  created_at TEXT NOT NULL
);

CREATE TABLE usage (
  request_id TEXT PRIMARY KEY,
  key_id TEXT NOT NULL,
  org_id TEXT NOT NULL,
  project_id TEXT NOT NULL,
  model TEXT NOT NULL,
  path TEXT NOT NULL DEFAULT '',
  status INTEGER NOT NULL DEFAULT 0,
  prompt_tokens INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  cost_micros INTEGER NOT NULL DEFAULT 0,
  at_ms INTEGER NOT NULL,
  month TEXT NOT NULL,
  node_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX usage_by_org_month ON usage(org_id, month);
CREATE INDEX usage_by_project_month ON usage(project_id, month);

CREATE TABLE org_spend (
  org_id TEXT NOT NULL,
  month TEXT NOT NULL,
  spend_micros INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (org_id, month)
);

CREATE TABLE report_cursors (
  node_id TEXT NOT NULL,
  instance_id TEXT NOT NULL,
  last_seq INTEGER NOT NULL,
  updated_at TEXT NOT NULL,
  PRIMARY KEY (node_id, instance_id)
);

CREATE TABLE sync_version (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version INTEGER NOT NULL
);
INSERT INTO sync_version (id, version) VALUES (1, 0);

-- One row per version: the encoded tollgate.v1.Change (config changes without upstream credentials).
CREATE TABLE changes (
  version INTEGER PRIMARY KEY,
  payload BLOB NOT NULL,
  created_at TEXT NOT NULL
);

CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  address TEXT NOT NULL DEFAULT '',
  connected_at TEXT NOT NULL DEFAULT '',
  last_seen_at TEXT NOT NULL DEFAULT '',
  acked_version INTEGER NOT NULL DEFAULT 0
);
`;
