// Parallel-request slots on the node's side of leases (docs/leases.md). With several nodes a node
// admits a request only into a slot of the key it holds. It asks for slots in chunks (while half a
// chunk is still free), keeps them while it uses them, gives idle ones back when the control plane
// reclaims them for a node that has none free, and gives back a key's slots once the key has been
// idle for a minute. A request that finds no free slot waits (bounded) while the node asks; it is
// refused only when every slot of the key is in use across the cluster. A lone node, or one cut off,
// counts the key's limit locally.
import { leaseChunk, standingShare } from '../../proto/lib/leases.js';
import type { SlotHeld, SlotLease, SlotWant } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyLimits } from '../limits/key-budgets.js';
import { finiteLimit, PENDING_STALE_MS, wake, type LeaseLink } from './lease-link.js';
import type { StandingShare, LeaseStandingShares } from './lease-standing-shares.js';

interface KeySlots {
  limit: number;
  /** Slots leased (meaningful once `leased`). */
  held: number;
  /** Requests of the key in flight on this node. */
  inUse: number;
  /** False while the node was alone (it counted the key's limit locally and held nothing leased). */
  leased: boolean;
  pending: boolean;
  askedAtMs: number;
  /** The least the pending want asked for (0: a prefetch). */
  askedNeed: number;
  /**
   * When the control plane last said every slot is in use (performance.now(); 0: it did not). It
   * refuses the requests that were waiting then; a request that starts later asks again.
   */
  finalAtMs: number;
  /** When an answer last brought no slot (performance.now()): prefetching waits a while (every slot is leased). */
  dryAtMs: number;
  idleSinceMs: number;
  waiters: Array<() => void>;
  /** A slot want went unanswered past the wait bound; until the next answer slots are taken (advanceSlot). */
  advancing: boolean;
  /** Reclaimed while the standing share (SlotShare) was on its way: the share is not added to it. */
  noShare: boolean;
}

/** A key idle this long gives its slots back. */
const SLOTS_IDLE_MS = 60_000;
/** After an answer without a slot, no prefetch for this long (a request with no free slot still asks). */
const SLOTS_DRY_MS = 1000;

/** The parallel slots this node holds, by key (LeaseClient delegates to it). */
export class LeaseSlots {
  private readonly slots = new Map<string, KeySlots>();
  /** What the latest Hello said is in use, per key (corrected by sayHeld once the stream is accepted). */
  private readonly saidInHello = new Map<string, number>();

  constructor(
    private readonly link: LeaseLink,
    private readonly shares: LeaseStandingShares,
  ) {}

  /**
   * The most requests of the key this node may have in flight (undefined: the key's own limit
   * applies). `final`: the control plane said every slot is in use after the request started at
   * `startedAt` (performance.now()); a request that started later asks again.
   */
  slotsFor(keyId: string, limits: KeyLimits, startedAt = performance.now()): { slots: number; final: boolean } | undefined {
    if (!this.link.connected || this.link.nodes <= 1 || !Number.isFinite(limits.maxParallel) || limits.maxParallel <= 0) return undefined;
    const sl = this.slotsOf(keyId, limits.maxParallel);
    if (!sl.leased) {
      sl.leased = true;
      sl.held = sl.inUse;
    }
    return { slots: sl.held, final: sl.finalAtMs >= startedAt };
  }

  /** Told the key's requests in flight on this node after every admission and every end. */
  noteInFlight(keyId: string, inFlight: number, maxParallel: number): void {
    let sl = this.slots.get(keyId);
    if (!sl) {
      if (inFlight === 0) return;
      sl = this.slotsOf(keyId, maxParallel);
    }
    const freed = inFlight < sl.inUse;
    sl.inUse = inFlight;
    if (inFlight === 0) sl.idleSinceMs = performance.now();
    if (freed) {
      sl.finalAtMs = 0;
      wake(sl);
    }
    // (A slot freed here lets the requests waiting here in at once.)
    if (sl.leased && this.link.connected && this.link.nodes > 1 && !sl.pending) {
      const chunk = leaseChunk(sl.limit, this.link.nodes);
      if (sl.held < sl.limit && sl.held - sl.inUse <= chunk / 2 && performance.now() - sl.dryAtMs >= SLOTS_DRY_MS) this.askSlots(keyId, sl, 0);
    }
  }

