// OrgEntry.funds_version: bumped when an organisation's money changes other than by usage (credit,
// cap, tier, config), so a node told "nothing left to lease" asks again.
export const sql = `
ALTER TABLE orgs ADD COLUMN funds_version INTEGER NOT NULL DEFAULT 0;
`;
