// Key expiry (docs/webhooks-and-audit.md#key-expiry): when a key stops authenticating (0: never), why a revoked key was
// revoked ('' for revocations before this: shown as "revoked"), and each organisation's maximum key
// lifetime for keys created later.
export const sql = `
ALTER TABLE api_keys ADD COLUMN expires_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN revoked_reason TEXT NOT NULL DEFAULT '';
CREATE INDEX api_keys_expiring ON api_keys (expires_at_ms) WHERE expires_at_ms > 0 AND status = 'active';
CREATE TABLE org_key_policies (
  org_id TEXT PRIMARY KEY REFERENCES orgs(id),
  max_lifetime_sec INTEGER NOT NULL
);
`;
