// The state every part of the control plane shares: the database, the current gateway config, and
// the snapshot store the nodes are fed from. Every change nodes must learn goes through `emit`, inside
// the SQLite transaction that makes it, so the version counter and the change row commit together.
import { monthOf } from '../../proto/lib/money.js';
import type { Change, GatewayConfig, KeyEntry, OrgEntry } from '../../proto/gen/tollgate/v1/sync.js';
import type { Org } from '../../proto/gen/tollgate/v1/console.js';
import { readGatewayConfig } from '../config.js';
import { ConfigError } from '../../proto/lib/process-flags.js';
import { redactGatewayConfig, type LoadedGatewayConfig, type TierSettings } from '../gateway-config/gateway-config.js';
import { computeOrgState, type OrgState } from './org-state.js';
import type { Db, Queryable, Tx } from '../store/db.js';
import { credentialedKeyBatches, repairOrphanedKeys, tombstonedKeys, type ApiKeyRow } from '../store/keys-repo.js';
import { bumpFundsVersion, listAllOrgs, monthSpend, orgOwner, orgOwners, orgsWithMonthSpend, setSyncedBlockedReason, tiersInUse, writeTierSettings, type OrgRow, type OrgWithMonthSpend } from '../store/orgs-repo.js';
import { appendChange, currentVersion, loadChanges, pruneChanges } from '../store/sync-repo.js';
import { SnapshotStore } from './snapshot-store.js';
import { cappedProjects } from '../store/money-limits-repo.js';
import { listDeploymentStates, setDeploymentState } from '../store/deployment-states-repo.js';
import { checkSteer, steerKey, withSteer } from './deployment-steer.js';

const RETAINED_CHANGES = 10_000;

export interface ControlStateOptions {
  configPath: string;
  now?: () => number;
  log?: (line: string) => void;
}

export function keyEntryOf(row: ApiKeyRow, keyHash: string): KeyEntry {
  return {
    keyId: row.id,
    keyHash,
    projectId: row.project_id,
    orgId: row.org_id,
    allowedModels: JSON.parse(row.allowed_models) as string[],
    rpmLimit: row.rpm_limit,
    tpmLimit: row.tpm_limit,
    maxParallelRequests: row.max_parallel_requests,
    expiresAtMs: row.expires_at_ms ?? 0,
    limitMicros: row.limit_micros ?? 0,
    limitReset: row.limit_micros ? (row.limit_reset ?? '') : '',
  };
}

/** Told each organisation's money whenever refreshOrgs looks at it, in its transaction (webhooks). */
export type OrgObserver = (
  tx: Tx,
  now: { orgId: string; state: OrgState; monthSpendMicros: number; month: string },
  before: OrgEntry | undefined,
) => Promise<void> | undefined;

export class ControlState {
  private lastMonth: string;
  orgObserver: OrgObserver | null = null;
  /** Organisations' money as last committed (see spendableFromMemory). */
  private readonly committedOrgs = new Map<string, OrgWithMonthSpend & { month: string }>();
  /** The config as nodes hold it: the file's, with the deployments the operator drained or disabled. */
  private published: GatewayConfig;

  private constructor(
    readonly db: Db,
    private current: LoadedGatewayConfig,
    readonly snapshots: SnapshotStore,
    private readonly opts: Required<ControlStateOptions>,
    /** Drained and disabled deployments by model and id (deployment-steer.ts), as committed. */
    private steer: Map<string, string>,
  ) {
    this.lastMonth = monthOf(opts.now());
    this.published = withSteer(current.proto, steer);
  }

