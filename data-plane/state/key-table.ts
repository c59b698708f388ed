// The node's in-memory view of the control plane: keys by peppered hash, organisations, tiers, models
// and the route table. Pure (no I/O): the sync client feeds it snapshots and deltas.
// A snapshot builds a new GatewayState and the holder swaps one reference; a delta mutates the current
// state in place (single-threaded, so a request sees the state before or after a delta, never half of it).
import { IpRangeSet } from '../../proto/lib/ip.js';
import type { Delta, GatewayConfig, KeyEntry, KeyTombstone, ModelConfig, OrgEntry, ProjectEntry, Snapshot, TierConfig } from '../../proto/gen/tollgate/v1/sync.js';
import { limitResetOf, type LimitReset } from '../../proto/lib/spend-limits.js';
import type { KeyLimits } from '../limits/key-budgets.js';
import { RouteTable } from '../routing/routes.js';
import { keyHmac } from './key-hmac.js';
import { PackedKeyTable } from './packed-keys.js';

/** An organisation, one mutable object per org id: keys point at it, so an org upsert reaches them at once. */
export interface OrgState {
  orgId: string;
  tier: string;
  blocked: boolean;
  blockedReason: string;
  /** The account owning the organisation ('' when unknown): its organisations share body-budget caps. */
  ownerAccountId: string;
}

/** A project, one mutable object per project id (as OrgState): a cap set or cleared reaches its keys at once. */
export interface ProjectState {
  projectId: string;
  /** The monthly spend cap in micros; 0: none (docs/money-limits.md). */
  capMicros: number;
  /** The current month's pool (data-plane/leases/request-money.ts keeps it; '' before the first use). */
  pool: LimitPeriod;
}

/** A key's own money limit, fixed at creation (docs/money-limits.md). */
export interface KeyMoneyLimit {
  keyId: string;
  micros: number;
  reset: LimitReset;
  /** The current period's pool (data-plane/leases/request-money.ts keeps it). */
  pool: LimitPeriod;
}

/** The pool of a limit's current period: its id and the period's bounds (ms). */
export interface LimitPeriod {
  id: string;
  start: number;
  end: number;
}

export interface KeyRecord {
  keyId: string;
  keyHash: string;
  projectId: string;
  orgId: string;
  org: OrgState;
  /** Empty: every model of the plan. */
  allowedModels: ReadonlySet<string>;
  limits: KeyLimits;
  /** ms since the epoch from which the key no longer authenticates, even cut off from the control plane; 0/absent: never. */
  expiresAtMs?: number;
  /** The key's project (its monthly cap, if any). */
  project?: ProjectState;
  /** The key's own money limit; absent: none. */
  moneyLimit?: KeyMoneyLimit;
}

/** The parts of the config that change only with a config version, precomputed at sync time. */
export interface ConfigView {
  config: GatewayConfig;
  models: ReadonlyMap<string, ModelConfig>;
  tiers: ReadonlyMap<string, TierView>;
  routes: RouteTable;
  /** Peers whose X-Forwarded-For is believed: parsed once per config version, never per request. */
  trustedProxies: IpRangeSet;
}

export interface TierView {
  tier: TierConfig;
  plan: ReadonlySet<string>;
}

const EMPTY_CONFIG: GatewayConfig = {
  serviceName: 'tollgate',
  tiers: [],
  models: [],
  toolBackends: [],
  realtimeUpstreams: [],
  trustedProxies: [],
  maxStalenessMs: 0,
};

export function buildConfigView(config: GatewayConfig | undefined): ConfigView {
  const c = config ?? EMPTY_CONFIG;
  const models = new Map<string, ModelConfig>();
  for (const m of c.models) models.set(m.id, m);
  const tiers = new Map<string, TierView>();
  for (const t of c.tiers) tiers.set(t.name, { tier: t, plan: new Set(t.allowedModels) });
  return {
    config: c,
    models,
    tiers,
    routes: new RouteTable(c.toolBackends),
    // The control plane refuses invalid entries; should one arrive anyway, it trusts nothing.
    trustedProxies: IpRangeSet.parse(c.trustedProxies, { skipInvalid: true }),
  };
}

export type DeltaResult = 'applied' | 'stale' | 'gap';

/** How many looked-up keys keep their materialized `KeyRecord` (most keys are quiet; hot ones stay). */
const RECORD_CACHE = 16_384;

/** A revoked key as the request log names it. */
export interface KeyNames {
  keyId: string;
  projectId: string;
  orgId: string;
}

/**
 * The live keys by hash (hex), read-only and Map-like, for the code that checks a hash it already has
 * (open sockets, a session admitted before a delta). Revoked keys are not in it.
 */
export interface KeyHashView {
  get(keyHash: string): KeyRecord | undefined;
  has(keyHash: string): boolean;
  keys(): IterableIterator<string>;
  readonly size: number;
}

