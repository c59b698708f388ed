// Which project owns each upstream object of the Responses API (a stored response `resp_…`, a
// conversation `conv_…`, an item seen in an answer to the project), and with which model: the node's
// answer to "may this key name this id?", asked before any request naming it reaches the upstream
// (the upstream keeps every customer's objects under the operator's one account). Fed by what this
// node creates (at once) and by the control plane's sync for what other nodes created. Bounded per
// project and per organisation (docs/design.md#owner-records): a project past its bound loses its own
// oldest records, an organisation past its bound its own (from its project holding the most), never
// another's; the node's cap takes from the organisation holding the most. Placed: a node built
// `placed` holds the records of the projects it serves only, asking the control plane for a
// project's (`onNeed`) the first time a request of it misses one; until they arrived (`caughtUp`) a
// miss is not yet an answer. No I/O (timers for the waits).

import { OldestFirst } from './oldest-first.js';

/** OpenAI keeps stored responses 30 days; the gateway keeps its record of who owns one as long. */
export const RESPONSE_RETENTION_MS = 30 * 24 * 60 * 60 * 1000;
/**
 * Records held by one node at most, whatever the bounds below; past it the organisation holding the
 * most loses its oldest (their ids then answer 404), so one holding no more than this divided by the
 * organisations with records here never loses one. About 250 bytes of heap each (the id, the map
 * entry, the record and its place in its project's order; project and model strings are shared).
 */
export const MAX_RESPONSE_OWNERS = 1_000_000;
/** Records per project when the config names no bound (responses.owner_records_per_project). */
export const DEFAULT_OWNER_RECORDS_PER_PROJECT = 100_000;
/** Records per organisation when the config names no bound (responses.owner_records_per_org): a quarter of the cap. */
export const DEFAULT_OWNER_RECORDS_PER_ORG = 250_000;
/** Where the records of a project whose organisation this node does not know are counted (with the project's id). */
const NO_ORG = '\0project:';

export interface ResponseOwner {
  projectId: string;
  /** Given to `add`: the project's organisation, when the one recording it knows it (a request's key does); kept per project. */
  orgId?: string;
  /** The gateway's model id the response was created with. */
  model: string;
  createdAtMs: number;
  /**
   * The deployment of a pooled model whose upstream account holds the object (requests naming it go
   * there only); absent or empty: the model's only upstream, or its first deployment.
   */
  deployment?: string;
  /**
   * The tokens a request continuing this response re-reads (its input and output as the upstream
   * reported them), when this node saw it end; kept on this node only.
   */
  contextTokens?: number;
}

/** Deleted ids remembered (the oldest forgotten first). */
const MAX_DELETED = 10_000;
/** How long a request whose id missed waits for its project's records to arrive (then 503). */
export const OWNERS_WAIT_MS = 3_000;

export interface ResponseOwnersOptions {
  /** Records held at most, whatever the bounds below (MAX_RESPONSE_OWNERS). */
  maxEntries?: number;
  retentionMs?: number;
  /** The per-project bound, read as each record is added (it follows the config). */
  perProject?: () => number;
  /** The per-organisation bound, read likewise. */
  perOrg?: () => number;
  /** Holds only the projects it serves (else every project's, all sent to it). */
  placed?: boolean;
}

/** A record as held: with its id, and marked when it leaves (its place in its project's queue is then stepped over). */
interface Held extends ResponseOwner {
  id: string;
  gone: boolean;
}

/** The records one organisation holds here (a project whose organisation is not known: its own). */
interface OrgRecords {
  projects: Set<string>;
  size: number;
}

/** Whose project asks for records: a key's (its project and organisation). */
export interface ProjectOf {
  readonly projectId: string;
  readonly orgId: string;
}

export class ResponseOwners {
  /** Asks the control plane for a project's records (set by the node's wiring; placed only). */
  onNeed: ((projectId: string) => void) | null = null;
  /** Projects whose retained records this node holds (placed), and those asked for. */
  private readonly loaded = new Set<string>();
  private readonly asked = new Map<string, Set<(loaded: boolean) => void>>();
  private readonly byId = new Map<string, Held>();
  /** Ids deleted upstream through this node, newest last: a project's records sent again (a catch-up) do not bring them back. */
  private readonly deleted = new Set<string>();
  /** Each project's records, in the order they were recorded (near enough creation order): its oldest first. */
  private readonly byProject = new Map<string, OldestFirst<Held>>();
  /** One copy of each project id and model id (records from the sync decoder each bring their own). */
  private readonly strings = new Map<string, string>();
  /**
   * Each project's organisation, as the keys that made or asked for its records said (the sync's
   * records do not say; a placed node holds only projects its requests asked for).
   */
  private readonly orgOfProject = new Map<string, string>();
  /** The records by organisation (orgKeyOf), for its bound and the node's cap. */
  private readonly byOrg = new Map<string, OrgRecords>();