  /**
   * Loads the synced state from the database, repairs keys whose revocation was cut short, publishes
   * the config read at start as a new version and brings every organisation's blocked state up to date.
   */
  static async open(db: Db, gateway: LoadedGatewayConfig, options: ControlStateOptions): Promise<ControlState> {
    const opts: Required<ControlStateOptions> = { now: Date.now, log: (l) => console.log(l), ...options };
    const missing = (await db.read((q) => tiersInUse(q))).filter((t) => !gateway.settings.tiers.has(t));
    if (missing.length > 0) throw new ConfigError(`gateway config: tier ${JSON.stringify(missing[0])} is used by organisations but not defined`);

    const repaired = await db.tx((tx) => repairOrphanedKeys(tx, new Date(opts.now()).toISOString()));
    if (repaired > 0) opts.log(`repaired ${repaired} keys to revoked`);

    const init = await db.read(async (q) => {
      const version = await currentVersion(q);
      let changes = await loadChanges(q, RETAINED_CHANGES);
      // Keep only the contiguous run that ends at the current version.
      let start = changes.length;
      while (start > 0 && changes[start - 1].version === version - (changes.length - start)) start--;
      changes = changes.slice(start);
      const keys: KeyEntry[] = [];
      for await (const batch of credentialedKeyBatches(q)) for (const r of batch) keys.push(keyEntryOf(r, r.key_hash));
      const owners = await orgOwners(q);
      const orgs = (await listAllOrgs(q)).map(
        (o): OrgEntry => ({
          orgId: o.id,
          tier: o.tier,
          blocked: o.synced_blocked_reason !== '',
          blockedReason: o.synced_blocked_reason,
          fundsVersion: o.funds_version,
          ownerAccountId: owners.get(o.id) ?? '',
        }),
      );
      const tombstones = (await tombstonedKeys(q)).map((t) => ({ keyHash: t.key_hash, keyId: t.key_id, projectId: t.project_id, orgId: t.org_id }));
      const projects = (await cappedProjects(q)).map((p) => ({ projectId: p.id, capMicros: p.cap_micros }));
      const steer = new Map((await listDeploymentStates(q)).map((r) => [steerKey(r.model, r.deployment), r.state]));
      return { version, changes, keys, orgs, tombstones, projects, steer };
    });
    const { steer, ...synced } = init;
    const snapshots = new SnapshotStore({ ...synced, config: withSteer(gateway.proto, steer), maxRetained: RETAINED_CHANGES });
    const state = new ControlState(db, gateway, snapshots, opts, steer);
    await db.tx(async (tx) => {
      await state.emit(tx, { config: state.published });
      await writeTierSettings(tx, gateway.settings.tiers.values());
      await state.refreshOrgs(tx, 'all');
    });
    return state;
  }

  get gateway(): LoadedGatewayConfig {
    return this.current;
  }

  get configPath(): string {
    return this.opts.configPath;
  }

  now(): number {
    return this.opts.now();
  }

  nowIso(): string {
    return new Date(this.opts.now()).toISOString();
  }

  tier(name: string): TierSettings | undefined {
    return this.current.settings.tiers.get(name);
  }

  /** Records `change` as the next version in `tx`; the snapshot store learns it right after COMMIT. */
  async emit(tx: Tx, change: Change): Promise<number> {
    // Upstream credentials live only in memory and on the stream, never in the database.
    const stored: Change = change.config ? { config: redactGatewayConfig(change.config) } : change;
    const version = await appendChange(tx, stored, this.nowIso());
    if (version % 1000 === 0) await pruneChanges(tx, version - RETAINED_CHANGES);
    tx.afterCommit(() => this.snapshots.apply(version, change));
    return version;
  }

  async orgState(q: Queryable, org: OrgRow): Promise<{ state: OrgState; monthSpendMicros: number; month: string }> {
    const month = monthOf(this.opts.now());
    const monthSpendMicros = await monthSpend(q, org.id, month);
    return { state: this.stateOf(org, monthSpendMicros), monthSpendMicros, month };
  }

  /**
   * The state of an organisation read with its month's spend (no I/O): the one place its tier, grant
   * and money are put together. One free grant per owning account: an organisation created without
   * it gets the tier's cap only.
   */
  private stateOf(org: OrgRow, monthSpendMicros: number): OrgState {
    const tier = this.tier(org.tier);
    return computeOrgState(
      { creditsMicros: org.credits_micros, spendTotalMicros: org.spend_total_micros, monthSpendMicros, ownCapMicros: org.own_cap_micros },
      tier && org.free_grant === 0 ? { ...tier, freeGrantMicros: 0 } : tier,
    );
  }

  /**
   * What the organisation may still spend: the smaller of its available balance and what is left
   * under its monthly cap; 0 when blocked or unknown. Money leases are slices of this.
   */
  async spendableMicros(q: Queryable, orgId: string): Promise<number> {
    return (await this.spendableMany(q, [orgId])).get(orgId) ?? 0;
  }