  /** A request found no free slot here: asks for one and calls `wake` once the answer came. */
  waitForSlot(keyId: string, limits: KeyLimits, wake: () => void, startedAt = performance.now()): boolean {
    if (!this.link.connected || this.link.nodes <= 1) return false;
    const sl = this.slotsOf(keyId, limits.maxParallel);
    if (sl.finalAtMs >= startedAt || sl.advancing) return false;
    sl.waiters.push(wake);
    // Enough for every request waiting here (a total), asked again when more wait than the pending want covers.
    const need = sl.inUse + sl.waiters.length;
    if (!sl.pending || need > sl.askedNeed || performance.now() - sl.askedAtMs >= PENDING_STALE_MS) this.askSlots(keyId, sl, need);
    return true;
  }

  /**
   * Slots in advance of a late answer (as advanceKey): after a request waited the whole bound for a
   * slot and no answer came, the node takes one slot for each request of the key that finds none
   * free, until the answer comes, within the key's own limit (KeyBudgets checks it), and tells the
   * control plane, which counts them as held here (a negative `returned`, SlotLedger.applyHeld).
   */
  advanceSlot(keyId: string, limits: KeyLimits, timedOut: boolean, startedAt = performance.now()): boolean {
    if (!this.link.connected || this.link.leaving || this.link.nodes <= 1) return false;
    const sl = this.slotsOf(keyId, limits.maxParallel);
    if (sl.finalAtMs >= startedAt || !sl.leased || (!timedOut && !sl.advancing)) return false;
    sl.advancing = true;
    const took = Math.max(0, sl.inUse + 1 - sl.held);
    sl.held += took;
    this.link.slotReturns.push({ keyId, held: sl.held, returned: -took });
    this.link.queueFlush();
    return true;
  }

  cancelSlotWait(keyId: string, wake: () => void): void {
    const sl = this.slots.get(keyId);
    if (sl) sl.waiters = sl.waiters.filter((w) => w !== wake);
  }

  applySlotGrant(g: SlotLease): void {
    const sl = this.slots.get(g.keyId);
    if (this.link.leaving || !sl || !sl.leased) {
      // Not wanted any more (or the node is stopping): straight back.
      if (g.slots > 0) this.link.slotReturns.push({ keyId: g.keyId, held: sl?.leased ? sl.held : 0, returned: g.slots });
      if (g.slots > 0) this.link.queueFlush();
      return;
    }
    sl.pending = false;
    sl.advancing = false;
    sl.askedNeed = 0;
    sl.held += g.slots;
    if (g.final) sl.finalAtMs = performance.now();
    sl.dryAtMs = g.slots > 0 ? -Infinity : performance.now();
    wake(sl);
  }

  /** For tests: what the node holds and uses of a key's slots. */
  slotState(keyId: string): { held: number; inUse: number; leased: boolean } | undefined {
    const sl = this.slots.get(keyId);
    return sl && { held: sl.held, inUse: sl.inUse, leased: sl.leased };
  }

  private slotsOf(keyId: string, maxParallel: number): KeySlots {
    let sl = this.slots.get(keyId);
    if (!sl) {
      sl = { limit: finiteLimit(maxParallel), held: 0, inUse: 0, leased: false, pending: false, askedAtMs: 0, askedNeed: 0, finalAtMs: 0, dryAtMs: -Infinity, idleSinceMs: performance.now(), waiters: [], advancing: false, noShare: false };
      const share = this.shares.slotShare;
      if (this.shares.slotsForfeited.delete(keyId)) {
        // Its share was given back before it was used: none until the key is forgotten (prune).
        sl.leased = true;
        sl.noShare = true;
      } else if (share && this.link.connected && this.link.nodes > 1) {
        sl.leased = true;
        sl.held = share.exceptions.get(keyId)?.requests ?? standingShare(sl.limit, share.nodes);
      }
      this.slots.set(keyId, sl);
    }
    return sl;
  }

  /** `need`: the total the node must hold for its waiting requests (0: a prefetch). Wants are totals. */
  private askSlots(keyId: string, sl: KeySlots, need: number): void {
    if (this.link.leaving) return;
    const want = Math.min(sl.limit, Math.max(need, sl.held + leaseChunk(sl.limit, this.link.nodes)));
    if (want <= sl.held && need <= sl.held) return;
    sl.pending = true;
    sl.askedAtMs = performance.now();
    sl.askedNeed = need;
    this.link.slotWants.set(keyId, { keyId, held: sl.held, want, need });
    this.link.queueFlush();
  }

