import type { Queryable } from './db.js';

export interface OrgRow {
  id: string;
  name: string;
  tier: string;
  own_cap_micros: number | null;
  credits_micros: number;
  spend_total_micros: number;
  synced_blocked_reason: string;
  funds_version: number;
  created_at: string;
}

export interface ProjectRow {
  id: string;
  org_id: string;
  name: string;
  created_at: string;
}

export async function insertOrg(q: Queryable, o: Pick<OrgRow, 'id' | 'name' | 'tier' | 'created_at'>): Promise<void> {
  await q.run('INSERT INTO orgs (id, name, tier, created_at) VALUES (?, ?, ?, ?)', [o.id, o.name, o.tier, o.created_at]);
}

export function getOrg(q: Queryable, id: string): Promise<OrgRow | undefined> {
  return q.get<OrgRow>('SELECT * FROM orgs WHERE id = ?', [id]);
}

export function listAllOrgs(q: Queryable): Promise<OrgRow[]> {
  return q.all<OrgRow>('SELECT * FROM orgs ORDER BY created_at, id');
}

export function listOrgsOfAccount(q: Queryable, accountId: string): Promise<(OrgRow & { role: string })[]> {
  return q.all<OrgRow & { role: string }>(
    'SELECT o.*, m.role AS role FROM orgs o JOIN memberships m ON m.org_id = o.id WHERE m.account_id = ? ORDER BY o.created_at, o.id',
    [accountId],
  );
}

export async function setOrgTier(q: Queryable, id: string, tier: string): Promise<void> {
  await q.run('UPDATE orgs SET tier = ? WHERE id = ?', [tier, id]);
}

export async function setOrgOwnCap(q: Queryable, id: string, capMicros: number | null): Promise<void> {
  await q.run('UPDATE orgs SET own_cap_micros = ? WHERE id = ?', [capMicros, id]);
}

export async function addCredit(q: Queryable, orgId: string, amountMicros: number, note: string, at: string): Promise<void> {
  await q.run('INSERT INTO credit_ledger (org_id, amount_micros, note, created_at) VALUES (?, ?, ?, ?)', [orgId, amountMicros, note, at]);
  await q.run('UPDATE orgs SET credits_micros = credits_micros + ? WHERE id = ?', [amountMicros, orgId]);
}

export async function setSyncedBlockedReason(q: Queryable, orgId: string, reason: string): Promise<void> {
  await q.run('UPDATE orgs SET synced_blocked_reason = ? WHERE id = ?', [reason, orgId]);
}

export async function bumpFundsVersion(q: Queryable, orgIds: string[] | 'all'): Promise<void> {
  if (orgIds === 'all') await q.run('UPDATE orgs SET funds_version = funds_version + 1');
  else if (orgIds.length > 0) await q.run('UPDATE orgs SET funds_version = funds_version + 1 WHERE id IN (SELECT value FROM json_each(?))', [JSON.stringify(orgIds)]);
}

/** An organisation with what it spent in one month. */
export type OrgWithMonthSpend = OrgRow & { month_spend_micros: number };

const ORGS_WITH_MONTH_SPEND_SQL = `SELECT o.*, COALESCE(s.spend_micros, 0) AS month_spend_micros
  FROM orgs o LEFT JOIN org_spend s ON s.org_id = o.id AND s.month = ?2
  WHERE o.id IN (SELECT value FROM json_each(?1))`;

/**
 * Organisations (those of `orgIds` that exist, or all) with their spend in `month`: one statement
 * however many.
 */
export function orgsWithMonthSpend(q: Queryable, orgIds: readonly string[] | 'all', month: string): Promise<OrgWithMonthSpend[]> {
  if (orgIds === 'all') {
    return q.all<OrgWithMonthSpend>(
      'SELECT o.*, COALESCE(s.spend_micros, 0) AS month_spend_micros FROM orgs o LEFT JOIN org_spend s ON s.org_id = o.id AND s.month = ? ORDER BY o.created_at, o.id',
      [month],
    );
  }
  if (orgIds.length === 0) return Promise.resolve([]);
  return q.all<OrgWithMonthSpend>(ORGS_WITH_MONTH_SPEND_SQL, [JSON.stringify(orgIds), month]);
}

export async function monthSpend(q: Queryable, orgId: string, month: string): Promise<number> {
  const row = await q.get<{ spend_micros: number }>('SELECT spend_micros FROM org_spend WHERE org_id = ? AND month = ?', [orgId, month]);
  return row?.spend_micros ?? 0;
}

export async function tiersInUse(q: Queryable): Promise<string[]> {
  return (await q.all<{ tier: string }>('SELECT DISTINCT tier FROM orgs')).map((r) => r.tier);
}

export async function insertProject(q: Queryable, p: ProjectRow): Promise<void> {
  await q.run('INSERT INTO projects (id, org_id, name, created_at) VALUES (?, ?, ?, ?)', [p.id, p.org_id, p.name, p.created_at]);
}

export function getProject(q: Queryable, id: string): Promise<ProjectRow | undefined> {
  return q.get<ProjectRow>('SELECT * FROM projects WHERE id = ?', [id]);
}

export function listProjects(q: Queryable, orgId: string): Promise<ProjectRow[]> {
  return q.all<ProjectRow>('SELECT * FROM projects WHERE org_id = ? ORDER BY created_at, id', [orgId]);
}
