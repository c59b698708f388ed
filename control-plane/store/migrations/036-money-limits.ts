// Money limits below the organisation (docs/money-limits.md): a key's own limit, fixed at creation
// (0: none) with when it starts afresh ('' without a limit), and a project's monthly cap (NULL: none).
// Which thresholds of a period were announced by webhook, so each is sent once per period.
export const sql = `
ALTER TABLE api_keys ADD COLUMN limit_micros INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN limit_reset TEXT NOT NULL DEFAULT '';
CREATE INDEX api_keys_with_limit ON api_keys (limit_reset) WHERE limit_micros > 0;
ALTER TABLE projects ADD COLUMN cap_micros INTEGER;
`;
