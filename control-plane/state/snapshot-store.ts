// What every node must hold, apart from the protocol (go-control-plane's cache vs server split): the
// current version, the state at that version, the retained changes, and subscribers. Plain class, no
// I/O. The caller applies each change right after the SQLite transaction that wrote it commits, in
// version order, so memory and database never disagree.
import type { Change, Delta, GatewayConfig, KeyEntry, KeyTombstone, OrgEntry, ProjectEntry, Snapshot } from '../../proto/gen/tollgate/v1/sync.js';

export interface VersionedChange {
  version: number;
  change: Change;
}

export interface SnapshotStoreInit {
  version: number;
  config: GatewayConfig;
  keys: KeyEntry[];
  orgs: OrgEntry[];
  /** Revoked keys, so nodes log attempts made with them against the key. */
  tombstones?: KeyTombstone[];
  /** Projects with a spend cap (docs/money-limits.md). */
  projects?: ProjectEntry[];
  /** Retained changes, contiguous, ending at `version` (may be empty). */
  changes?: VersionedChange[];
  /** How many changes to keep for deltas; older nodes get a snapshot. */
  maxRetained?: number;
}

export type DeltaListener = (delta: Delta) => void;

export class SnapshotStore {
  private currentVersion: number;
  private currentConfig: GatewayConfig;
  private readonly keys = new Map<string, KeyEntry>();
  private readonly keysById = new Map<string, KeyEntry>();
  private readonly orgs = new Map<string, OrgEntry>();
  private readonly tombstones = new Map<string, KeyTombstone>();
  /** Projects with a cap only: a project without one costs nothing here or on the nodes. */
  private readonly projects = new Map<string, ProjectEntry>();
  private retained: VersionedChange[];
  private readonly maxRetained: number;
  private readonly listeners = new Set<DeltaListener>();

  constructor(init: SnapshotStoreInit) {
    this.currentVersion = init.version;
    this.currentConfig = init.config;
    for (const k of init.keys) this.putKey(k);
    for (const o of init.orgs) this.orgs.set(o.orgId, o);
    for (const t of init.tombstones ?? []) this.tombstones.set(t.keyHash, t);
    for (const p of init.projects ?? []) this.putProject(p);
    this.maxRetained = init.maxRetained ?? 10_000;
    const changes = (init.changes ?? []).slice(-this.maxRetained);
    for (let i = 1; i < changes.length; i++) {
      if (changes[i].version !== changes[i - 1].version + 1) throw new Error('retained changes must be contiguous');
    }
    if (changes.length > 0 && changes[changes.length - 1].version !== init.version) {
      throw new Error('retained changes must end at the current version');
    }
    this.retained = changes;
  }

  get version(): number {
    return this.currentVersion;
  }

  get config(): GatewayConfig {
    return this.currentConfig;
  }

  get keyCount(): number {
    return this.keys.size;
  }

  org(orgId: string): OrgEntry | undefined {
    return this.orgs.get(orgId);
  }

  /** The credentialed key with this id (lease grants look limits up by id). */
  /** Every organisation's id (for the money slices a node is granted in bulk). */
  orgIds(): string[] {
    return [...this.orgs.keys()];
  }

  /** A project's cap (micros), or 0 when it has none. */
  projectCap(projectId: string): number {
    return this.projects.get(projectId)?.capMicros ?? 0;
  }

  private putProject(p: ProjectEntry): void {
    if (p.capMicros > 0) this.projects.set(p.projectId, p);
    else this.projects.delete(p.projectId);
  }

  keyById(keyId: string): KeyEntry | undefined {
    return this.keysById.get(keyId);
  }

  private putKey(k: KeyEntry): void {
    this.keys.set(k.keyHash, k);
    this.keysById.set(k.keyId, k);
  }

  private removeKey(keyHash: string): void {
    const k = this.keys.get(keyHash);
    this.keys.delete(keyHash);
    if (k) {
      this.keysById.delete(k.keyId);
      this.tombstones.set(keyHash, { keyHash, keyId: k.keyId, projectId: k.projectId, orgId: k.orgId });
    }
  }

  /** Applies the change written as `version`; it MUST be the next version. Notifies subscribers with a one-change delta. */
  apply(version: number, change: Change): void {
    if (version !== this.currentVersion + 1) {
      throw new Error(`change version ${version} does not follow ${this.currentVersion}`);
    }
    if (change.keyUpsert) this.putKey(change.keyUpsert);
    else if (change.keyRemoved !== undefined) this.removeKey(change.keyRemoved);
    else if (change.orgUpsert) this.orgs.set(change.orgUpsert.orgId, change.orgUpsert);
    else if (change.config) this.currentConfig = change.config;
    else if (change.projectUpsert) this.putProject(change.projectUpsert);
    const from = this.currentVersion;
    this.currentVersion = version;
    this.retained.push({ version, change });
    if (this.retained.length > this.maxRetained) this.retained.splice(0, this.retained.length - this.maxRetained);
    const delta: Delta = { fromVersion: from, toVersion: version, changes: [change] };
    for (const l of [...this.listeners]) l(delta);
  }

  snapshot(): Snapshot {
    return {
      version: this.currentVersion,
      config: this.currentConfig,
      keys: [...this.keys.values()],
      orgs: [...this.orgs.values()],
      tombstones: [...this.tombstones.values()],
      projectCaps: { projects: [...this.projects.values()] },
    };
  }

  /** The changes after `version`, or null when they are not all retained (or `version` is unknown). */
  changesSince(version: number): Change[] | null {
    if (version > this.currentVersion || version < 0) return null;
    if (version === this.currentVersion) return [];
    const first = this.retained[0]?.version;
    if (first === undefined || version < first - 1) return null;
    return this.retained.slice(version - first + 1).map((c) => c.change);
  }

  /** What a node that holds `haveVersion` needs first: nothing, one delta, or a snapshot. */
  catchUp(haveVersion: number): { kind: 'none' } | { kind: 'delta'; delta: Delta } | { kind: 'snapshot'; snapshot: Snapshot } {
    if (haveVersion === this.currentVersion && haveVersion > 0) return { kind: 'none' };
    if (haveVersion > 0) {
      const changes = this.changesSince(haveVersion);
      if (changes) return { kind: 'delta', delta: { fromVersion: haveVersion, toVersion: this.currentVersion, changes } };
    }
    return { kind: 'snapshot', snapshot: this.snapshot() };
  }

  subscribe(listener: DeltaListener): () => void {
    this.listeners.add(listener);
    return () => void this.listeners.delete(listener);
  }
}