  private readonly maxEntries: number;
  private readonly retentionMs: number;
  private readonly perProject: () => number;
  private readonly perOrg: () => number;
  /** Holds only the projects it serves (else every project's, all sent to it). */
  readonly placed: boolean;

  constructor(opts: ResponseOwnersOptions = {}) {
    this.maxEntries = opts.maxEntries ?? MAX_RESPONSE_OWNERS;
    this.retentionMs = opts.retentionMs ?? RESPONSE_RETENTION_MS;
    this.perProject = opts.perProject ?? (() => DEFAULT_OWNER_RECORDS_PER_PROJECT);
    this.perOrg = opts.perOrg ?? (() => DEFAULT_OWNER_RECORDS_PER_ORG);
    this.placed = opts.placed ?? false;
  }

  /** Whether every retained record of the project is here (always, unplaced). */
  holdsAllOf(projectId: string): boolean {
    return !this.placed || this.loaded.has(projectId);
  }

  /**
   * A request of `key`'s project missed an id: once its records are all here, `done(true)`; asked for
   * them (once) if not yet, and `done(false)` after `waitMs` if they did not come. At once when here.
   */
  whenHeld(key: ProjectOf, waitMs: number, done: (loaded: boolean) => void): void {
    const projectId = key.projectId;
    this.noteOrg(projectId, key.orgId);
    if (this.holdsAllOf(projectId)) return done(true);
    let waiters = this.asked.get(projectId);
    if (!waiters) {
      this.asked.set(projectId, (waiters = new Set()));
      this.onNeed?.(projectId);
    }
    const w = (loaded: boolean) => {
      clearTimeout(timer);
      done(loaded);
    };
    const timer = setTimeout(() => {
      waiters.delete(w);
      done(false);
    }, waitMs);
    timer.unref();
    waiters.add(w);
  }

  /** The control plane sent every retained record of these projects. */
  caughtUp(projectIds: readonly string[]): void {
    for (const p of projectIds) {
      this.loaded.add(p);
      const waiters = this.asked.get(p);
      this.asked.delete(p);
      for (const w of waiters ?? []) w(true);
    }
  }

  /** The projects whose records this node holds (a reconnect's Hello), and those asked for and not yet sent (asked again). */
  heldProjects(): string[] {
    return [...this.loaded];
  }

  askedProjects(): string[] {
    return [...this.asked.keys()];
  }

  get size(): number {
    return this.byId.size;
  }

  /**
   * Records who owns an id. A known id keeps its place and its first owner (a record the sync brings
   * back changes nothing, and an id another project's answer names again never changes hands); a
   * record older than all its project keeps when the project is at its bound is not added (it would
   * be the first to go: the sync's echo of one this node already evicted). Then the organisation's
   * bound, then the node's cap.
   */
  add(id: string, owner: ResponseOwner): void {
    if (this.deleted.has(id)) return;
    const known = this.byId.get(id);
    if (known) {
      if (known.projectId === owner.projectId && owner.contextTokens !== undefined) known.contextTokens = owner.contextTokens;
      return;
    }
    const projectId = this.intern(owner.projectId);
    if (owner.orgId) this.noteOrg(projectId, owner.orgId);
    let ids = this.byProject.get(projectId);
    const bound = Math.max(1, this.perProject());
    if (ids && ids.size >= bound) {
      const oldest = ids.oldest();
      if (oldest && owner.createdAtMs <= oldest.createdAtMs) return;
    }
    const record: Held = { id, gone: false, projectId, model: this.intern(owner.model), createdAtMs: owner.createdAtMs };
    if (owner.deployment) record.deployment = this.intern(owner.deployment);
    if (owner.contextTokens !== undefined) record.contextTokens = owner.contextTokens;
    this.byId.set(id, record);
    if (!ids) this.byProject.set(projectId, (ids = new OldestFirst()));
    ids.push(record);
    const org = this.orgRecords(this.orgKeyOf(projectId));
    org.projects.add(projectId);
    org.size++;
    while (ids.size > bound) this.remove(ids.oldest()!.id);
    const orgBound = Math.max(1, this.perOrg());
    // A hundredth of the bound at once, so a flood scans the organisation's projects rarely.
    if (org.size > orgBound) this.evictWithin(org, org.size - orgBound + Math.floor(orgBound / 100));
    if (this.byId.size > this.maxEntries) this.evictFromLargest();
  }