export class GatewayState {
  version = 0;
  view: ConfigView;
  /** Every key, live or revoked, packed (packed-keys.ts); `KeyRecord`s exist only for keys looked up. */
  private readonly packed: PackedKeyTable;
  /** Materialized records by record number; dropped when their record changes. */
  private readonly records = new Map<number, KeyRecord>();
  /** The record numbers cached, in the order they were (a ring): the oldest is evicted first. */
  private readonly cachedOrder = new Int32Array(RECORD_CACHE).fill(-1);
  private cachedNext = 0;
  readonly keysByHash: KeyHashView;
  readonly orgs = new Map<string, OrgState>();
  /** Projects met (as keys' projects or with a cap); only those with a cap cost anything on the request path. */
  readonly projects = new Map<string, ProjectState>();
  /** The keys with their own money limit (most have none). */
  private readonly keyLimits = new Map<string, KeyMoneyLimit>();
  /** Cached `/v1/models` bodies per key id; dropped whenever anything they depend on changes. */
  modelListCache = new Map<string, string>();

  constructor(config?: GatewayConfig, expectedKeys = 0) {
    this.view = buildConfigView(config);
    this.packed = new PackedKeyTable(expectedKeys);
    const self = this;
    this.keysByHash = {
      get: (keyHash) => {
        const rec = self.packed.findHash(keyHash);
        return rec >= 0 && self.packed.isLive(rec) ? self.record(rec) : undefined;
      },
      has: (keyHash) => {
        const rec = self.packed.findHash(keyHash);
        return rec >= 0 && self.packed.isLive(rec);
      },
      keys: () => self.packed.liveHashes(),
      get size() {
        return self.packed.liveCount;
      },
    };
  }

  /** Bytes of the packed key table's arrays (for benchmarks and diagnostics). */
  get keyTableBytes(): number {
    return this.packed.byteSize;
  }

  static fromSnapshot(s: Snapshot): GatewayState {
    const tombstones = s.tombstones ?? [];
    const st = new GatewayState(s.config, s.keys.length + tombstones.length);
    st.version = s.version;
    for (const o of s.orgs) st.upsertOrg(o);
    for (const p of s.projectCaps?.projects ?? []) st.upsertProject(p);
    for (const k of s.keys) st.upsertKey(k);
    for (const t of tombstones) st.addTombstone(t);
    return st;
  }

  /** Applies a delta only on top of the version it was made from. */
  applyDelta(d: Delta): DeltaResult {
    if (d.toVersion <= this.version) return 'stale';
    if (d.fromVersion !== this.version) return 'gap';
    for (const c of d.changes) {
      if (c.keyUpsert) this.upsertKey(c.keyUpsert);
      else if (c.keyRemoved !== undefined) this.removeKey(c.keyRemoved);
      else if (c.orgUpsert) this.upsertOrg(c.orgUpsert);
      else if (c.config) this.view = buildConfigView(c.config);
      else if (c.projectUpsert) this.upsertProject(c.projectUpsert);
    }
    this.modelListCache = new Map();
    this.version = d.toVersion;
    return 'applied';
  }

  upsertOrg(o: OrgEntry): void {
    const cur = this.orgs.get(o.orgId);
    if (cur) {
      cur.tier = o.tier;
      cur.blocked = o.blocked;
      cur.blockedReason = o.blockedReason;
      cur.ownerAccountId = o.ownerAccountId;
    } else {
      this.orgs.set(o.orgId, { orgId: o.orgId, tier: o.tier, blocked: o.blocked, blockedReason: o.blockedReason, ownerAccountId: o.ownerAccountId });
    }
  }

  /** A project's cap set or cleared (0). */
  upsertProject(p: ProjectEntry): void {
    this.projectFor(p.projectId).capMicros = Math.max(0, p.capMicros);
  }

  private projectFor(projectId: string): ProjectState {
    let p = this.projects.get(projectId);
    if (!p) {
      p = { projectId, capMicros: 0, pool: { id: '', start: 0, end: 0 } };
      this.projects.set(projectId, p);
    }
    return p;
  }

  private orgFor(orgId: string): OrgState {
    let org = this.orgs.get(orgId);
    if (!org) {
      // Not announced yet: no tier, so no plan, so no model is allowed until it arrives.
      org = { orgId, tier: '', blocked: false, blockedReason: '', ownerAccountId: '' };
      this.orgs.set(orgId, org);
    }
    return org;
  }

