// A paused destination's deliveries are held (status 'held'), outside the due index's range that every
// dispatcher pass reads (docs/webhooks-and-audit.md#paused-destinations); those pending when this runs
// become held. Held deliveries are pruned by age and count.
export const sql = `
UPDATE webhook_deliveries SET status = 'held'
  WHERE status = 'pending' AND url IN (SELECT url FROM webhook_destinations WHERE paused_at_ms > 0);
`;
