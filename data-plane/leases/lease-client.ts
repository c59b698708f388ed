// The node's side of leases (docs/design.md#money-and-limits-across-nodes). Pure: no I/O, no timers; the
// sync client gives it a `send` function and feeds it grants, reclaims and connection changes.
//
// LeaseClient is what the rest of the node calls (admission, the sync client, the realtime session).
// It keeps the connection's changes, the roster and reclaims, and hands each protocol to the part
// that owns its records, all sharing one LeaseLink (lease-link.ts: the connection's state and the
// next LeaseRequest, which carries every part's wants and returns together):
// - key minutes, their prefetch, admission in advance of a late answer and used reports (lease-key-minutes.ts);
// - standing shares, asked in bulk so that a key's first requests do not wait (lease-standing-shares.ts);
// - parallel-request slots (lease-slots.ts);
// - organisations' money slices (lease-money.ts).
// A reclaim, a give-back when the node stops and a connection change go through every part in turn.
import type { BulkShare, KeyLease, KeyLeaseReturn, KeyPoolFree, LeaseReclaim, SlotHeld, SlotLease, SlotShare } from '../../proto/gen/tollgate/v1/sync.js';
import type { AllowanceSource, KeyLimits, MinuteAllowance } from '../limits/key-budgets.js';
import { minuteOf, type Clock } from '../limits/clock.js';
import { LeaseLink, wake, type LeaseRequestOut } from './lease-link.js';
import { LeaseKeyMinutes } from './lease-key-minutes.js';
import { LeaseStandingShares } from './lease-standing-shares.js';
import { LeaseSlots } from './lease-slots.js';
import { LeaseMoney, type RaiseVerdict, type SpendReservation, type SpendVerdict } from './lease-money.js';


/** How long after "reclaiming" a request out of time keeps waiting (the whole-budget reclaim takes up to 1 s). */
const RECLAIMING_WAIT_MS = 1200;

export class LeaseClient implements AllowanceSource {
  private readonly link: LeaseLink;
  private readonly keys: LeaseKeyMinutes;
  private readonly shares: LeaseStandingShares;
  private readonly slots: LeaseSlots;
  private readonly money: LeaseMoney;
  /** When (performance.now()) the control plane last said an answer waits for reclaims. */
  private reclaimingAtMs = -Infinity;
  /** The control plane waits for the nodes connected before its start (Roster.rejoining). */
  private rejoining = false;

  constructor(
    clock: Clock,
    /** Sends one LeaseRequest; returns false when there is no connection to send it on. */
    send: (req: LeaseRequestOut) => boolean,
    /** Schedules a flush after the current request (setImmediate in production). */
    schedule: (fn: () => void) => void = (fn) => setImmediate(fn),
    /**
     * Standing shares (docs/leases.md): with several nodes, ask for a share of every key's minute
     * budget and parallel slots in bulk, so that a key's first requests on this node do not wait.
     * On in production (data-plane/main.ts); the per-key protocol alone without it.
     */
    standingShares = false,
  ) {
    this.link = new LeaseLink(clock, send, schedule, standingShares, (req) => this.unsent(req));
    this.money = new LeaseMoney(this.link);
    this.shares = new LeaseStandingShares(this.link);
    this.slots = new LeaseSlots(this.link, this.shares);
    this.keys = new LeaseKeyMinutes(this.link, this.shares);
  }

  /** The sync client reports every connection change and the number of connected nodes. */
  setConnected(connected: boolean, connectedNodes?: number): void {
    if (connected !== this.link.connected) {
      this.link.reset();
      this.shares.reset();
      this.reclaimingAtMs = -Infinity;
      this.rejoining = false;
      this.keys.reset();
      const orgs = this.money.reset();
      this.slots.reset();
      this.link.connected = connected;
      if (connected) this.sayHeld();
      // Waiting requests try again: disconnected, the local limits apply; reconnected, they ask anew.
      this.keys.wakeAll();
      for (const o of orgs) wake(o);
      this.slots.wakeAll();
    }
    this.link.connected = connected;
    if (connected && connectedNodes !== undefined) this.setConnectedNodes(connectedNodes);
  }

  /**
   * What the node holds between connections (its slots in use, what it used of this minute's key
   * minutes), said in its Hello: a control plane that restarted counts it from the moment the node is
   * connected (docs/leases.md, "A control plane that restarts").
   */
  held(): { heldSlots: SlotHeld[]; heldKeyMinutes: KeyLeaseReturn[] } {
    return { heldSlots: this.slots.inUse(), heldKeyMinutes: this.keys.held(minuteOf(this.link.clock.now())) };
  }

