// Key expiry and the organisations' key-lifetime policies (migration 017).
import type { Queryable } from './db.js';

export async function setKeyExpiry(q: Queryable, keyId: string, expiresAtMs: number): Promise<void> {
  await q.run('UPDATE api_keys SET expires_at_ms = ? WHERE id = ?', [expiresAtMs, keyId]);
}

export async function setRevokedReason(q: Queryable, keyId: string, reason: string): Promise<void> {
  await q.run("UPDATE api_keys SET revoked_reason = ? WHERE id = ? AND revoked_reason = ''", [reason, keyId]);
}

/** Active keys whose expiry is at or before `atMs` (the control plane revokes them). */
export function expiredActiveKeys(q: Queryable, atMs: number, limit = 100): Promise<{ id: string }[]> {
  return q.all("SELECT id FROM api_keys WHERE expires_at_ms > 0 AND expires_at_ms <= ? AND status = 'active' ORDER BY expires_at_ms LIMIT ?", [atMs, limit]);
}

/** Active keys expiring in (fromMs, toMs]. */
export function keysExpiringBetween(q: Queryable, fromMs: number, toMs: number, limit = 500): Promise<{ id: string; project_id: string; org_id: string; key_prefix: string; expires_at_ms: number }[]> {
  return q.all(
    "SELECT id, project_id, org_id, key_prefix, expires_at_ms FROM api_keys WHERE expires_at_ms > ? AND expires_at_ms <= ? AND status = 'active' ORDER BY expires_at_ms LIMIT ?",
    [fromMs, toMs, limit],
  );
}

export async function getKeyPolicy(q: Queryable, orgId: string): Promise<number | null> {
  const row = await q.get<{ max_lifetime_sec: number }>('SELECT max_lifetime_sec FROM org_key_policies WHERE org_id = ?', [orgId]);
  return row?.max_lifetime_sec ?? null;
}

export async function setKeyPolicy(q: Queryable, orgId: string, maxLifetimeSec: number | null): Promise<void> {
  if (maxLifetimeSec === null) await q.run('DELETE FROM org_key_policies WHERE org_id = ?', [orgId]);
  else await q.run('INSERT INTO org_key_policies (org_id, max_lifetime_sec) VALUES (?, ?) ON CONFLICT (org_id) DO UPDATE SET max_lifetime_sec = excluded.max_lifetime_sec', [orgId, maxLifetimeSec]);
}
