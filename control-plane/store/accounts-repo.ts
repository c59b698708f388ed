import type { Queryable } from './db.js';

export type Role = 'owner' | 'admin' | 'member';
export const ROLES: readonly Role[] = ['member', 'admin', 'owner'];

export interface AccountRow {
  id: string;
  name: string;
  token_hash: string;
  created_at: string;
}

export interface MemberRow {
  org_id: string;
  account_id: string;
  account_name: string;
  role: Role;
}

export async function insertAccount(q: Queryable, a: AccountRow): Promise<void> {
  await q.run('INSERT INTO accounts (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)', [a.id, a.name, a.token_hash, a.created_at]);
}

export function getAccount(q: Queryable, id: string): Promise<AccountRow | undefined> {
  return q.get<AccountRow>('SELECT * FROM accounts WHERE id = ?', [id]);
}

export function findAccountByTokenHash(q: Queryable, tokenHash: string): Promise<AccountRow | undefined> {
  return q.get<AccountRow>('SELECT * FROM accounts WHERE token_hash = ?', [tokenHash]);
}

export async function getRole(q: Queryable, orgId: string, accountId: string): Promise<Role | undefined> {
  const row = await q.get<{ role: Role }>('SELECT role FROM memberships WHERE org_id = ? AND account_id = ?', [orgId, accountId]);
  return row?.role;
}

export async function upsertMember(q: Queryable, orgId: string, accountId: string, role: Role): Promise<void> {
  await q.run(
    'INSERT INTO memberships (org_id, account_id, role) VALUES (?, ?, ?) ON CONFLICT (org_id, account_id) DO UPDATE SET role = excluded.role',
    [orgId, accountId, role],
  );
}

export function listMembers(q: Queryable, orgId: string): Promise<MemberRow[]> {
  return q.all<MemberRow>(
    `SELECT m.org_id, m.account_id, a.name AS account_name, m.role FROM memberships m JOIN accounts a ON a.id = m.account_id
     WHERE m.org_id = ? ORDER BY CASE m.role WHEN 'owner' THEN 0 WHEN 'admin' THEN 1 ELSE 2 END, a.name`,
    [orgId],
  );
}
