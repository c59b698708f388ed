// Everything a key has open on this node, and the one policy that ends it (docs/design.md#ending-what-a-key-has-open).
//
// What registers: every HTTP request of a known key from its credential check until its answer ends
// (so SSE streams, tool downloads and tool event streams too; request/open-request.ts), and every
// realtime or Responses-API WebSocket session while its socket is open (realtime/session.ts).
//
// When it is enforced: the sync client calls `enforce` after applying each snapshot or delta and
// before acknowledging it, so a control plane that counts a node's ack knows nothing of a revoked key
// still runs there; once a second while the node is past its maximum staleness
// (`enforce(state, true)`, wired in data-plane/main.ts); and when the earliest expiry among the keys
// of what is open comes, on the node's clock, by one alarm (limits/clock.ts `Alarm`, wired in main.ts)
// that the registry sets: earlier on `add`, to what is left after each enforcement. A removal leaves it
// set: it may ring for nothing once, and is then set to what is left.
//
// The policy (`endReasonFor`), the same for every entry, first reason wins:
//   node_stale         the node is past --max-staleness: it can no longer vouch for any key;
//   key_revoked        the key no longer authenticates (revoked, deleted, a snapshot without it);
//   key_expired        the key's `expires_at` passed on the node's clock (even cut off from the
//                      control plane, which revokes it later);
//   org_blocked        its organisation is blocked (balance exhausted, monthly cap reached);
//   model_not_allowed  the key may no longer use the model the entry was opened for (an HTTP request
//                      names its model once its body was read; until then it names none).
// Each reason has one error and one text (errors.ts `endError`).
//
// How an entry ends is the one place HTTP and WebSockets differ, as their protocols do: an HTTP
// request not yet answered gets that error (401) in its path's shape; a model event stream (SSE) ends
// with one terminal error event; any other stream is closed; a WebSocket is closed with 1008 and the
// same text as its close reason (`insufficient_quota: …`, errors.ts `closeReasonOf`). Every way
// runs the abort path, so what was served is billed.
//
// Pure bookkeeping in one SlotSet (slot-set.ts: an entry is added and removed per request, so no
// hash table): no I/O of its own; each entry ends itself.
import { endError, type EndReason, type GatewayError } from '../errors.js';
import { SlotSet, type Slotted } from '../slot-set.js';
import type { GatewayState, KeyRecord } from './key-table.js';

export type { EndReason };

/** Something open of one key that the registry can end; its `slot` is the registry's (start it at -1). */
export interface OpenEntry extends Slotted {
  readonly keyHash: string;
  readonly orgId: string;
  /** The model it was opened for; '' while it names none. */
  readonly modelId: string;
  /** Its key's expiry (ms; 0: none) when the entry has it at hand; absent: the registry asks `expiryOf`. */
  readonly expiresAtMs?: number;
  /** Ends it now with `err` (the reason's one error). Called at most once, synchronously; must not throw. */
  end(why: EndReason, err: GatewayError): void;
}

/** The one policy: why `entry` may no longer stay open in `state` at `nowMs` (the node's clock), or null. */
export function endReasonFor(state: GatewayState, entry: OpenEntry, stale: boolean, nowMs: number): EndReason | null {
  return reasonOf(state, state.keysByHash.get(entry.keyHash), entry, stale, nowMs);
}

function reasonOf(state: GatewayState, key: KeyRecord | undefined, entry: OpenEntry, stale: boolean, nowMs: number): EndReason | null {
  if (stale) return 'node_stale';
  if (!key) return 'key_revoked';
  if (key.expiresAtMs && nowMs >= key.expiresAtMs) return 'key_expired';
  if (key.org.blocked) return 'org_blocked';
  const model = entry.modelId;
  if (model !== '' && !state.mayUseModel(key, model)) return 'model_not_allowed';
  return null;
}

/** Rings `enforce` at a time on the node's clock (limits/clock.ts `Alarm`). */
export interface ExpiryAlarm {
  /** When it rings next (Infinity: never). */
  readonly deadline: number;
  set(ms: number): void;
}

export interface OpenStreamsOptions {
  /** The node's clock (ms since the epoch); the wall clock by default. */
  now?: () => number;
  /** The expiry (ms; 0: none) of a key by hash, for entries that do not carry it. */
  expiryOf?: (keyHash: string) => number;
  /** Set to the earliest expiry among the keys of what is open; its ring calls `enforce`. */
  alarm?: ExpiryAlarm;
}

export class OpenStreams {
  private readonly open = new SlotSet<OpenEntry>();
  private readonly now: () => number;

  constructor(private readonly opts: OpenStreamsOptions = {}) {
    this.now = opts.now ?? Date.now;
  }

  /** Registers an open entry (again: nothing); an expiry earlier than the alarm's sets it. */
  add(entry: OpenEntry): void {
    this.open.add(entry);
    const alarm = this.opts.alarm;
    if (!alarm) return;
    const expires = entry.expiresAtMs ?? this.opts.expiryOf?.(entry.keyHash) ?? 0;
    if (expires > 0 && expires < alarm.deadline) alarm.set(expires);
  }

  /** Unregisters it (it ended by itself); false when it was not there. */
  remove(entry: OpenEntry): boolean {
    return this.open.delete(entry);
  }

  /**
   * Ends every entry the policy names in `state` at the node's clock (`stale`: the node is past its
   * maximum staleness), and sets the alarm to the earliest expiry among the keys of what stays open.
   * O(entries open); nothing when none are. Returns how many were ended.
   */
  enforce(state: GatewayState, stale = false): number {
    if (this.open.size === 0) {
      this.opts.alarm?.set(Infinity);
      return 0;
    }
    const now = this.now();
    const doomed: Array<[OpenEntry, EndReason]> = [];
    let next = Infinity;
    for (const e of this.open.values()) {
      const key = state.keysByHash.get(e.keyHash);
      const why = reasonOf(state, key, e, stale, now);
      if (why) doomed.push([e, why]);
      else if (key?.expiresAtMs && key.expiresAtMs < next) next = key.expiresAtMs;
    }
    // Set before the ends: an entry added while they run lowers it again.
    this.opts.alarm?.set(next);
    // Ended after the walk: an entry's end may remove others.
    let n = 0;
    for (const [e, why] of doomed) if (this.endOne(e, why, state)) n++;
    return n;
  }

  /** How many are open (all keys; or one key, counted by a walk over all). */
  count(keyHash?: string): number {
    if (keyHash === undefined) return this.open.size;
    let n = 0;
    for (const e of this.open.values()) if (e.keyHash === keyHash) n++;
    return n;
  }

  /** A copy of everything open. */
  list(): OpenEntry[] {
    return this.open.values();
  }

  private endOne(e: OpenEntry, why: EndReason, state: GatewayState): boolean {
    // Each entry ends once: one another entry's end already removed is skipped.
    if (!this.open.delete(e)) return false;
    try {
      const blockedReason = why === 'org_blocked' ? (state.keysByHash.get(e.keyHash)?.org.blockedReason ?? '') : '';
      e.end(why, endError(why, { blockedReason, modelId: e.modelId }));
    } catch (err) {
      console.error(`data plane bug: ending an open stream threw: ${err instanceof Error ? err.message : String(err)}`);
    }
    return true;
  }
}