  /** Past the node's cap: the organisation holding the most records gives up its oldest. */
  private evictFromLargest(): void {
    let largest: OrgRecords | undefined;
    for (const org of this.byOrg.values()) if (!largest || org.size > largest.size) largest = org;
    if (!largest) return;
    // A hundredth of what it holds at once, so a flood scans the organisations rarely.
    this.evictWithin(largest, Math.min(largest.size, this.byId.size - this.maxEntries + Math.floor(largest.size / 100)));
  }

  /** `n` records of one organisation go: the oldest of its project holding the most, and so on. */
  private evictWithin(org: OrgRecords, n: number): void {
    while (n > 0 && org.size > 0) {
      let largest: OldestFirst<Held> | undefined;
      for (const p of org.projects) {
        const ids = this.byProject.get(p);
        if (ids && (!largest || ids.size > largest.size)) largest = ids;
      }
      if (!largest) return;
      for (let take = Math.min(n, largest.size); take > 0; take--, n--) this.remove(largest.oldest()!.id);
    }
  }

  /** Where a project's records are counted: its organisation, or the project itself while that is not known. */
  private orgKeyOf(projectId: string): string {
    return this.orgOfProject.get(projectId) ?? NO_ORG + projectId;
  }

  private orgRecords(key: string): OrgRecords {
    let org = this.byOrg.get(key);
    if (!org) this.byOrg.set(key, (org = { projects: new Set(), size: 0 }));
    return org;
  }

  /** A key of `orgId` made or asked for the project's records: they count as its organisation's from now on. */
  private noteOrg(projectId: string, orgId: string): void {
    const before = this.orgKeyOf(projectId);
    if (!orgId || before === orgId) return;
    this.orgOfProject.set(projectId, this.intern(orgId));
    const ids = this.byProject.get(projectId);
    if (!ids) return;
    const from = this.byOrg.get(before);
    if (from) {
      from.projects.delete(projectId);
      from.size -= ids.size;
      if (from.projects.size === 0) this.byOrg.delete(before);
    }
    const to = this.orgRecords(orgId);
    to.projects.add(projectId);
    to.size += ids.size;
    const orgBound = Math.max(1, this.perOrg());
    if (to.size > orgBound) this.evictWithin(to, to.size - orgBound);
  }

  private intern(s: string): string {
    let v = this.strings.get(s);
    if (v === undefined) {
      // Bounded by the projects and models there are; cleared if something floods it.
      if (this.strings.size >= 100_000) this.strings.clear();
      this.strings.set(s, s);
      v = s;
    }
    return v;
  }

  /** A response ended with `tokens` of context (input and output): a chain from it re-reads them. */
  noteContext(id: string, tokens: number): void {
    const o = this.byId.get(id);
    if (o && Number.isSafeInteger(tokens) && tokens > 0) o.contextTokens = tokens;
  }

  /** The upstream deleted `id` (through this node): its record goes, and is not taken back from the sync. */
  forget(id: string): void {
    this.remove(id);
    this.deleted.add(id);
    if (this.deleted.size > MAX_DELETED) this.deleted.delete(this.deleted.values().next().value as string);
  }

  remove(id: string): void {
    const o = this.byId.get(id);
    if (!o) return;
    this.byId.delete(id);
    o.gone = true;
    const ids = this.byProject.get(o.projectId);
    ids?.left();
    const key = this.orgKeyOf(o.projectId);
    const org = this.byOrg.get(key);
    if (org) org.size--;
    if (ids && ids.size === 0) {
      this.byProject.delete(o.projectId);
      org?.projects.delete(o.projectId);
      if (org && org.projects.size === 0) this.byOrg.delete(key);
    }
  }

  /** The owner of an id still within its retention, or undefined (unknown, expired). */
  get(id: string, nowMs: number): ResponseOwner | undefined {
    const o = this.byId.get(id);
    if (!o) return undefined;
    if (nowMs - o.createdAtMs >= this.retentionMs) {
      this.remove(id);
      return undefined;
    }
    return o;
  }

  /** Projects holding records here now. */
  get projects(): number {
    return this.byProject.size;
  }

  /** Records a project holds now. */
  countOf(projectId: string): number {
    return this.byProject.get(projectId)?.size ?? 0;
  }

  /** Replaces every record (a sync snapshot), keeping those made here since (not yet in it). */
  replaceAll(entries: Iterable<[string, ResponseOwner]>, keepCreatedAfterMs: number): void {
    const recent: Array<[string, ResponseOwner]> = [];
    for (const [id, o] of this.byId) if (o.createdAtMs > keepCreatedAfterMs) recent.push([id, o]);
    this.byId.clear();
    this.byProject.clear();
    this.byOrg.clear();
    for (const [id, o] of entries) this.add(id, o);
    for (const [id, o] of recent) if (!this.byId.has(id)) this.add(id, o);
  }
}
