// What a key has open on this node (HTTP requests in flight, SSE streams, tool downloads, WebSockets),
// so revoking the key or blocking its organisation ends them. The sync client calls closeKey /
// closeOrg / closeWhere right after applying the change and before acknowledging it, so a control
// plane that counts a node's ack knows nothing of the key still runs there.
// Generic: anything that can be ended registers a closer. Pure bookkeeping (key-registry.ts), no I/O.
//
//   const unregister = openStreams.register(key.keyHash, key.orgId, (reason) => ws.end(4001, reason));
//   ... and when it ends by itself: unregister();
import { KeyRegistry } from './key-registry.js';

export type StreamEndReason = 'key_revoked' | 'org_blocked';

/** Ends one open thing. Called at most once, synchronously, from the sync client; must not throw. */
export type StreamCloser = (reason: StreamEndReason) => void;

interface Entry {
  keyHash: string;
  orgId: string;
  close: StreamCloser;
}

export class OpenStreams {
  private readonly open = new KeyRegistry<Entry>();

  /** Registers an open stream of a key; returns its unregister function (idempotent). */
  register(keyHash: string, orgId: string, close: StreamCloser): () => void {
    const e: Entry = { keyHash, orgId, close };
    this.open.add(e);
    return () => void this.open.remove(e);
  }

  /** Ends everything open of one key; returns how many were ended. */
  closeKey(keyHash: string, reason: StreamEndReason = 'key_revoked'): number {
    return this.closeAll(this.open.ofKey(keyHash), reason);
  }

  /** Ends everything open of every key of an organisation. */
  closeOrg(orgId: string, reason: StreamEndReason = 'org_blocked'): number {
    return this.closeAll(this.open.ofOrg(orgId), reason);
  }

  /** Ends what `reasonFor(keyHash, orgId)` gives a reason for (after a snapshot replaced the key table). */
  closeWhere(reasonFor: (keyHash: string, orgId: string) => StreamEndReason | null): number {
    let n = 0;
    for (const [keyHash, entries] of this.open.byKeyHash()) {
      const reason = reasonFor(keyHash, entries[0].orgId);
      if (reason) n += this.closeAll(entries, reason);
    }
    return n;
  }

  /** How many are open (all keys, or one key). */
  count(keyHash?: string): number {
    return keyHash === undefined ? this.open.size : this.open.countOf(keyHash);
  }

  private closeAll(entries: Entry[], reason: StreamEndReason): number {
    let n = 0;
    for (const e of entries) {
      // Each closer runs once: an entry another closer already ended is skipped.
      if (!this.open.remove(e)) continue;
      n++;
      try {
        e.close(reason);
      } catch (err) {
        console.error(`data plane bug: closing an open stream threw: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    return n;
  }
}