  /** A key added or changed in place; a key id that arrives with a new hash forgets its old one. */
  upsertKey(k: KeyEntry): void {
    this.orgFor(k.orgId);
    const prior = this.packed.findKeyId(k.keyId);
    if (prior >= 0) this.records.delete(prior);
    if ((k.limitMicros ?? 0) > 0) {
      // Fixed at creation: an upsert of the same key keeps what it knows of the current period.
      if (!this.keyLimits.has(k.keyId)) this.keyLimits.set(k.keyId, { keyId: k.keyId, micros: k.limitMicros!, reset: limitResetOf(k.limitReset), pool: { id: '', start: 0, end: 0 } });
    }
    else if (this.keyLimits.size > 0) this.keyLimits.delete(k.keyId);
    const rec = this.packed.put({
      keyId: k.keyId,
      keyHash: k.keyHash,
      projectId: k.projectId,
      orgId: k.orgId,
      allowedModels: k.allowedModels,
      rpmLimit: k.rpmLimit,
      tpmLimit: k.tpmLimit,
      maxParallel: k.maxParallelRequests,
      expiresAtMs: k.expiresAtMs ?? 0,
    });
    this.records.delete(rec);
  }

  addTombstone(t: KeyTombstone): void {
    this.packed.putRevoked(t.keyHash, t.keyId, t.projectId, t.orgId);
  }

  /** Revocation: the key never authenticates again but is still found by `tombstone`. */
  removeKey(keyHash: string): void {
    const rec = this.packed.findHash(keyHash);
    if (rec < 0) return;
    this.packed.revoke(keyHash);
    this.records.delete(rec);
  }

  /** One HMAC and one probe of the packed index. Only hashes are held; the key itself is never stored. An expired key (at `nowMs`) is not found. */
  lookup(pepper: Buffer, key: string, nowMs?: number): KeyRecord | undefined {
    // The index finds the candidate; its stored hash is then compared in constant time (findDigest).
    const rec = this.packed.findDigest(keyHmac(pepper, key));
    if (rec < 0 || !this.packed.isLive(rec)) return undefined;
    const expires = this.packed.expiresAtMs(rec);
    if (expires && nowMs !== undefined && nowMs >= expires) return undefined;
    return this.record(rec);
  }

  /**
   * The revoked (or expired, not yet revoked) key a presented value belongs to, so the refusal is
   * logged against it (only on the 401 path: one more HMAC there).
   */
  tombstone(pepper: Buffer, key: string): KeyNames | undefined {
    const rec = this.packed.findDigest(keyHmac(pepper, key));
    if (rec < 0) return undefined;
    return { keyId: this.packed.keyId(rec), projectId: this.packed.projectId(rec), orgId: this.packed.orgId(rec) };
  }

  /** The `KeyRecord` of a live record: cached while it is among the recently looked-up ones. */
  private record(rec: number): KeyRecord {
    const hit = this.records.get(rec);
    if (hit) return hit;
    const p = this.packed;
    const keyId = p.keyId(rec);
    const orgId = p.orgId(rec);
    const l = p.limits(rec);
    const r: KeyRecord = {
      keyId,
      keyHash: p.keyHash(rec),
      projectId: p.projectId(rec),
      orgId,
      org: this.orgFor(orgId),
      allowedModels: p.allowedModels(rec),
      limits: { keyId, rpmLimit: l.rpmLimit, tpmLimit: l.tpmLimit, maxParallel: l.maxParallel },
      expiresAtMs: p.expiresAtMs(rec),
      project: this.projectFor(p.projectId(rec)),
      moneyLimit: this.keyLimits.get(keyId),
    };
    // A slot's old record may already be gone (changed since): deleting it again is harmless.
    const evict = this.cachedOrder[this.cachedNext];
    if (evict >= 0) this.records.delete(evict);
    this.cachedOrder[this.cachedNext] = rec;
    this.cachedNext = (this.cachedNext + 1) % RECORD_CACHE;
    this.records.set(rec, r);
    return r;
  }

  /** The models a key may call: the plan ∩ allowed_models (empty allowed_models: the whole plan). */
  mayUseModel(rec: KeyRecord, modelId: string): boolean {
    const tier = this.view.tiers.get(rec.org.tier);
    if (!tier || !tier.plan.has(modelId)) return false;
    return rec.allowedModels.size === 0 || rec.allowedModels.has(modelId);
  }

  /** Models visible to a key, in config order. */
  modelsFor(rec: KeyRecord): ModelConfig[] {
    return this.view.config.models.filter((m) => this.mayUseModel(rec, m.id));
  }
}

/**
 * States built while their snapshot was decoded (snapshot-decoder.ts), by the snapshot they stand
 * for: StateHolder.applySnapshot takes the state built instead of building one from the snapshot.
 */
export const prebuilt = new WeakMap<Snapshot, GatewayState>();

/** Holds the current state; a snapshot swaps the reference. */
export class StateHolder {
  current: GatewayState = new GatewayState();
  ready = false;

  applySnapshot(s: Snapshot): void {
    this.current = prebuilt.get(s) ?? GatewayState.fromSnapshot(s);
    this.ready = true;
  }
}
