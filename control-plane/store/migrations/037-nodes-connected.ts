// Whether each node was connected when the control plane last knew (docs/leases.md, "A control plane
// that restarts"): set when a node connects, cleared when its stream ends while the control plane runs
// on, and kept when the control plane stops or dies, so the next one knows which nodes to wait for.
export const sql = `
ALTER TABLE nodes ADD COLUMN connected INTEGER NOT NULL DEFAULT 0;
`;
