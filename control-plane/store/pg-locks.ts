// The advisory locks of one Tollgate database on PostgreSQL, and the leader's fence
// (docs/design.md#several-control-planes-on-one-database). Write transactions take their store's
// lock for the transaction; the leader holds LEADER_LOCK for its session.
export const STATE_WRITE_LOCK = 0x7011_0001;
export const LOG_WRITE_LOCK = 0x7011_0002;
export const LEADER_LOCK = 0x7011_0003;

/** SQLSTATE of a write refused because another control plane took the lead since (tollgate_fence). */
export const FENCED_SQLSTATE = 'TG001';

/**
 * The leader's row and the fence every write transaction of a leader runs first: made by the lock's
 * holder-to-be, not by a numbered migration, since migrations themselves run fenced (PostgreSQL only).
 */
export const LEADER_TABLE_SQL = `
CREATE TABLE IF NOT EXISTS tollgate_leader (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  epoch BIGINT NOT NULL,
  address TEXT NOT NULL DEFAULT '',
  since TEXT NOT NULL DEFAULT ''
);
INSERT INTO tollgate_leader (id, epoch) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION tollgate_fence(e BIGINT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  cur tollgate_leader%ROWTYPE;
BEGIN
  SELECT * INTO cur FROM tollgate_leader WHERE id = 1;
  IF cur.epoch IS DISTINCT FROM e AND cur.address <> '' THEN
    RAISE EXCEPTION 'write refused: this control plane led in epoch %, another leads in epoch %: the leader is at %', e, cur.epoch, cur.address
      USING ERRCODE = '${FENCED_SQLSTATE}';
  ELSIF cur.epoch IS DISTINCT FROM e THEN
    RAISE EXCEPTION 'write refused: this control plane led in epoch %, another leads in epoch %', e, cur.epoch
      USING ERRCODE = '${FENCED_SQLSTATE}';
  END IF;
END $$;`;

/** A leader's epoch, checked at the start of each of its write transactions. */
export interface Fence {
  readonly epoch: number;
  /** Told (once per refused transaction) that the database refused a write on the epoch check. */
  onFenced(err: Error): void;
}
