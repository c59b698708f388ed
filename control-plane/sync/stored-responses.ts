// Stored responses of the Responses API, from the nodes that create them to the nodes that need them:
// written in the transaction of the report that carried them, then sent to every connected node (a
// node placing records by project: to those serving the project); a node that connects is first sent
// the retained records after the last one it holds (Hello.stored_responses_seq), page by page, then
// each new one, and a project's retained records when it starts serving it (OwnerInterest). Records older than the upstream's retention (30 days) are deleted,
// and each project's past its bound (docs/design.md#owner-records), hourly.
// Apart from the key version: responses are many and short-lived, and a node that misses one only
// answers 404 for it (docs/api.md#responses-api, the fan-out window).
import type { StoredResponse } from '../../proto/gen/tollgate/v1/sync.js';
import type { Db, Tx } from '../store/db.js';
import { addStoredResponses, deleteStoredResponsesBefore, deleteStoredResponsesOverBound, storedResponsesAfter, storedResponsesOfProject } from '../store/stored-responses-repo.js';

/** OpenAI keeps stored responses 30 days; so does the gateway's record of who owns one. */
export const STORED_RESPONSE_RETENTION_MS = 30 * 24 * 60 * 60 * 1000;
/** Records per message of a node's catch-up. */
const PAGE = 5000;
const PRUNE_EVERY_MS = 60 * 60 * 1000;
const MAX_ID_CHARS = 128;

type Listener = (records: StoredResponse[]) => void;

/** A node's records by project (attachByProject). */
export interface ProjectSubscription {
  detach(): void;
  /** The node now serves these projects. */
  want(projectIds: readonly string[]): void;
}

export class StoredResponsesFanout {
  private readonly listeners = new Set<Listener>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly db: Db,
    private readonly now: () => number,
    private readonly log: (line: string) => void,
    /** Records kept per project (the config's responses.owner_records_per_project); 0: no bound. */
    private readonly perProject: () => number = () => 0,
  ) {}

  /** Writes a report's records in its transaction; they go to the nodes once it commits. */
  async write(tx: Tx, records: readonly StoredResponse[]): Promise<void> {
    // A record already past retention (a node replaying an old journal) is not kept.
    const oldest = this.now() - STORED_RESPONSE_RETENTION_MS;
    const clean = records.filter(
      (r) =>
        r.createdAtMs >= oldest && r.responseId.length > 0 && r.responseId.length <= MAX_ID_CHARS && r.deployment.length <= MAX_ID_CHARS && r.projectId.length > 0 && r.model.length > 0 && Number.isSafeInteger(r.createdAtMs) && r.createdAtMs > 0,
    );
    if (clean.length === 0) return;
    const added = await addStoredResponses(tx, clean);
    if (added.length > 0) tx.afterCommit(() => this.publish(added));
  }

  private publish(records: StoredResponse[]): void {
    for (const l of [...this.listeners]) {
      try {
        l(records);
      } catch (err) {
        this.log(`sync: stored responses not sent to a node: ${(err as Error).message}`);
      }
    }
  }

  /**
   * A node connected holding the records up to `afterSeq`: it is sent the retained ones after it,
   * then every new one, in ascending seq. Returns the detach.
   */
  attach(send: (records: StoredResponse[]) => void, afterSeq: number): () => void {
    return this.follow(send, afterSeq, null);
  }

  /**
   * A node that holds the records of the projects it serves only (docs/design.md#owner-records): as
   * `attach`, but only `projects`' records; `want` adds projects, each sent its retained records,
   * then named in `caughtUp` (every record of it committed before was sent by then).
   */
  attachByProject(send: (records: StoredResponse[], caughtUp: string[]) => void, afterSeq: number, projects: readonly string[]): ProjectSubscription {
    const wanted = new Set<string>();
    for (const p of projects) if (p.length > 0 && p.length <= MAX_ID_CHARS) wanted.add(p);
    let closed = false;
    const detach = this.follow((records) => send(records, []), afterSeq, (r) => wanted.has(r.projectId));
    const catchUp = async (projectId: string): Promise<void> => {
      let last = 0;
      for (;;) {
        const page = await storedResponsesOfProject(this.db, projectId, last, this.now() - STORED_RESPONSE_RETENTION_MS, PAGE);
        if (closed) return;
        if (page.length > 0) last = page[page.length - 1].seq;
        if (page.length < PAGE) return send(page, [projectId]);
        send(page, []);
      }
    };
    return {
      detach() {
        closed = true;
        detach();
      },
      want: (projectIds) => {
        for (const p of projectIds) {
          if (p.length === 0 || p.length > MAX_ID_CHARS || wanted.has(p)) continue;
          // Wanted before the read: a record committed from now on is sent live, one before is read.
          wanted.add(p);
          catchUp(p).catch((err: Error) => this.log(`sync: stored responses of a project not sent to a node: ${err.message}`));
        }
      },
    };
  }

  /** `attach`, for the records `keep` passes (null: all). */
  private follow(send: (records: StoredResponse[]) => void, afterSeq: number, keep: ((r: StoredResponse) => boolean) | null): () => void {
    let closed = false;
    // New records wait until the catch-up is sent, so the node sees them in order.
    let waiting: StoredResponse[] | null = [];
    const pass = (records: StoredResponse[]) => (keep ? records.filter(keep) : records);
    const listener: Listener = (records) => {
      if (closed) return;
      const mine = pass(records);
      if (mine.length === 0) return;
      if (waiting) waiting.push(...mine);
      else send(mine);
    };
    this.listeners.add(listener);
    const catchUp = async (): Promise<void> => {
      let last = afterSeq;
      // A node holding more than this database ever numbered (a new database): it gets everything.
      const max = (await this.db.get<{ m: number | null }>('SELECT MAX(seq) AS m FROM stored_responses'))?.m ?? 0;
      if (last > max) last = 0;
      for (;;) {
        const page = await storedResponsesAfter(this.db, last, this.now() - STORED_RESPONSE_RETENTION_MS, PAGE);
        if (closed) return;
        if (page.length > 0) {
          last = page[page.length - 1].seq;
          const mine = pass(page);
          if (mine.length > 0) send(mine);
        }
        if (page.length < PAGE) break;
      }
      const rest = (waiting ?? []).filter((r) => r.seq > last);
      waiting = null;
      if (rest.length > 0) send(rest);
    };
    catchUp().catch((err: Error) => {
      this.log(`sync: stored responses catch-up failed: ${err.message}`);
      const rest = waiting ?? [];
      waiting = null;
      if (!closed && rest.length > 0) send(rest);
    });
    return () => {
      closed = true;
      this.listeners.delete(listener);
    };
  }

  /** Deletes the records past retention now and every hour. */
  start(): void {
    const prune = () => {
      this.prune().catch((err: Error) => this.log(`stored responses: retention not applied: ${err.message}`));
    };
    prune();
    this.timer = setInterval(prune, PRUNE_EVERY_MS);
    this.timer.unref();
  }

  /** Deletes the records past retention, and each project's past its bound (its oldest). */
  async prune(): Promise<void> {
    await deleteStoredResponsesBefore(this.db, this.now() - STORED_RESPONSE_RETENTION_MS);
    const bound = this.perProject();
    if (bound > 0) await deleteStoredResponsesOverBound(this.db, bound);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}
