// Webhooks (docs/webhooks-and-audit.md): a durable outbox. An event is written once, in the
// transaction of the change that caused it, with one delivery row per destination subscribed at that
// moment; the dispatcher sends each delivery until a 2xx (at least once, the same webhook-id every
// attempt) or until its retry window closes. Marks make threshold events fire once per period.
export const sql = `
CREATE TABLE webhook_events (
  id TEXT PRIMARY KEY,
  type TEXT NOT NULL,
  org_id TEXT NOT NULL DEFAULT '',
  payload TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL
);
CREATE TABLE webhook_deliveries (
  event_id TEXT NOT NULL REFERENCES webhook_events(id) ON DELETE CASCADE,
  url TEXT NOT NULL,
  -- pending, delivered or failed (its retry window closed without a 2xx).
  status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0,
  -- The retry window runs from here (the first attempt's due time, reset when a paused destination resumes).
  window_start_ms INTEGER NOT NULL,
  next_at_ms INTEGER NOT NULL,
  last_status INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NOT NULL DEFAULT '',
  last_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
  delivered_at_ms INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (event_id, url)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_at_ms);
CREATE TABLE webhook_destinations (
  url TEXT PRIMARY KEY,
  paused_at_ms INTEGER NOT NULL DEFAULT 0,
  paused_reason TEXT NOT NULL DEFAULT '',
  consecutive_failures INTEGER NOT NULL DEFAULT 0,
  last_success_at_ms INTEGER NOT NULL DEFAULT 0,
  last_failure_at_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE webhook_marks (
  mark TEXT PRIMARY KEY,
  at_ms INTEGER NOT NULL
);
`;
