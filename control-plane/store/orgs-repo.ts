import type { Queryable } from './db.js';
import { textList } from './dialect.js';

export interface OrgRow {
  id: string;
  name: string;
  tier: string;
  own_cap_micros: number | null;
  credits_micros: number;
  spend_total_micros: number;
  synced_blocked_reason: string;
  funds_version: number;
  /** 1 when the organisation gets its tier's free grant (one per owning account, 010-free-grants). */
  free_grant: number;
  created_at: string;
}

export interface ProjectRow {
  id: string;
  org_id: string;
  name: string;
  created_at: string;
  /** The monthly spend cap in micros; null: none (migration 36; absent on rows built in memory). */
  cap_micros?: number | null;
}

export async function insertOrg(q: Queryable, o: Pick<OrgRow, 'id' | 'name' | 'tier' | 'created_at'> & { free_grant?: number }): Promise<void> {
  await q.run('INSERT INTO orgs (id, name, tier, free_grant, created_at) VALUES (?, ?, ?, ?, ?)', [o.id, o.name, o.tier, o.free_grant ?? 1, o.created_at]);
}

/**
 * Gives `accountId` its one free grant through `orgId` when it never had one: true when this call
 * took it (the primary key makes a second grant impossible even if two creations race).
 */
export async function claimFreeGrant(q: Queryable, accountId: string, orgId: string, at: string): Promise<boolean> {
  const r = await q.run('INSERT INTO free_grants (account_id, org_id, granted_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING', [accountId, orgId, at]);
  return r.changes === 1;
}

export async function setOrgFreeGrant(q: Queryable, orgId: string, granted: boolean): Promise<void> {
  await q.run('UPDATE orgs SET free_grant = ? WHERE id = ?', [granted ? 1 : 0, orgId]);
}

/** How many organisations `accountId` owns (holds the owner role in). */
export async function countOwnedOrgs(q: Queryable, accountId: string): Promise<number> {
  const row = await q.get<{ n: number }>("SELECT COUNT(*) AS n FROM memberships WHERE account_id = ? AND role = 'owner'", [accountId]);
  return row?.n ?? 0;
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
  else if (orgIds.length > 0) await q.run(`UPDATE orgs SET funds_version = funds_version + 1 WHERE id IN ${textList(q)}`, [JSON.stringify(orgIds)]);
}

/** An organisation with what it spent in one month. */
export type OrgWithMonthSpend = OrgRow & { month_spend_micros: number };

const orgsWithMonthSpendSql = (q: Queryable) => `SELECT o.*, COALESCE(s.spend_micros, 0) AS month_spend_micros
  FROM orgs o LEFT JOIN org_spend s ON s.org_id = o.id AND s.month = ?2
  WHERE o.id IN ${textList(q, '?1')}`;

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
  return q.all<OrgWithMonthSpend>(orgsWithMonthSpendSql(q), [JSON.stringify(orgIds), month]);
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

/** Every project's id and organisation (the safety identifier's resolution recomputes them all). */
export function listAllProjectIds(q: Queryable): Promise<{ id: string; org_id: string }[]> {
  return q.all<{ id: string; org_id: string }>('SELECT id, org_id FROM projects');
}

export function listProjects(q: Queryable, orgId: string): Promise<ProjectRow[]> {
  return q.all<ProjectRow>('SELECT * FROM projects WHERE org_id = ? ORDER BY created_at, id', [orgId]);
}

/** Each organisation's owning account: its first owner (issue 21: nodes cap an account's organisations together). */
export async function orgOwners(q: Queryable): Promise<Map<string, string>> {
  const rows = await q.all<{ org_id: string; account_id: string }>(
    "SELECT org_id, account_id FROM memberships WHERE role = 'owner' AND rowid IN (SELECT MIN(rowid) FROM memberships WHERE role = 'owner' GROUP BY org_id)",
  );
  return new Map(rows.map((r) => [r.org_id, r.account_id]));
}

export async function orgOwner(q: Queryable, orgId: string): Promise<string> {
  const row = await q.get<{ account_id: string }>("SELECT account_id FROM memberships WHERE org_id = ? AND role = 'owner' ORDER BY rowid LIMIT 1", [orgId]);
  return row?.account_id ?? '';
}

/** The tiers' grants and caps as the current config sets them, for the org_balances view (042-seller-views). */
export async function writeTierSettings(q: Queryable, tiers: Iterable<{ name: string; freeGrantMicros: number; monthlyCapMicros: number | null }>): Promise<void> {
  await q.run('DELETE FROM tier_settings');
  for (const t of tiers) {
    await q.run('INSERT INTO tier_settings (tier, free_grant_micros, monthly_cap_micros) VALUES (?, ?, ?)', [t.name, t.freeGrantMicros, t.monthlyCapMicros]);
  }
}
