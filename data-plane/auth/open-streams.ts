// What a key has open on this node (HTTP requests in flight, SSE streams, tool downloads, WebSockets),
// so revoking the key or blocking its organisation ends them. The sync client calls closeKey /
// closeOrg / closeWhere right after applying the change and before acknowledging it, so a control
// plane that counts a node's ack knows nothing of the key still runs there.
// Generic: anything that can be ended registers a closer. Pure bookkeeping, no I/O.
//
//   const unregister = openStreams.register(key.keyHash, key.orgId, (reason) => ws.end(4001, reason));
//   ... and when it ends by itself: unregister();

export type StreamEndReason = 'key_revoked' | 'org_blocked';

/** Ends one open thing. Called at most once, synchronously, from the sync client; must not throw. */
export type StreamCloser = (reason: StreamEndReason) => void;

interface Entry {
  keyHash: string;
  orgId: string;
  close: StreamCloser;
}

export class OpenStreams {
  private readonly byKey = new Map<string, Set<Entry>>();
  private readonly byOrg = new Map<string, Set<Entry>>();

  /** Registers an open stream of a key; returns its unregister function (idempotent). */
  register(keyHash: string, orgId: string, close: StreamCloser): () => void {
    const e: Entry = { keyHash, orgId, close };
    add(this.byKey, keyHash, e);
    add(this.byOrg, orgId, e);
    return () => this.remove(e);
  }

  /** Ends everything open of one key; returns how many were ended. */
  closeKey(keyHash: string, reason: StreamEndReason = 'key_revoked'): number {
    return this.closeAll(this.byKey.get(keyHash), reason);
  }

  /** Ends everything open of every key of an organisation. */
  closeOrg(orgId: string, reason: StreamEndReason = 'org_blocked'): number {
    return this.closeAll(this.byOrg.get(orgId), reason);
  }

  /** Ends what `reasonFor(keyHash, orgId)` gives a reason for (after a snapshot replaced the key table). */
  closeWhere(reasonFor: (keyHash: string, orgId: string) => StreamEndReason | null): number {
    let n = 0;
    for (const [keyHash, set] of [...this.byKey]) {
      const first = set.values().next().value as Entry | undefined;
      if (!first) continue;
      const reason = reasonFor(keyHash, first.orgId);
      if (reason) n += this.closeAll(set, reason);
    }
    return n;
  }

  /** How many are open (all keys, or one key). */
  count(keyHash?: string): number {
    if (keyHash !== undefined) return this.byKey.get(keyHash)?.size ?? 0;
    let n = 0;
    for (const s of this.byKey.values()) n += s.size;
    return n;
  }

  private closeAll(set: Set<Entry> | undefined, reason: StreamEndReason): number {
    if (!set || set.size === 0) return 0;
    const entries = [...set];
    for (const e of entries) {
      this.remove(e);
      try {
        e.close(reason);
      } catch (err) {
        console.error(`data plane bug: closing an open stream threw: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    return entries.length;
  }

  private remove(e: Entry): void {
    del(this.byKey, e.keyHash, e);
    del(this.byOrg, e.orgId, e);
  }
}

function add(m: Map<string, Set<Entry>>, k: string, e: Entry): void {
  let s = m.get(k);
  if (!s) m.set(k, (s = new Set()));
  s.add(e);
}

function del(m: Map<string, Set<Entry>>, k: string, e: Entry): void {
  const s = m.get(k);
  if (!s) return;
  s.delete(e);
  if (s.size === 0) m.delete(k);
}
