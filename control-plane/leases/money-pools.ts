// Money pools below the organisation (docs/money-limits.md): what a key with its own limit, and a
// project with a monthly cap, may still spend in a period. The money leases (lease-ledger.ts
// MoneyLeaseLedger) lease them exactly as an organisation's money, by pool id: one pool per period
// ("key:ID@START", proto/lib/spend-limits.ts), so a new day, week or month starts from nothing leased
// and nothing owed. This keeps what each limited key or project spent in its latest period, in
// memory: read from usage_minutes the first time it is leased (one statement, once), then moved by
// the usage reports right after they commit (no statement per report). Keys without a limit and
// projects without a cap have no pool and cost nothing here.
import { keyPoolId, limitResetOf, periodEndMs, periodStartMs, poolOf, projectPoolId, type LimitReset } from '../../proto/lib/spend-limits.js';
import type { Queryable } from '../store/db.js';
import { keySpendSince, projectSpendsSince } from '../store/money-limits-repo.js';
import type { SnapshotStore } from '../state/snapshot-store.js';

/** A key's cost in one minute under one lease epoch, as committed (the pools below keep key and project limits by it; sync/report-ingest.ts tells them). */
export interface KeySpend {
  keyId: string;
  projectId: string;
  orgId: string;
  minute: number;
  costMicros: number;
  leaseEpoch: number;
}

/** What a pool whose limit was removed may lease (a node still asking learns the change by delta). */
export const UNLIMITED_POOL_MICROS = 1e15;
/** A period's pools are forgotten by the ledger this long after the period ended (late reports, clocks a little apart). */
const KEEP_ENDED_MS = 5 * 60_000;

interface Spent {
  /** The start (ms) of the period `micros` was spent in. */
  periodStart: number;
  micros: number;
}

export interface PoolLimit {
  kind: 'project' | 'key';
  micros: number;
  reset: LimitReset;
  /** The key's or project's id, the project a key belongs to, and the period the pool id names. */
  id: string;
  projectId: string;
  periodStart: number;
}

export interface MoneyLedger {
  consume(connId: string, poolId: string, costMicros: number): void;
  dropPool(poolId: string): void;
}

export class MoneyPools {
  /** By key or project id ("key:ID" / "project:ID" without the period). */
  private readonly spent = new Map<string, Spent>();
  /** Pools leased, with when their period ends: dropped from the ledger a while after. */
  private readonly leased = new Map<string, number>();
  private nextSweepMs = 0;
  /** Told what a limited key or project spent in its period after each report that moved it (webhook thresholds). */
  onSpent: ((s: { kind: 'project' | 'key'; id: string; projectId: string; orgId: string; limitMicros: number; reset: LimitReset; periodStartMs: number; periodEndMs: number; spentMicros: number }) => void) | null = null;

  constructor(
    private readonly snapshots: SnapshotStore,
    private readonly now: () => number,
  ) {}

  /** The limits besides its organisation's that a key's cost counts against (none for most keys). */
  limitsOfKey(keyId: string, projectId: string): Array<{ base: string; reset: LimitReset; pool: (periodStart: number) => string }> {
    const out: Array<{ base: string; reset: LimitReset; pool: (periodStart: number) => string }> = [];
    if (this.snapshots.projectCap(projectId) > 0) out.push({ base: `project:${projectId}`, reset: 'monthly', pool: (start) => projectPoolId(projectId, start) });
    const k = this.snapshots.keyById(keyId);
    if (k && (k.limitMicros ?? 0) > 0) out.push({ base: `key:${keyId}`, reset: limitResetOf(k.limitReset), pool: (start) => keyPoolId(keyId, start) });
    return out;
  }

  /** The limit a project's or key's pool id stands for, or null (no such limit now). */
  limitOf(poolId: string): PoolLimit | null {
    const p = poolOf(poolId);
    if (p.kind === 'project') {
      const cap = this.snapshots.projectCap(p.id);
      return cap > 0 ? { kind: 'project', micros: cap, reset: 'monthly', id: p.id, projectId: p.id, periodStart: p.periodStart } : null;
    }
    if (p.kind === 'key') {
      const k = this.snapshots.keyById(p.id);
      if (!k || !((k.limitMicros ?? 0) > 0)) return null;
      return { kind: 'key', micros: k.limitMicros!, reset: limitResetOf(k.limitReset), id: p.id, projectId: k.projectId, periodStart: p.periodStart };
    }
    return null;
  }

  /** What the limit's pool spent in the period its id names (0 before it was loaded, or for a later period). */
  spentIn(limit: PoolLimit): number {
    const s = this.spent.get(`${limit.kind}:${limit.id}`);
    if (!s || limit.periodStart > s.periodStart) return 0;
    // An earlier period than the latest one seen (a node whose clock is behind): nothing is left in it.
    if (limit.periodStart < s.periodStart) return limit.micros;
    return s.micros;
  }