  /** Keys idle for a minute give their slots back and are forgotten. */
  prune(): void {
    const now = performance.now();
    for (const [keyId, sl] of this.slots) {
      if (sl.inUse > 0 || sl.waiters.length > 0 || now - sl.idleSinceMs < SLOTS_IDLE_MS) continue;
      // held -1: forgotten; with a standing share its next use starts from the share again.
      if (sl.leased && (sl.held > 0 || this.shares.slotShare) && this.link.connected) this.link.slotReturns.push({ keyId, held: -1, returned: sl.held });
      this.slots.delete(keyId);
    }
    if (this.link.slotReturns.length > 0) this.link.queueFlush();
  }

  /** The answer to the slot-share want: every key's slot records get their standing share. */
  addShare(share: StandingShare): void {
    for (const [keyId, sl] of this.slots) {
      if (sl.noShare) continue;
      const add = share.exceptions.get(keyId)?.requests ?? standingShare(sl.limit, share.nodes);
      if (!sl.leased) {
        sl.leased = true;
        sl.held = sl.inUse;
      }
      sl.held += add;
      if (add > 0) wake(sl);
    }
  }

  /** A reclaim: idle slots of the named keys (every key: `allKeys`) go back. */
  reclaim(allKeys: boolean, slotKeyIds: string[]): void {
    const slotKeys = allKeys ? [...this.slots.keys()] : slotKeyIds;
    for (const keyId of slotKeys) {
      const sl = this.slots.get(keyId);
      // The standing share of slots of a key not touched here is given back (as for key minutes).
      if (this.shares.slotShare && !sl) this.shares.slotsForfeited.add(keyId);
      // What it gives back, not only what it keeps: a grant on its way here stays counted.
      const returned = sl?.leased ? Math.max(0, sl.held - sl.inUse) : 0;
      if (sl) {
        sl.leased = true;
        sl.held = sl.inUse;
      }
      this.link.slotReturns.push({ keyId, held: sl ? sl.held : 0, returned });
    }
  }

  /** The node stops: every idle slot goes back. */
  giveBack(): void {
    for (const [keyId, sl] of this.slots) {
      if (sl.leased && sl.held > sl.inUse) {
        const returned = sl.held - sl.inUse;
        sl.held = sl.inUse;
        this.link.slotReturns.push({ keyId, held: sl.held, returned });
      }
    }
  }

  /** A connection change: slots held on the old connection were freed with it; the node holds what it uses. */
  reset(): void {
    for (const sl of this.slots.values()) {
      sl.held = sl.inUse;
      sl.pending = false;
      sl.advancing = false;
      sl.noShare = false;
      sl.finalAtMs = 0;
      sl.dryAtMs = -Infinity;
    }
  }

  /** The slots in use here, as said in a Hello (LeaseClient.held): between connections a node holds what it uses. */
  inUse(): SlotHeld[] {
    const out: SlotHeld[] = [];
    this.saidInHello.clear();
    for (const [keyId, sl] of this.slots) {
      if (sl.inUse === 0) continue;
      out.push({ keyId, held: sl.inUse, returned: 0 });
      this.saidInHello.set(keyId, sl.inUse);
    }
    return out;
  }

  /**
   * On a new connection: the slots in use here are said at once (LeaseClient.sayHeld). What the
   * Hello said is corrected, not added to: requests that ended since give their slots back, and
   * those admitted since are taken (a negative `returned`), so the control plane counts exactly
   * what is in use (SlotLedger.applyHeld keeps the larger of what it counted less what was given
   * back, and what the node holds).
   */
  sayHeld(): void {
    for (const [keyId, sl] of this.slots) {
      const said = this.saidInHello.get(keyId) ?? 0;
      if (sl.inUse === 0 && said === 0) continue;
      sl.leased = true;
      this.link.slotReturns.push({ keyId, held: sl.held, returned: this.saidInHello.has(keyId) ? said - sl.held : 0 });
    }
    this.saidInHello.clear();
  }

  wakeAll(): void {
    for (const sl of this.slots.values()) wake(sl);
  }

  /** Wants that could not be sent: not pending any more. */
  unsent(wants: SlotWant[]): void {
    for (const w of wants) {
      const sl = this.slots.get(w.keyId);
      if (sl) {
        sl.pending = false;
        wake(sl);
      }
    }
  }
}
