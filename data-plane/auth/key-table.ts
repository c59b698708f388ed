// The node's in-memory view of the control plane: keys by peppered hash, organisations, tiers, models
// and the route table. Pure (no I/O): the sync client feeds it snapshots and deltas.
// A snapshot builds a new GatewayState and the holder swaps one reference; a delta mutates the current
// state in place (single-threaded, so a request sees the state before or after a delta, never half of it).
import { IpRangeSet } from '../../proto/lib/ip.js';
import { hashKey, secretsEqual } from '../../proto/lib/keys.js';
import type { Delta, GatewayConfig, KeyEntry, KeyTombstone, ModelConfig, OrgEntry, Snapshot, TierConfig } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyLimits } from '../limits/key-budgets.js';
import { RouteTable } from '../http/routes.js';

/** An organisation, one mutable object per org id: keys point at it, so an org upsert reaches them at once. */
export interface OrgState {
  orgId: string;
  tier: string;
  blocked: boolean;
  blockedReason: string;
  /** The account owning the organisation ('' when unknown): its organisations share body-budget caps. */
  ownerAccountId: string;
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

/** The allowed_models of most keys (empty: the whole plan), one Set shared by all of them. */
const NO_MODELS: ReadonlySet<string> = new Set();

export class GatewayState {
  version = 0;
  view: ConfigView;
  readonly keysByHash = new Map<string, KeyRecord>();
  readonly hashByKeyId = new Map<string, string>();
  readonly orgs = new Map<string, OrgState>();
  /** Revoked keys by hash: they never authenticate; they only name the key in the request log. */
  readonly tombstones = new Map<string, { keyId: string; projectId: string; orgId: string }>();
  /** Cached `/v1/models` bodies per key id; dropped whenever anything they depend on changes. */
  modelListCache = new Map<string, string>();

  constructor(config?: GatewayConfig) {
    this.view = buildConfigView(config);
  }

  static fromSnapshot(s: Snapshot): GatewayState {
    const st = new GatewayState(s.config);
    st.version = s.version;
    for (const o of s.orgs) st.upsertOrg(o);
    for (const k of s.keys) st.upsertKey(k);
    for (const t of s.tombstones ?? []) st.addTombstone(t);
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

  private orgFor(orgId: string): OrgState {
    let org = this.orgs.get(orgId);
    if (!org) {
      // Not announced yet: no tier, so no plan, so no model is allowed until it arrives.
      org = { orgId, tier: '', blocked: false, blockedReason: '', ownerAccountId: '' };
      this.orgs.set(orgId, org);
    }
    return org;
  }

  upsertKey(k: KeyEntry): void {
    const old = this.hashByKeyId.get(k.keyId);
    if (old !== undefined && old !== k.keyHash) this.keysByHash.delete(old);
    this.keysByHash.set(k.keyHash, {
      keyId: k.keyId,
      keyHash: k.keyHash,
      projectId: k.projectId,
      orgId: k.orgId,
      org: this.orgFor(k.orgId),
      allowedModels: k.allowedModels.length === 0 ? NO_MODELS : new Set(k.allowedModels),
      limits: { keyId: k.keyId, rpmLimit: k.rpmLimit, tpmLimit: k.tpmLimit, maxParallel: k.maxParallelRequests },
      expiresAtMs: k.expiresAtMs ?? 0,
    });
    this.hashByKeyId.set(k.keyId, k.keyHash);
  }

  addTombstone(t: KeyTombstone): void {
    if (!this.keysByHash.has(t.keyHash)) this.tombstones.set(t.keyHash, { keyId: t.keyId, projectId: t.projectId, orgId: t.orgId });
  }

  removeKey(keyHash: string): void {
    const rec = this.keysByHash.get(keyHash);
    if (!rec) return;
    this.keysByHash.delete(keyHash);
    this.tombstones.set(keyHash, { keyId: rec.keyId, projectId: rec.projectId, orgId: rec.orgId });
    if (this.hashByKeyId.get(rec.keyId) === keyHash) this.hashByKeyId.delete(rec.keyId);
  }

  /** One HMAC and one Map lookup. The Map holds only hashes; the key itself is never stored. An expired key (at `nowMs`) is not found. */
  lookup(pepper: Buffer, key: string, nowMs?: number): KeyRecord | undefined {
    const hash = hashKey(pepper, key);
    const rec = this.keysByHash.get(hash);
    if (rec?.expiresAtMs && nowMs !== undefined && nowMs >= rec.expiresAtMs) return undefined;
    // The Map finds the candidate; the stored hash is still compared in constant time.
    return rec && secretsEqual(rec.keyHash, hash) ? rec : undefined;
  }

  /**
   * The revoked (or expired, not yet revoked) key a presented value belongs to, so the refusal is
   * logged against it (only on the 401 path: one more HMAC there).
   */
  tombstone(pepper: Buffer, key: string): { keyId: string; projectId: string; orgId: string } | undefined {
    const hash = hashKey(pepper, key);
    return this.tombstones.get(hash) ?? this.keysByHash.get(hash);
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

/** Holds the current state; a snapshot swaps the reference. */
export class StateHolder {
  current: GatewayState = new GatewayState();
  ready = false;

  applySnapshot(s: Snapshot): void {
    this.current = GatewayState.fromSnapshot(s);
    this.ready = true;
  }
}
