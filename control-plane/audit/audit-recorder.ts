// The audit log's writing side. Each console call runs inside an AuditScope (AsyncLocalStorage): the
// role checks note the organisation they were about and whether they refused, the handler's wrapper
// (console-service.ts) records one entry when the call changed something or was refused for its role.
// An entry holds ids, an action name and an outcome: never a key value, token or secret.
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Db } from '../store/db.js';

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

export class AuditScope {
  actor = '';
  orgId = '';
  targetId = '';
  /** A role check refused the caller (including a non-member answered NOT_FOUND). */
  denied = false;
  constructor(readonly callerAddress: string) {}
}

const scopes = new AsyncLocalStorage<AuditScope>();

export function runInAuditScope<T>(scope: AuditScope, fn: () => T): T {
  return scopes.run(scope, fn);
}

/** The scope of the console call running now, if any. */
export function auditScope(): AuditScope | undefined {
  return scopes.getStore();
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

  async record(e: AuditEntryInput): Promise<void> {
    await this.db.run(
      'INSERT INTO audit_log (at_ms, actor, action, target_id, org_id, outcome, caller_address, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
      [e.atMs, e.actor, e.action, auditId(e.targetId), auditId(e.orgId), e.outcome, e.callerAddress.slice(0, 100), (e.detail ?? '').slice(0, 200)],
    );
  }

  /** Records without making the caller wait or fail: an audit write that fails is logged. */
  recordLater(e: AuditEntryInput): void {
    this.record(e).catch((err: Error) => (this.opts.log ?? console.error)(`audit: entry not written (${e.action} by ${e.actor}): ${err.message}`));
  }

  /** Drops entries older than the retention; returns how many. */
  async applyRetention(): Promise<number> {
    const r = await this.db.run('DELETE FROM audit_log WHERE at_ms < ?', [this.opts.now() - this.opts.retentionDays * DAY_MS]);
    return r.changes;
  }
}