  /**
   * On a new connection the node says at once what it holds (registered in the control plane's pools):
   * a control plane that restarted, or has not yet seen the old connection close, would otherwise not
   * count the slots in use here or the key minutes used until this node next asks, and a node whose
   * slots are all in use does not ask. Of key minutes, what was admitted since the Hello (as taken).
   */
  private sayHeld(): void {
    this.keys.sayHeld(minuteOf(this.link.clock.now()));
    this.slots.sayHeld();
    if (this.link.taken.size > 0 || this.link.slotReturns.length > 0) this.link.queueFlush();
  }

  /**
   * The roster: how many nodes are connected. `wholeNow`: alone, and nobody else was connected lately,
   * so the current minute is whole too (otherwise from the next one).
   */
  setConnectedNodes(n: number, wholeNow = false, rejoining = false): void {
    // The wait is over: the answers held back follow this roster, so waiting requests are not late.
    if (this.rejoining && !rejoining) this.noteReclaiming();
    this.rejoining = rejoining;
    const lone = n <= 1;
    if (!lone) this.link.loneFromMinute = Infinity;
    else if (this.link.loneFromMinute === Infinity) this.link.loneFromMinute = minuteOf(this.link.clock.now()) + (wholeNow ? 0 : 1);
    this.link.nodes = Math.max(1, n);
    // Several nodes: the standing shares of this minute and of the parallel slots, so that a key's
    // first requests on this node do not wait (docs/leases.md).
    if (!lone) {
      this.shares.askBulk(minuteOf(this.link.clock.now()));
      this.shares.askSlotShare();
    }
    this.shares.askOrgSlices();
  }

  get isConnected(): boolean {
    return this.link.connected;
  }

  // ── key minutes (lease-key-minutes.ts) ───────────────────────────────────

  allowanceFor(keyId: string, minute: number, limits?: KeyLimits): MinuteAllowance {
    return this.keys.allowanceFor(keyId, minute, limits);
  }

  peekAllowance(keyId: string, minute: number): MinuteAllowance | undefined {
    return this.keys.peekAllowance(keyId, minute);
  }

  noteUsage(keyId: string, minute: number, requests: number, tokens: number): void {
    this.keys.noteUsage(keyId, minute, requests, tokens);
  }

  sendUsed(everyKey = true): void {
    this.keys.sendUsed(everyKey);
  }

  applyUsedAck(seq: number): void {
    this.keys.applyUsedAck(seq);
  }

  usedState(): { pending: number; sent: number; acked: number } {
    return this.keys.usedState();
  }

  waitForKey(keyId: string, minute: number, limits: KeyLimits, needRequests: number, needTokens: number, wake: () => void): boolean {
    return this.keys.waitForKey(keyId, minute, limits, needRequests, needTokens, wake);
  }

  cancelKeyWait(keyId: string, wake: () => void): void {
    this.keys.cancelKeyWait(keyId, wake);
  }

  advanceKey(keyId: string, minute: number, limits: KeyLimits, needRequests: number, needTokens: number, timedOut: boolean): boolean {
    return this.keys.advanceKey(keyId, minute, limits, needRequests, needTokens, timedOut);
  }

  applyKeyGrant(g: KeyLease): void {
    this.keys.applyKeyGrant(g);
  }

  prefetchNextMinute(): void {
    this.keys.prefetchNextMinute();
  }

  applyPoolFree(p: KeyPoolFree): void {
    this.keys.applyPoolFree(p);
  }

  /**
   * The control plane said the answer to this node's latest wants waits for reclaims from other
   * nodes (at most about a second): until then a request out of time keeps waiting (answerDeferred).
   */
  noteReclaiming(): void {
    this.reclaimingAtMs = performance.now();
  }

  /**
   * Whether an answer the request that started at `startedAt` (performance.now()) waits for is known
   * to be on its way (the control plane said "reclaiming" since, or it waits for the nodes connected
   * before its start: Roster.rejoining): not late yet.
   */
  answerDeferred(startedAt: number): boolean {
    if (!this.link.connected) return false;
    return this.rejoining || (this.reclaimingAtMs >= startedAt && performance.now() - this.reclaimingAtMs < RECLAIMING_WAIT_MS);
  }

  /** For the admin listener: connected, how many nodes the roster counts, and whether the control plane waits for some to come back. */
  rosterState(): { connected: boolean; nodes: number; rejoining: boolean } {
    return { connected: this.link.connected, nodes: this.link.nodes, rejoining: this.rejoining };
  }

  // ── standing shares (lease-standing-shares.ts) ───────────────────────────

  standingState(): { minutes: number[]; slots: boolean } {
    return this.shares.standingState();
  }

  /** The answer to a bulk want: every key minute of that minute gets its standing share. */
  applyBulk(b: BulkShare): void {
    if (this.shares.recordBulk(b)) this.keys.addShare(b.minute, this.shares.bulk.get(b.minute));
  }

  /** The answer to the slot-share want: every key's slot records get their standing share. */
  applySlotShare(sh: SlotShare): void {
    const share = this.shares.recordSlotShare(sh);
    if (share) this.slots.addShare(share);
  }

