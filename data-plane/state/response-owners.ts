// Which project owns each upstream object of the Responses API (a stored response `resp_…`, a
// conversation `conv_…`, an item seen in an answer to the project), and with which model: the node's
// answer to "may this key name this id?", asked before any request naming it reaches the upstream
// (the upstream keeps every customer's objects under the operator's one account). Fed by what this
// node creates (at once) and by the control plane's sync for what other nodes created. Bounded per
// project (docs/design.md#owner-records): a project past its bound loses its own oldest records,
// never another project's. Placed: a node built `placed` holds the records of the projects it serves
// only, asking the control plane for a project's (`onNeed`) the first time a request of it misses
// one; until they arrived (`caughtUp`) a miss is not yet an answer. No I/O (timers for the waits).

/** OpenAI keeps stored responses 30 days; the gateway keeps its record of who owns one as long. */
export const RESPONSE_RETENTION_MS = 30 * 24 * 60 * 60 * 1000;
/**
 * Records held by one node at most, whatever the per-project bounds; past it the project holding the
 * most loses its oldest (their ids then answer 404). About 250 bytes of heap each (the id, the map
 * entry, the record and its place in its project's order; project and model strings are shared).
 */
export const MAX_RESPONSE_OWNERS = 1_000_000;
/** Records per project when the config names no bound (responses.owner_records_per_project). */
export const DEFAULT_OWNER_RECORDS_PER_PROJECT = 100_000;

export interface ResponseOwner {
  projectId: string;
  /** The project's organisation, when the one recording it knows it (a request's key does). */
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
  /** Holds only the projects it serves (else every project's, all sent to it). */
  placed?: boolean;
}

export class ResponseOwners {
  /** Asks the control plane for a project's records (set by the node's wiring; placed only). */
  onNeed: ((projectId: string) => void) | null = null;
  /** Projects whose retained records this node holds (placed), and those asked for. */
  private readonly loaded = new Set<string>();
  private readonly asked = new Map<string, Set<(loaded: boolean) => void>>();
  private readonly byId = new Map<string, ResponseOwner>();
  /** Ids deleted upstream through this node, newest last: a project's records sent again (a catch-up) do not bring them back. */
  private readonly deleted = new Set<string>();
  /** Each project's ids, in the order they were recorded (near enough creation order): its oldest first. */
  private readonly byProject = new Map<string, Set<string>>();
  /** One copy of each project id and model id (records from the sync decoder each bring their own). */
  private readonly strings = new Map<string, string>();

  private readonly maxEntries: number;
  private readonly retentionMs: number;
  private readonly perProject: () => number;
  /** Holds only the projects it serves (else every project's, all sent to it). */
  readonly placed: boolean;

  constructor(opts: ResponseOwnersOptions = {}) {
    this.maxEntries = opts.maxEntries ?? MAX_RESPONSE_OWNERS;
    this.retentionMs = opts.retentionMs ?? RESPONSE_RETENTION_MS;
    this.perProject = opts.perProject ?? (() => DEFAULT_OWNER_RECORDS_PER_PROJECT);
    this.placed = opts.placed ?? false;
  }

  /** Whether every retained record of the project is here (always, unplaced). */
  holdsAllOf(projectId: string): boolean {
    return !this.placed || this.loaded.has(projectId);
  }

  /**
   * A request of `projectId` missed an id: once its records are all here, `done(true)`; asked for
   * them (once) if not yet, and `done(false)` after `waitMs` if they did not come. At once when here.
   */
  whenHeld(projectId: string, waitMs: number, done: (loaded: boolean) => void): void {
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
   * be the first to go: the sync's echo of one this node already evicted).
   */
  add(id: string, owner: ResponseOwner): void {
    if (this.deleted.has(id)) return;
    const known = this.byId.get(id);
    if (known) {
      if (known.projectId === owner.projectId && owner.contextTokens !== undefined) known.contextTokens = owner.contextTokens;
      return;
    }
    const projectId = this.intern(owner.projectId);
    let ids = this.byProject.get(projectId);
    const bound = Math.max(1, this.perProject());
    if (ids && ids.size >= bound) {
      const oldest = this.byId.get(ids.values().next().value as string);
      if (oldest && owner.createdAtMs <= oldest.createdAtMs) return;
    }
    const record: ResponseOwner = { projectId, model: this.intern(owner.model), createdAtMs: owner.createdAtMs };
    if (owner.deployment) record.deployment = this.intern(owner.deployment);
    if (owner.contextTokens !== undefined) record.contextTokens = owner.contextTokens;
    this.byId.set(id, record);
    if (!ids) this.byProject.set(projectId, (ids = new Set()));
    ids.add(id);
    while (ids.size > bound) this.remove(ids.values().next().value as string);
    if (this.byId.size > this.maxEntries) this.evictFromLargest();
  }

  /** Past the node's cap: the project holding the most records gives up its oldest. */
  private evictFromLargest(): void {
    let largest: Set<string> | undefined;
    for (const ids of this.byProject.values()) if (!largest || ids.size > largest.size) largest = ids;
    // A hundredth of what it holds at once, so a flood scans the projects rarely.
    const n = Math.max(1, Math.min(this.byId.size - this.maxEntries + Math.floor((largest?.size ?? 0) / 100), largest?.size ?? 0));
    for (let i = 0; i < n && largest && largest.size > 0; i++) this.remove(largest.values().next().value as string);
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
    const ids = this.byProject.get(o.projectId);
    ids?.delete(id);
    if (ids && ids.size === 0) this.byProject.delete(o.projectId);
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
    for (const [id, o] of entries) this.add(id, o);
    for (const [id, o] of recent) if (!this.byId.has(id)) this.add(id, o);
  }
}
