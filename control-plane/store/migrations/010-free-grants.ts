// One free grant per owning account (issue 21). `orgs.free_grant` says whether the organisation gets
// its tier's free grant (read live, as before); `free_grants` records the one organisation through
// which each account received its grant, so a second organisation of the same owner starts without one.
// Organisations that exist already keep their grant (taking back money already given would block
// them without warning); every account that owns one counts as having had its grant.
export const sql = `
ALTER TABLE orgs ADD COLUMN free_grant INTEGER NOT NULL DEFAULT 1;

CREATE TABLE free_grants (
  account_id TEXT PRIMARY KEY REFERENCES accounts(id),
  org_id TEXT NOT NULL REFERENCES orgs(id),
  granted_at TEXT NOT NULL
);

INSERT OR IGNORE INTO free_grants (account_id, org_id, granted_at)
  SELECT m.account_id, o.id, o.created_at
  FROM orgs o JOIN memberships m ON m.org_id = o.id AND m.role = 'owner'
  ORDER BY o.created_at, o.id;
`;