  // ── reclaims ──────────────────────────────────────────────────────────────

  /** The control plane asks for unused allowance back: answered at once. */
  onReclaim(r: LeaseReclaim): void {
    if (!this.link.connected) return;
    const keyReturns = this.keys.reclaim(r.allKeys, r.keys);
    this.slots.reclaim(r.allKeys, r.slotKeyIds);
    const orgReturns = this.money.reclaim(r.orgIds);
    this.link.flush({ reclaimId: r.id, keyReturns, orgReturns });
  }

  /** A node that stops gives back everything it holds unused (before its connection closes). */
  giveBackAll(): void {
    if (!this.link.connected || this.link.leaving) return;
    this.link.leaving = true;
    this.link.wantKeys.clear();
    this.link.wantOrgs.clear();
    const keyReturns = this.keys.giveBack();
    this.slots.giveBack();
    const orgReturns = this.money.giveBack();
    this.link.flush({ reclaimId: 0, keyReturns, orgReturns });
  }

  // ── parallel-request slots (lease-slots.ts) ──────────────────────────────

  slotsFor(keyId: string, limits: KeyLimits, startedAt = performance.now()): { slots: number; final: boolean } | undefined {
    return this.slots.slotsFor(keyId, limits, startedAt);
  }

  noteInFlight(keyId: string, inFlight: number, maxParallel: number): void {
    this.slots.noteInFlight(keyId, inFlight, maxParallel);
  }

  waitForSlot(keyId: string, limits: KeyLimits, wake: () => void, startedAt = performance.now()): boolean {
    return this.slots.waitForSlot(keyId, limits, wake, startedAt);
  }

  advanceSlot(keyId: string, limits: KeyLimits, timedOut: boolean, startedAt = performance.now()): boolean {
    return this.slots.advanceSlot(keyId, limits, timedOut, startedAt);
  }

  cancelSlotWait(keyId: string, wake: () => void): void {
    this.slots.cancelSlotWait(keyId, wake);
  }

  applySlotGrant(g: SlotLease): void {
    this.slots.applySlotGrant(g);
  }

  slotState(keyId: string): { held: number; inUse: number; leased: boolean } | undefined {
    return this.slots.slotState(keyId);
  }

  // ── money (lease-money.ts) ────────────────────────────────────────────────

  canSpend(orgId: string): SpendVerdict {
    return this.money.canSpend(orgId);
  }

  spendFirst(orgId: string): boolean {
    return this.money.spendFirst(orgId);
  }

  applyOrgSlices(slices: Array<{ orgId: string; micros: number; advanceMicros?: number }>): void {
    this.money.applyOrgSlices(slices);
  }

  waitForOrg(orgId: string, wake: () => void): boolean {
    return this.money.waitForOrg(orgId, wake);
  }

  cancelOrgWait(orgId: string, wake: () => void): void {
    this.money.cancelOrgWait(orgId, wake);
  }

  reserveSpend(orgId: string, inAdvance = false): SpendReservation | undefined {
    return this.money.reserveSpend(orgId, inAdvance);
  }

  mayAdvance(poolId: string): boolean {
    return this.money.mayAdvance(poolId);
  }

  raiseSpend(poolId: string, reservation: SpendReservation, micros: number, unpriced: boolean, final: boolean, silent = false): RaiseVerdict {
    return this.money.raiseSpend(poolId, reservation, micros, unpriced, final, silent);
  }

  sliceOf(orgId: string): number | undefined {
    return this.money.sliceOf(orgId);
  }

  settleSpend(orgId: string, reservation: SpendReservation | undefined, costMicros: number): void {
    this.money.settleSpend(orgId, reservation, costMicros);
  }

  applyOrgGrant(orgId: string, micros: number, exhausted: boolean, advanceMicros?: number): void {
    this.money.applyOrgGrant(orgId, micros, exhausted, advanceMicros);
  }

  orgChanged(orgId: string): void {
    this.money.orgChanged(orgId);
  }

  poolsChanged(prefix: string): void {
    this.money.poolsChanged(prefix);
  }

  dropPool(poolId: string): void {
    this.money.dropPool(poolId);
  }

  // ── sending ───────────────────────────────────────────────────────────────

  /** Sends everything wanted (and given back) as one LeaseRequest. */
  flush(extra?: Pick<LeaseRequestOut, 'reclaimId' | 'keyReturns' | 'orgReturns'>): void {
    this.link.flush(extra);
  }

  /** A request that could not be sent (no connection): nothing is pending any more; the fallback applies until it is back. */
  private unsent(req: LeaseRequestOut): void {
    this.keys.unsent(req.keys);
    this.money.unsent(req.orgs);
    this.slots.unsent(req.slotWants);
  }

  /** Drops key minutes older than `minMinute` (called now and then by the node). */
  prune(minMinute: number): void {
    this.slots.prune();
    this.keys.prune(minMinute);
  }
}