  /**
   * What each pool may still spend, from memory; null when one of them was not loaded yet (then
   * `load` it inside a database job, and ask again). A pool without a limit (any more) is unlimited.
   */
  spendableFromMemory(poolIds: readonly string[]): Map<string, number> | null {
    const out = new Map<string, number>();
    for (const id of poolIds) {
      const limit = this.limitOf(id);
      if (!limit) {
        out.set(id, UNLIMITED_POOL_MICROS);
        continue;
      }
      if (!this.spent.has(`${limit.kind}:${limit.id}`)) return null;
      out.set(id, Math.max(0, limit.micros - this.spentIn(limit)));
      this.leased.set(id, periodEndMs(limit.reset, limit.periodStart));
    }
    return out;
  }

  /** Reads what the pools not loaded yet spent in the period their id names (inside a database job). */
  async load(q: Queryable, poolIds: readonly string[]): Promise<void> {
    for (const id of poolIds) {
      const limit = this.limitOf(id);
      if (!limit || this.spent.has(`${limit.kind}:${limit.id}`)) continue;
      const since = limit.periodStart / 60_000;
      const endMs = periodEndMs(limit.reset, limit.periodStart);
      const until = Number.isFinite(endMs) ? endMs / 60_000 : undefined;
      const micros = limit.kind === 'key' ? await keySpendSince(q, limit.projectId, limit.id, since, until) : ((await projectSpendsSince(q, [limit.id], since, until)).get(limit.id) ?? 0);
      this.spent.set(`${limit.kind}:${limit.id}`, { periodStart: limit.periodStart, micros });
    }
  }

  /**
   * A usage report committed: the cost of a key's requests admitted in `minute` counts in the period
   * that minute falls in, for each loaded key or project it touches (one not loaded yet reads it
   * when loaded).
   */
  private recordSpend(base: string, reset: LimitReset, minute: number, costMicros: number): boolean {
    const s = this.spent.get(base);
    if (!s || costMicros <= 0) return false;
    const start = periodStartMs(reset, minute * 60_000);
    if (start > s.periodStart) {
      s.periodStart = start;
      s.micros = 0;
    }
    if (start !== s.periodStart) return false;
    s.micros += costMicros;
    return true;
  }

  /**
   * A usage report of a node connection committed: each key's cost counts against its project's cap
   * and its own limit (when they have one), and against the connection's slice of the period's pool
   * when it was reserved from it (its lease epoch is the connection's), as the node settles it.
   */
  charge(ledger: MoneyLedger, connId: string, leaseEpoch: number, costs: readonly KeySpend[]): void {
    let moved: Map<string, string> | null = null;
    for (const c of costs) {
      const limits = this.limitsOfKey(c.keyId, c.projectId);
      for (const l of limits) {
        const pool = l.pool(periodStartMs(l.reset, c.minute * 60_000));
        if (this.recordSpend(l.base, l.reset, c.minute, c.costMicros)) (moved ??= new Map()).set(pool, c.orgId);
        if (c.leaseEpoch !== 0 && c.leaseEpoch === leaseEpoch) ledger.consume(connId, pool, c.costMicros);
      }
    }
    if (moved && this.onSpent) {
      for (const [pool, orgId] of moved) {
        const limit = this.limitOf(pool);
        if (!limit) continue;
        this.onSpent({ kind: limit.kind, id: limit.id, projectId: limit.projectId, orgId, limitMicros: limit.micros, reset: limit.reset, periodStartMs: limit.periodStart, periodEndMs: periodEndMs(limit.reset, limit.periodStart), spentMicros: this.spentIn(limit) });
      }
    }
    this.sweep(ledger);
  }


  /** The ledger forgets the pools of periods that ended a while ago (at most once a minute). */
  sweep(ledger: MoneyLedger): void {
    const now = this.now();
    if (now < this.nextSweepMs) return;
    this.nextSweepMs = now + 60_000;
    for (const [id, end] of this.leased) {
      if (end + KEEP_ENDED_MS < now) {
        this.leased.delete(id);
        ledger.dropPool(id);
      }
    }
  }

  /** A project's new cap: what it spent is read afresh when its pool is next leased. */
  forgetProject(projectId: string): void {
    this.spent.delete(`project:${projectId}`);
  }
}

/** Splits pool ids into organisations' and the others (projects', keys'). */
export function partitionPools(ids: readonly string[]): { orgIds: string[]; poolIds: string[] } {
  const orgIds: string[] = [];
  const poolIds: string[] = [];
  for (const id of ids) (poolOf(id).kind === 'org' ? orgIds : poolIds).push(id);
  return { orgIds, poolIds };
}
