import { Change } from '../../proto/gen/tollgate/v1/sync.js';
import type { Queryable } from './db.js';
import { greatest } from './dialect.js';

export interface NodeRow {
  id: string;
  address: string;
  connected_at: string;
  last_seen_at: string;
  acked_version: number;
  /** 1 while the node's stream is open, and after the control plane stopped with it open. */
  connected?: number;
}

export async function currentVersion(q: Queryable): Promise<number> {
  return (await q.get<{ version: number }>('SELECT version FROM sync_version WHERE id = 1'))?.version ?? 0;
}

/**
 * Bumps the one version counter and records `stored` as that version, in the caller's transaction.
 * `stored` is what may be persisted (config changes without upstream credentials).
 */
export async function appendChange(q: Queryable, stored: Change, at: string): Promise<number> {
  await q.run('UPDATE sync_version SET version = version + 1 WHERE id = 1');
  const version = await currentVersion(q);
  await q.run('INSERT INTO changes (version, payload, created_at) VALUES (?, ?, ?)', [version, Buffer.from(Change.encode(stored).finish()), at]);
  return version;
}

export async function loadChanges(q: Queryable, limit: number): Promise<{ version: number; change: Change }[]> {
  const rows = await q.all<{ version: number; payload: Buffer }>('SELECT version, payload FROM changes ORDER BY version DESC LIMIT ?', [limit]);
  return rows.reverse().map((r) => ({ version: r.version, change: Change.decode(r.payload) }));
}

export async function pruneChanges(q: Queryable, keepAfterVersion: number): Promise<void> {
  await q.run('DELETE FROM changes WHERE version <= ?', [keepAfterVersion]);
}

export async function upsertNode(q: Queryable, n: NodeRow): Promise<void> {
  await q.run(
    `INSERT INTO nodes (id, address, connected_at, last_seen_at, acked_version, connected) VALUES (?, ?, ?, ?, ?, 1)
     ON CONFLICT (id) DO UPDATE SET address = excluded.address, connected_at = excluded.connected_at,
       last_seen_at = excluded.last_seen_at, acked_version = excluded.acked_version, connected = 1`,
    [n.id, n.address, n.connected_at, n.last_seen_at, n.acked_version],
  );
}

export async function touchNode(q: Queryable, id: string, lastSeenAt: string, ackedVersion: number): Promise<void> {
  await q.run(`UPDATE nodes SET last_seen_at = ?, acked_version = ${greatest(q, 'acked_version', '?')} WHERE id = ?`, [lastSeenAt, ackedVersion, id]);
}

/** The node's stream ended while this control plane runs on: a successor does not wait for it. */
export async function nodeDisconnected(q: Queryable, id: string, lastSeenAt: string, ackedVersion: number): Promise<void> {
  await q.run(`UPDATE nodes SET last_seen_at = ?, acked_version = ${greatest(q, 'acked_version', '?')}, connected = 0 WHERE id = ?`, [lastSeenAt, ackedVersion, id]);
}

/** The nodes whose streams were open when the previous control plane stopped or died. */
export async function connectedNodeIds(q: Queryable): Promise<string[]> {
  return (await q.all<{ id: string }>('SELECT id FROM nodes WHERE connected = 1 ORDER BY id')).map((r) => r.id);
}

/** Nodes that did not come back after a restart: no longer waited for. */
export async function nodesGone(q: Queryable, ids: readonly string[]): Promise<void> {
  for (const id of ids) await q.run('UPDATE nodes SET connected = 0 WHERE id = ?', [id]);
}

export function listNodes(q: Queryable): Promise<NodeRow[]> {
  return q.all<NodeRow>('SELECT * FROM nodes ORDER BY id');
}
