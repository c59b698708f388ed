// The audit log of console calls (docs/webhooks-and-audit.md): every call that changed something and
// every call refused for the caller's role. Never a key value, token or secret: ids and outcomes only.
export const sql = `
CREATE TABLE audit_log (
  id INTEGER PRIMARY KEY,
  at_ms INTEGER NOT NULL,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  target_id TEXT NOT NULL DEFAULT '',
  org_id TEXT NOT NULL DEFAULT '',
  outcome TEXT NOT NULL,
  caller_address TEXT NOT NULL DEFAULT '',
  detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_by_time ON audit_log (at_ms);
CREATE INDEX audit_log_by_org ON audit_log (org_id, at_ms);
`;
