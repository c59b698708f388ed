import type { Queryable } from './db.js';

export interface ApiKeyRow {
  id: string;
  project_id: string;
  org_id: string;
  name: string;
  key_prefix: string;
  /** JSON array of model ids. */
  allowed_models: string;
  status: 'active' | 'revoked';
  rpm_limit: number;
  tpm_limit: number;
  max_parallel_requests: number;
  created_at: string;
  revoked_at: string;
  last_used_at: string;
  /** ms since the epoch; 0: never (migration 17; absent on rows built in memory before insert). */
  expires_at_ms?: number;
  /** 'revoked', 'expired', or '' (revoked before reasons were kept). */
  revoked_reason?: string;
  /** The key's own money limit in micros, 0: none; and its reset (migration 36; docs/money-limits.md). */
  limit_micros?: number;
  limit_reset?: string;
}

export async function insertKey(q: Queryable, k: Omit<ApiKeyRow, 'revoked_at' | 'last_used_at'>, keyHash: string): Promise<void> {
  await q.run(
    `INSERT INTO api_keys (id, project_id, org_id, name, key_prefix, allowed_models, status, rpm_limit, tpm_limit, max_parallel_requests, created_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    [k.id, k.project_id, k.org_id, k.name, k.key_prefix, k.allowed_models, k.status, k.rpm_limit, k.tpm_limit, k.max_parallel_requests, k.created_at],
  );
  await q.run('INSERT INTO credentials (key_hash, key_id) VALUES (?, ?)', [keyHash, k.id]);
}

export function getKey(q: Queryable, id: string): Promise<ApiKeyRow | undefined> {
  return q.get<ApiKeyRow>('SELECT * FROM api_keys WHERE id = ?', [id]);
}

/** Every key's id, project and organisation, revoked ones included (the safety identifier's resolution). */
export function listAllKeyIds(q: Queryable): Promise<{ id: string; project_id: string; org_id: string }[]> {
  return q.all<{ id: string; project_id: string; org_id: string }>('SELECT id, project_id, org_id FROM api_keys');
}

export function listKeys(q: Queryable, projectId: string): Promise<ApiKeyRow[]> {
  return q.all<ApiKeyRow>('SELECT * FROM api_keys WHERE project_id = ? ORDER BY created_at, id', [projectId]);
}

export async function credentialHashOf(q: Queryable, keyId: string): Promise<string | undefined> {
  return (await q.get<{ key_hash: string }>('SELECT key_hash FROM credentials WHERE key_id = ?', [keyId]))?.key_hash;
}

/** Removes the credential and keeps its hash as a tombstone (never used to authenticate). */
export async function deleteCredential(q: Queryable, keyHash: string, at: string): Promise<void> {
  await q.run('INSERT INTO key_tombstones (key_hash, key_id, revoked_at) SELECT key_hash, key_id, ? FROM credentials WHERE key_hash = ? ON CONFLICT DO NOTHING', [at, keyHash]);
  await q.run('DELETE FROM credentials WHERE key_hash = ?', [keyHash]);
}

export async function markRevoked(q: Queryable, keyId: string, at: string): Promise<void> {
  await q.run("UPDATE api_keys SET status = 'revoked', revoked_at = ? WHERE id = ? AND status = 'active'", [at, keyId]);
}

/** Keys whose record is active but whose credential is gone (a revocation cut short by a crash). */
export async function repairOrphanedKeys(q: Queryable, at: string): Promise<number> {
  const r = await q.run(
    "UPDATE api_keys SET status = 'revoked', revoked_at = ? WHERE status = 'active' AND id NOT IN (SELECT key_id FROM credentials)",
    [at],
  );
  return r.changes;
}

/** Rows read at a time when every key is read (the control plane's start). */
const KEY_BATCH = 10_000;

/**
 * Every credentialed key, in batches in the order of their hashes. In batches, not in one read: the
 * SQLite driver builds a whole result in native memory before handing it over, and a million keys
 * read at once left the control plane at 2.9 GB of RSS for a heap of 383 MB (the allocator kept it).
 */
export async function* credentialedKeyBatches(q: Queryable, size = KEY_BATCH): AsyncGenerator<(ApiKeyRow & { key_hash: string })[]> {
  let after = '';
  for (;;) {
    const rows = await q.all<ApiKeyRow & { key_hash: string }>(
      'SELECT k.*, c.key_hash FROM credentials c JOIN api_keys k ON k.id = c.key_id WHERE c.key_hash > ? ORDER BY c.key_hash LIMIT ?',
      [after, size],
    );
    if (rows.length === 0) return;
    yield rows;
    if (rows.length < size) return;
    after = rows[rows.length - 1].key_hash;
  }
}

export async function credentialedKeys(q: Queryable): Promise<(ApiKeyRow & { key_hash: string })[]> {
  const out: (ApiKeyRow & { key_hash: string })[] = [];
  for await (const batch of credentialedKeyBatches(q)) out.push(...batch);
  return out;
}

/** Revoked keys' hashes with the key they belonged to (nodes log attempts made with them). */
export function tombstonedKeys(q: Queryable): Promise<{ key_hash: string; key_id: string; project_id: string; org_id: string }[]> {
  return q.all('SELECT t.key_hash, k.id AS key_id, k.project_id, k.org_id FROM key_tombstones t JOIN api_keys k ON k.id = t.key_id');
}

/**
 * The key whose hash is `keyHash`, live (a credential) or revoked (a tombstone). The lookup is by the
 * primary key of an HMAC under the secret pepper, so its timing tells a caller nothing about values.
 */
export async function keyIdOfHash(q: Queryable, keyHash: string): Promise<{ key_id: string; key_hash: string } | undefined> {
  return q.get<{ key_id: string; key_hash: string }>(
    'SELECT key_id, key_hash FROM credentials WHERE key_hash = ? UNION ALL SELECT key_id, key_hash FROM key_tombstones WHERE key_hash = ? LIMIT 1',
    [keyHash, keyHash],
  );
}
