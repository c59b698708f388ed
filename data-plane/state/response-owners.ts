// Which project created each stored response (`resp_…`), and with which model: the node's answer to
// "may this key read this response?", asked before any stored-response request reaches the upstream
// (the upstream keeps every customer's responses under the operator's one account). Fed by the
// responses this node creates (at once) and by the control plane's sync (snapshot and deltas) for
// those other nodes created. Pure: no I/O.

/** OpenAI keeps stored responses 30 days; the gateway keeps its record of who owns one as long. */
export const RESPONSE_RETENTION_MS = 30 * 24 * 60 * 60 * 1000;
/**
 * Records held by one node at most; past it the oldest go first (their ids then answer 404). About
 * 200 bytes of heap each (measured: the id, the map entry and the record; project and model strings
 * are shared), so ~200 MB at the cap.
 */
export const MAX_RESPONSE_OWNERS = 1_000_000;

export interface ResponseOwner {
  projectId: string;
  /** The gateway's model id the response was created with. */
  model: string;
  createdAtMs: number;
  /**
   * The tokens a request continuing this response re-reads (its input and output as the upstream
   * reported them), when this node saw it end; kept on this node only.
   */
  contextTokens?: number;
}

export class ResponseOwners {
  /** Insertion order is creation order (near enough): the oldest are evicted first. */
  private readonly byId = new Map<string, ResponseOwner>();
  /** One copy of each project id and model id (records from the sync decoder each bring their own). */
  private readonly strings = new Map<string, string>();

  constructor(
    private readonly maxEntries = MAX_RESPONSE_OWNERS,
    private readonly retentionMs = RESPONSE_RETENTION_MS,
  ) {}

  get size(): number {
    return this.byId.size;
  }

  /** Records (or re-records) who owns a response. */
  add(id: string, owner: ResponseOwner): void {
    // The context a response ended with is this node's own knowledge: a record the sync brings again keeps it.
    const contextTokens = owner.contextTokens ?? this.byId.get(id)?.contextTokens;
    this.byId.delete(id);
    const record: ResponseOwner = { projectId: this.intern(owner.projectId), model: this.intern(owner.model), createdAtMs: owner.createdAtMs };
    if (contextTokens !== undefined) record.contextTokens = contextTokens;
    this.byId.set(id, record);
    while (this.byId.size > this.maxEntries) {
      const oldest = this.byId.keys().next().value as string;
      this.byId.delete(oldest);
    }
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

  remove(id: string): void {
    this.byId.delete(id);
  }

  /** The owner of a response still within its retention, or undefined (unknown, expired). */
  get(id: string, nowMs: number): ResponseOwner | undefined {
    const o = this.byId.get(id);
    if (!o) return undefined;
    if (nowMs - o.createdAtMs >= this.retentionMs) {
      this.byId.delete(id);
      return undefined;
    }
    return o;
  }

  /** Replaces every record (a sync snapshot), keeping those made here since (not yet in it). */
  replaceAll(entries: Iterable<[string, ResponseOwner]>, keepCreatedAfterMs: number): void {
    const recent: Array<[string, ResponseOwner]> = [];
    for (const [id, o] of this.byId) if (o.createdAtMs > keepCreatedAfterMs) recent.push([id, o]);
    this.byId.clear();
    for (const [id, o] of entries) this.add(id, o);
    for (const [id, o] of recent) if (!this.byId.has(id)) this.add(id, o);
  }
}
