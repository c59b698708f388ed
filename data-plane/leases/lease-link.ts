// What every part of the node's side of leases shares (docs/design.md#money-and-limits-across-nodes):
// the connection's state (connected, how many nodes, the epoch, leaving) and the next LeaseRequest
// being gathered. The parts (key minutes, standing shares, parallel slots, money) each own their
// records, add their wants and returns here, and one `flush` sends them together as one message.
// Pure: no I/O, no timers; `send` and `schedule` come from the sync client.
import type { KeyLeaseReturn, KeyLeaseWant, KeyMinuteUsed, LeaseRequest, OrgLeaseReturn, OrgLeaseWant, SlotHeld, SlotWant } from '../../proto/gen/tollgate/v1/sync.js';
import type { Clock } from '../limits/clock.js';

/** What the node sends: the generated LeaseRequest message. */
export type LeaseRequestOut = LeaseRequest;

/** A lease want unanswered this long is sent again. */
export const PENDING_STALE_MS = 2000;

export class LeaseLink {
  connected = false;
  nodes = 1;
  /**
   * The first minute this node holds whole key budgets unasked: the minute after the roster said it
   * is alone. In the minute it became alone other nodes may have used the key, so it leases as usual;
   * before any roster it does not know, so it leases too.
   */
  loneFromMinute = Infinity;
  /** Bumped on every connection change: slices and reservations belong to one connection. */
  epoch = 0;
  /** The node is stopping: it gave everything back and asks for nothing more. */
  leaving = false;
  private leavingSent = false;
  private flushQueued = false;

  // The next LeaseRequest, gathered from every part.
  wantKeys = new Map<string, KeyLeaseWant>();
  wantOrgs = new Map<string, OrgLeaseWant>();
  keyReturns: KeyLeaseReturn[] = [];
  orgReturns: OrgLeaseReturn[] = [];
  slotWants = new Map<string, SlotWant>();
  slotReturns: SlotHeld[] = [];
  /** Key minutes' allowance taken in advance of late answers, not yet told (advanceKey). */
  taken = new Map<string, KeyMinuteUsed>();
  bulkWants: number[] = [];
  slotShareWant = false;
  orgSlicesWant = false;

  constructor(
    readonly clock: Clock,
    /** Sends one LeaseRequest; returns false when there is no connection to send it on. */
    readonly send: (req: LeaseRequestOut) => boolean,
    /** Schedules a flush after the current request (setImmediate in production). */
    private readonly schedule: (fn: () => void) => void,
    /** Standing shares on (LeaseClient's constructor). */
    readonly standingShares: boolean,
    /** Told a request that could not be sent: nothing it wanted is pending any more. */
    private readonly unsent: (req: LeaseRequestOut) => void,
  ) {}

  /** A connection change: what was gathered for the old connection is dropped. */
  reset(): void {
    this.epoch++;
    this.wantKeys.clear();
    this.wantOrgs.clear();
    this.keyReturns = [];
    this.orgReturns = [];
    this.taken.clear();
    this.bulkWants = [];
    this.slotShareWant = false;
    this.orgSlicesWant = false;
    this.slotWants.clear();
    this.slotReturns = [];
    // Alone or not: the next roster says.
    this.loneFromMinute = Infinity;
  }

  /**
   * A want the control plane never answered (it could not, or the answer was lost) must not leave a
   * `pending` flag that blocks every later ask: after this long it is asked again.
   */
  stale(askedAtMs: number): boolean {
    return this.clock.now() - askedAtMs >= PENDING_STALE_MS;
  }

  queueFlush(): void {
    if (this.flushQueued) return;
    this.flushQueued = true;
    this.schedule(() => this.flush());
  }

  /** Sends everything wanted (and given back) as one LeaseRequest. */
  flush(extra?: Pick<LeaseRequestOut, 'reclaimId' | 'keyReturns' | 'orgReturns'>): void {
    if (!extra) this.flushQueued = false;
    const keyReturns = [...this.keyReturns, ...(extra?.keyReturns ?? [])];
    const orgReturns = [...this.orgReturns, ...(extra?.orgReturns ?? [])];
    const announceLeaving = this.leaving && !this.leavingSent;
    if (this.wantKeys.size === 0 && this.wantOrgs.size === 0 && this.slotWants.size === 0 && this.slotReturns.length === 0 && this.taken.size === 0 && this.bulkWants.length === 0 && !this.slotShareWant && !this.orgSlicesWant && keyReturns.length === 0 && orgReturns.length === 0 && !extra?.reclaimId && !announceLeaving) return;
    this.leavingSent = this.leaving;
    const req: LeaseRequestOut = {
      keys: [...this.wantKeys.values()],
      orgs: [...this.wantOrgs.values()],
      reclaimId: extra?.reclaimId ?? 0,
      keyReturns,
      orgReturns,
      leaseEpoch: this.epoch,
      leaving: this.leaving,
      used: [],
      usedSeq: 0,
      slotWants: [...this.slotWants.values()],
      slotReturns: this.slotReturns,
      // Before any return in the same request is applied? Order does not matter: both are amounts.
      taken: [...this.taken.values()],
      bulkMinute: this.bulkWants.shift() ?? 0,
      wantSlotShare: this.slotShareWant,
      wantOrgSlices: this.orgSlicesWant,
    };
    this.orgSlicesWant = false;
    this.taken = new Map();
    this.slotShareWant = false;
    // (One minute's shares per request: a second one goes in the next.)
    if (this.bulkWants.length > 0) this.queueFlush();
    this.slotWants = new Map();
    this.slotReturns = [];
    this.wantKeys = new Map();
    this.wantOrgs = new Map();
    this.keyReturns = [];
    this.orgReturns = [];
    // No connection: nothing is pending any more; the fallback applies until it is back.
    if (!this.send(req)) this.unsent(req);
  }
}

/** Calls, once, every request waiting on a record (a grant came, or the connection changed). */
export function wake(holder: { waiters: Array<() => void> }): void {
  const waiters = holder.waiters;
  if (waiters.length === 0) return;
  holder.waiters = [];
  for (const w of waiters) w();
}

export function finiteLimit(limit: number): number {
  return Number.isFinite(limit) && limit > 0 ? limit : Infinity;
}

export function finiteOrZero(n: number): number {
  return Number.isFinite(n) ? n : 0;
}
