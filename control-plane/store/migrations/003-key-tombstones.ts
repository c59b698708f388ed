// A revoked key's hash is kept as a tombstone: nodes log attempts made with it after revocation against
// the key (request logs), and `tollgate key find` can still name a leaked key that is already revoked.
// A tombstone never authenticates anything.
export const sql = `
CREATE TABLE key_tombstones (
  key_hash TEXT PRIMARY KEY,
  key_id TEXT NOT NULL UNIQUE REFERENCES api_keys(id),
  revoked_at TEXT NOT NULL
);
`;
