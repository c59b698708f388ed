// The audit log's writing side. Each console call runs inside an AuditScope (the store's transaction
// rider, store/transaction.ts): the role checks note the organisation they were about and whether
// they refused; a call that changes something has its entry written by its first transaction that
// writes, before COMMIT (both or neither); the handler's wrapper (audit-actions.ts) writes on their own
// only the entries of refusals and of changes that wrote nothing.
// An entry holds ids, an action name and an outcome: never a key value, token or secret.
import type { Db, Param } from '../store/db.js';
import { currentTxRider, runWithTxRider, type TxRider } from '../store/transaction.js';

export type AuditOutcome = 'ok' | 'denied';

export interface AuditEntryInput {
  atMs: number;
  actor: string;
  action: string;
  targetId: string;
  orgId: string;
  outcome: AuditOutcome;
  callerAddress: string;
  /** What the call set (a key's spend limit, a project's cap); never a secret. */
  detail?: string;
}

export class AuditScope implements TxRider {
  actor = '';
  orgId = '';
  /** What the call made (a created id), noted by its handler: the answer is not there before COMMIT. */
  targetId = '';
  /** A role check refused the caller (including a non-member answered NOT_FOUND). */
  denied = false;
  /** The entry of the change, until a transaction carried it. */
  private change: (() => AuditEntryInput) | null = null;
  private written = false;
  private closed = false;
  constructor(readonly callerAddress: string) {}

  /** The call changes something: its entry rides on its first transaction that writes. */
  expectChange(entry: () => AuditEntryInput): void {
    this.change = entry;
  }

  pending(): { sql: string; params: Param[] } | null {
    return this.closed || !this.change || !this.actor ? null : auditInsert(this.change());
  }

  carried(): void {
    this.change = null;
    this.written = true;
  }

  /** The call answered: work it started later carries nothing. True when a transaction wrote its entry. */
  close(): boolean {
    this.closed = true;
    return this.written;
  }
}

export function runInAuditScope<T>(scope: AuditScope, fn: () => T): T {
  return runWithTxRider(scope, fn);
}

/** The scope of the console call running now, if any. */
export function auditScope(): AuditScope | undefined {
  const r = currentTxRider();
  return r instanceof AuditScope ? r : undefined;
}

/** Notes what a call created (and its organisation), for the entry its transaction writes. */
export function noteAuditTarget(targetId: string, orgId?: string): void {
  const scope = auditScope();
  if (!scope) return;
  scope.targetId = targetId;
  if (orgId && !scope.orgId) scope.orgId = orgId;
}

function auditInsert(e: AuditEntryInput): { sql: string; params: Param[] } {
  return {
    sql: 'INSERT INTO audit_log (at_ms, actor, action, target_id, org_id, outcome, caller_address, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
    params: [e.atMs, e.actor, e.action, auditId(e.targetId), auditId(e.orgId), e.outcome, e.callerAddress.slice(0, 100), (e.detail ?? '').slice(0, 200)],
  };
}

const MAX_ID = 100;

/** An id fit to store: trimmed, bounded, and never something that looks like a key value or token. */
export function auditId(raw: unknown): string {
  if (typeof raw !== 'string') return '';
  const id = raw.trim().slice(0, MAX_ID);
  // Record ids are a prefix and 12 characters; tokens a prefix and 43 (generateToken): never kept.
  return /^(sk-|whsec_)/i.test(id) || /^[A-Za-z]+_[A-Za-z0-9_-]{32,}$/.test(id) || /\s/.test(id) ? '' : id;
}

/** `ipv4:127.0.0.1:5000` / `ipv6:[::1]:5000` (grpc-js getPeer) → the address without the port. */
export function callerAddressOf(peer: string): string {
  const p = peer.replace(/^(ipv4|ipv6|unix):/, '');
  const v6 = /^\[([^\]]+)\](:\d+)?$/.exec(p);
  if (v6) return v6[1];
  const v4 = /^([^:]+):\d+$/.exec(p);
  return v4 ? v4[1] : p.slice(0, 100);
}

const DAY_MS = 86_400_000;

export class AuditRecorder {
  constructor(
    private readonly db: Db,
    private readonly opts: { now(): number; retentionDays: number; log?(line: string): void },
  ) {}

  now(): number {
    return this.opts.now();
  }

  /** An entry on its own: a refusal, or a change that wrote nothing (a second revoke of a key). */
  async record(e: AuditEntryInput): Promise<void> {
    const { sql, params } = auditInsert(e);
    await this.db.run(sql, params);
  }

  /** Records before the answer, without failing the call: a refusal's entry that fails is logged. */
  async recordOrLog(e: AuditEntryInput): Promise<void> {
    await this.record(e).catch((err: Error) => (this.opts.log ?? console.error)(`audit: entry not written (${e.action} by ${e.actor}): ${err.message}`));
  }

  /** Drops entries older than the retention; returns how many. */
  async applyRetention(): Promise<number> {
    const r = await this.db.run('DELETE FROM audit_log WHERE at_ms < ?', [this.opts.now() - this.opts.retentionDays * DAY_MS]);
    return r.changes;
  }
}
