// Standing shares on the node's side of leases (docs/leases.md, "Standing shares"). With several nodes
// the node asks, once per minute and connection, for a share of every key's minute budget, of every
// key's parallel slots and of every organisation's money, so that a key's first requests on this
// node do not wait for a lease. This part keeps what was asked and granted; the key minutes
// (lease-key-minutes.ts) and the slots (lease-slots.ts) add the shares to their records; a key
// minute's share is added here (addBulkShare).
import { minuteOf } from '../limits/clock.js';
import type { BulkShare, KeyShare, SlotShare } from '../../proto/gen/tollgate/v1/sync.js';
import { standingShare } from '../../proto/lib/leases.js';
import { wake, type LeaseLink } from './lease-link.js';
import type { KeyMinute } from './key-minute.js';

/** A standing share: of each key's budget its share among `nodes`, unless an exception says what. */
export interface StandingShare {
  nodes: number;
  exceptions: Map<string, KeyShare>;
}

export class LeaseStandingShares {
  /** Standing shares of every key's budget, by minute, on this connection (BulkShare). */
  readonly bulk = new Map<number, StandingShare>();
  /** Minutes whose standing shares were asked for (answered or not) on this connection. */
  readonly bulkAsked = new Set<number>();
  /** Minutes whose standing shares the control plane did not grant. */
  readonly bulkDenied = new Set<number>();
  /** `keyId:minute` whose standing share this node gave back (a reclaim) before or after it came. */
  readonly forfeited = new Set<string>();
  /** The standing share of every key's parallel slots on this connection (SlotShare). */
  slotShare: StandingShare | null = null;
  private slotShareAsked = false;
  /** Money slices of every organisation asked for on this connection (applyOrgSlices). */
  private orgSlicesAsked = false;
  /** Keys whose slot share was given back (a reclaim) before this node had a record of them. */
  readonly slotsForfeited = new Set<string>();

  constructor(private readonly link: LeaseLink) {}

  /** A connection change: shares belong to one connection. */
  reset(): void {
    this.bulk.clear();
    this.bulkAsked.clear();
    this.bulkDenied.clear();
    this.forfeited.clear();
    this.slotShare = null;
    this.slotShareAsked = false;
    this.orgSlicesAsked = false;
    this.slotsForfeited.clear();
  }

  askBulk(minute: number): void {
    if (!this.link.standingShares || !this.link.connected || this.link.leaving || this.link.nodes <= 1 || minute >= this.link.loneFromMinute || this.bulkAsked.has(minute)) return;
    // Only the current minute and the next: a clock set far back or ahead asks again when it is.
    if (Math.abs(minute - minuteOf(this.link.clock.now())) > 1) return;
    this.bulkAsked.add(minute);
    this.link.bulkWants.push(minute);
    this.link.queueFlush();
  }

  askOrgSlices(): void {
    if (!this.link.standingShares || !this.link.connected || this.link.leaving || this.orgSlicesAsked) return;
    this.orgSlicesAsked = true;
    this.link.orgSlicesWant = true;
    this.link.queueFlush();
  }

  askSlotShare(): void {
    if (!this.link.standingShares || !this.link.connected || this.link.leaving || this.link.nodes <= 1 || this.slotShareAsked) return;
    this.slotShareAsked = true;
    this.link.slotShareWant = true;
    this.link.queueFlush();
  }

  /** Adds the standing share (or what the exception says) to a key minute, once. */
  addBulkShare(keyId: string, k: KeyMinute, b: StandingShare): void {
    const wasAwaiting = k.awaitingBulk;
    k.awaitingBulk = false;
    if (k.bulkApplied) return;
    k.bulkApplied = true;
    if (this.forfeited.has(`${keyId}:${k.minute}`)) return;
    const ex = b.exceptions.get(keyId);
    const requests = ex ? ex.requests : standingShare(k.rpm, b.nodes);
    const tokens = ex ? ex.tokens : standingShare(k.tpm, b.nodes);
    if (Number.isFinite(k.allowRequests)) k.allowRequests += requests;
    if (Number.isFinite(k.allowTokens)) k.allowTokens += tokens;
    // What the pool has free is unknown until an answer says: a top-up may still be asked for.
    if (!k.pending && k.freeRequests === k.rpm) {
      k.freeRequests = 0;
      k.freeTokens = 0;
      k.freeUnknown = true;
    }
    k.advancing = false;
    if (wasAwaiting) wake(k);
  }

  /** Keeps the answer to a bulk want. False: nothing to apply (stopping, disconnected, or a late refusal after a grant). */
  recordBulk(b: BulkShare): boolean {
    if (this.link.leaving || !this.link.connected) return false;
    if (!b.granted) {
      if (this.bulk.has(b.minute)) return false;
      this.bulkDenied.add(b.minute);
    } else this.bulk.set(b.minute, { nodes: b.nodes, exceptions: new Map(b.exceptions.map((e) => [e.keyId, e])) });
    return true;
  }

  /** Keeps the answer to the slot-share want: the share to add to every key's slots (null: none). */
  recordSlotShare(sh: SlotShare): StandingShare | null {
    if (this.link.leaving || !this.link.connected || !sh.granted || this.slotShare) return null;
    const share = { nodes: sh.nodes, exceptions: new Map(sh.exceptions.map((e) => [e.keyId, e])) };
    this.slotShare = share;
    return share;
  }

  /** For tests and benchmarks: the minutes whose standing shares this node holds, and whether it holds slot shares. */
  standingState(): { minutes: number[]; slots: boolean } {
    return { minutes: [...this.bulk.keys()].sort((a, b) => a - b), slots: this.slotShare !== null };
  }
}