  /** spendableMicros of several organisations, read by one statement (absent: unknown, so 0). */
  async spendableMany(q: Queryable, orgIds: readonly string[], opts: { committed?: boolean } = {}): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    const month = monthOf(this.opts.now());
    for (const row of await orgsWithMonthSpend(q, [...new Set(orgIds)], month)) {
      // Read in a job of its own (not a transaction): what it read is committed, so it may be kept.
      if (opts.committed) this.committedOrgs.set(row.id, { ...row, month });
      out.set(row.id, this.spendableOf(row));
    }
    return out;
  }

  /**
   * spendableMicros of these organisations from their committed money kept in memory, or null when
   * one of them is not known for the current month (then read them with spendableMany). Kept
   * entries change only right after a COMMIT (refreshOrgs' hook), so a caller that decides and
   * records a money slice synchronously sees no usage report commit in between.
   */
  spendableFromMemory(orgIds: readonly string[]): Map<string, number> | null {
    const month = monthOf(this.opts.now());
    const out = new Map<string, number>();
    for (const id of orgIds) {
      const row = this.committedOrgs.get(id);
      if (!row || row.month !== month) return null;
      out.set(id, this.spendableOf(row));
    }
    return out;
  }

  private spendableOf(row: OrgWithMonthSpend): number {
    const state = this.stateOf(row, row.month_spend_micros);
    if (state.blocked) return 0;
    const underCap = state.effectiveCapMicros === null ? Infinity : state.effectiveCapMicros - row.month_spend_micros;
    return Math.max(0, Math.min(state.balanceMicros, underCap));
  }

  /**
   * Publishes an org_upsert for each organisation whose tier, blocked state or funds version differs
   * from what nodes hold (what a node enforces; spend alone changes none of it). `fundsChanged`:
   * money changed other than by usage (credit, cap, tier, config), so the funds version is bumped
   * first. The organisations are read by one statement however many they are.
   */
  async refreshOrgs(tx: Tx, orgIds: Iterable<string> | 'all', opts: { fundsChanged?: boolean } = {}): Promise<number> {
    const ids = orgIds === 'all' ? 'all' : [...new Set(orgIds)];
    if (opts.fundsChanged) await bumpFundsVersion(tx, ids);
    const month = monthOf(this.opts.now());
    const rows = await orgsWithMonthSpend(tx, ids, month);
    const owners = orgIds === 'all' ? await orgOwners(tx) : null;
    return this.publishOrgs(tx, rows, month, owners);
  }

  /**
   * The current month when refreshSpent decides for these spends from memory alone (every
   * organisation charged is kept for it), so that it may run before the spends are written: pass
   * that month to refreshSpent (the clock may pass midnight in between). Null when one must be read.
   */
  spentFromMemory(spent: readonly { orgId: string }[]): string | null {
    const month = monthOf(this.opts.now());
    return spent.every((s) => this.committedOrgs.get(s.orgId)?.month === month) ? month : null;
  }

  /**
   * refreshOrgs for the organisations a usage report just charged (`spent`: what this transaction
   * added to each one's spend, per month), without reading them back: their rows are the committed
   * ones kept in memory plus what this transaction added. Every change of an organisation's money
   * goes through refreshOrgs or here, and each keeps the rows it commits, so the sum is what a read
   * in this transaction would return (test/unit/control-plane-sync-report-ingest.test.ts compares
   * them). An organisation not kept for the current month is read, as refreshOrgs does.
   */
  async refreshSpent(tx: Tx, spent: readonly { orgId: string; month: string; micros: number }[], month = monthOf(this.opts.now())): Promise<number> {
    const added = new Map<string, { total: number; month: number }>();
    for (const s of spent) {
      const a = added.get(s.orgId) ?? { total: 0, month: 0 };
      a.total += s.micros;
      if (s.month === month) a.month += s.micros;
      added.set(s.orgId, a);
    }
    const rows: (OrgWithMonthSpend & { month: string })[] = [];
    for (const [orgId, a] of added) {
      const kept = this.committedOrgs.get(orgId);
      if (!kept || kept.month !== month) return this.refreshOrgs(tx, added.keys());
      rows.push({ ...kept, spend_total_micros: kept.spend_total_micros + a.total, month_spend_micros: kept.month_spend_micros + a.month });
    }
    return this.publishOrgs(tx, rows, month, null);
  }

  /**
   * Keeps `rows` (as they are in `tx`) as the committed money once it commits, tells the observer, and
   * publishes an org_upsert for each organisation whose tier, blocked state or funds version differs
   * from what nodes hold. `owners`: every organisation's owner when all are refreshed, else null.
   */
  private async publishOrgs(tx: Tx, rows: readonly (OrgWithMonthSpend & { month?: string })[], month: string, owners: Map<string, string> | null): Promise<number> {
    // Every change of an organisation's money goes through here (usage, credit, cap, tier, config):
    // what was read in the transaction is what is committed once it commits.
    tx.afterCommit(() => {
      for (const row of rows) this.committedOrgs.set(row.id, row.month === month ? (row as OrgWithMonthSpend & { month: string }) : { ...row, month });
    });
    let emitted = 0;
    for (const row of rows) {
      const state = this.stateOf(row, row.month_spend_micros);
      const prev = this.snapshots.org(row.id);
      // Awaited only when the observer has something to write (most organisations a report charges do not).
      const observed = this.orgObserver?.(tx, { orgId: row.id, state, monthSpendMicros: row.month_spend_micros, month }, prev);
      if (observed) await observed;
      const next: OrgEntry = {
        orgId: row.id,
        tier: row.tier,
        blocked: state.blocked,
        blockedReason: state.blockedReason,
        fundsVersion: row.funds_version,
        // Read only for an organisation nodes do not hold yet: ingest reads no owner per organisation.
        ownerAccountId: owners ? (owners.get(row.id) ?? '') : (prev?.ownerAccountId ?? (await orgOwner(tx, row.id))),
      };
      if (
        prev &&
        prev.tier === next.tier &&
        prev.blocked === next.blocked &&
        prev.blockedReason === next.blockedReason &&
        prev.fundsVersion === next.fundsVersion &&
        prev.ownerAccountId === next.ownerAccountId
      ) {
        continue;
      }
      await setSyncedBlockedReason(tx, row.id, next.blockedReason);
      await this.emit(tx, { orgUpsert: next });
      emitted++;
    }
    return emitted;
  }

  async orgView(q: Queryable, org: OrgRow, role: string): Promise<Org> {
    const { state, monthSpendMicros, month } = await this.orgState(q, org);
    return {
      id: org.id,
      name: org.name,
      tier: org.tier,
      creditsMicros: org.credits_micros,
      freeGrantMicros: state.freeGrantMicros,
      spendTotalMicros: org.spend_total_micros,
      monthSpendMicros,
      balanceMicros: state.balanceMicros,
      ownCapMicros: org.own_cap_micros ?? undefined,
      effectiveCapMicros: state.effectiveCapMicros ?? undefined,
      blocked: state.blocked,
      blockedReason: state.blockedReason,
      createdAt: org.created_at,
      role,
      month,
    };
  }

  /**
   * Re-reads the config file. A bad file is rejected with ConfigError and the old config stays in
   * force; a good one becomes a new version and every organisation's blocked state is recomputed.
   */
  async reloadConfig(): Promise<number> {
    const next = readGatewayConfig(this.opts.configPath);
    return this.db.tx(async (tx) => {
      const missing = (await tiersInUse(tx)).filter((t) => !next.settings.tiers.has(t));
      if (missing.length > 0) throw new ConfigError(`gateway config: tier ${JSON.stringify(missing[0])} is used by organisations but not defined`);
      const previous = this.current;
      this.current = next;
      this.published = withSteer(next.proto, this.steer);
      try {
        const version = await this.emit(tx, { config: this.published });
        await writeTierSettings(tx, next.settings.tiers.values());
        await this.refreshOrgs(tx, 'all', { fundsChanged: true });
        return version;
      } catch (err) {
        this.current = previous;
        this.published = withSteer(previous.proto, this.steer);
        throw err;
      }
    });
  }

  /** Drained and disabled deployments by model and id (deployment-steer.ts). */
  get deploymentStates(): ReadonlyMap<string, string> {
    return this.steer;
  }

  /**
   * Drains, disables or enables one deployment of a pooled model without a config reload: stored,
   * and published as a new config version in the same transaction. Returns that version.
   */
  async setDeploymentState(model: string, deployment: string, state: string): Promise<number> {
    return this.db.tx(async (tx) => {
      // Checked against the rows in this transaction, so two changes at once never drain a model's last two.
      const next = new Map((await listDeploymentStates(tx)).map((r) => [steerKey(r.model, r.deployment), r.state]));
      checkSteer(this.current.proto, next, model, deployment, state);
      await setDeploymentState(tx, model, deployment, state, this.nowIso());
      if (state === 'enabled') next.delete(steerKey(model, deployment));
      else next.set(steerKey(model, deployment), state);
      const published = withSteer(this.current.proto, next);
      const version = await this.emit(tx, { config: published });
      tx.afterCommit(() => {
        this.steer = next;
        this.published = published;
      });
      return version;
    });
  }

  /** Monthly caps start over on the first of the month (UTC): recompute everyone once it turns. */
  async checkMonthRollover(): Promise<void> {
    const month = monthOf(this.opts.now());
    if (month === this.lastMonth) return;
    this.lastMonth = month;
    await this.db.tx((tx) => this.refreshOrgs(tx, 'all'));
  }

  get config(): GatewayConfig {
    return this.published;
  }
}
