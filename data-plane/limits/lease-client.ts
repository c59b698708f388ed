// The node's side of leases (design.md, "Money and limits across nodes"). Pure: no I/O, no timers; the
// sync client gives it a `send` function and feeds it grants and connection changes.
//
// Keys: while connected, a node admits a key's requests and tokens in a minute only within what it
// holds for that minute: its cold share (proto/lib/leases.ts) plus what the control plane granted.
// It asks for the next chunk as soon as a minute is first touched (when the cold share is not the
// whole budget) and whenever what is left falls to half a chunk, so grants normally arrive before
// they are needed. While the control plane is unreachable the node falls back to the key's own limits
// locally (fail-static, documented in the README).
//
// Money: per organisation the node holds a slice granted by the control plane. It admits while the
// slice is positive; the first request of an organisation on a connection is admitted while its
// first slice is on the way; once a slice is spent and the control plane said nothing is left, the
// organisation's requests are refused until its state changes (credit, cap, config) or a short
// back-off passes. Slices belong to a connection: a reconnect starts afresh.
import { coldShare, leaseChunk } from '../../proto/lib/leases.js';
import type { AllowanceSource, KeyLimits, MinuteAllowance } from './key-budgets.js';
import type { Clock } from './clock.js';

import type { KeyLeaseWant, OrgLeaseWant, LeaseRequest } from '../../proto/gen/tollgate/v1/sync.js';

/** What the node sends: the generated LeaseRequest message. */
export type LeaseRequestOut = LeaseRequest;

interface KeyMinute {
  minute: number;
  rpm: number;
  tpm: number;
  allowRequests: number;
  allowTokens: number;
  usedRequests: number;
  usedTokens: number;
  pending: boolean;
  askedRequests: number;
  askedTokens: number;
  exhaustedRequests: boolean;
  exhaustedTokens: boolean;
}

interface OrgSlice {
  /** Granted, minus the cost of finished requests and the estimates of those in flight. */
  sliceMicros: number;
  lastGrantMicros: number;
  /** The most one request of the organisation has cost on this node: the estimate reserved per request. */
  maxCostMicros: number;
  granted: boolean;
  pending: boolean;
  exhaustedAtMs: number;
}

const UNLIMITED: MinuteAllowance = { requests: Infinity, tokens: Infinity };
/** After "nothing left", ask again at most this often (other nodes' slices may have come back). */
const EXHAUSTED_RETRY_MS = 1000;

/** An estimate reserved from an organisation's slice while its request is in flight. */
export interface SpendReservation {
  epoch: number;
  micros: number;
}

export class LeaseClient implements AllowanceSource {
  private connected = false;
  private nodes = 1;
  private readonly keys = new Map<string, KeyMinute>();
  private readonly orgs = new Map<string, OrgSlice>();
  private wantKeys = new Map<string, KeyLeaseWant>();
  private wantOrgs = new Map<string, OrgLeaseWant>();
  private flushQueued = false;
  /** Bumped on every connection change: slices and reservations belong to one connection. */
  private epoch = 0;

  constructor(
    private readonly clock: Clock,
    /** Sends one LeaseRequest; returns false when there is no connection to send it on. */
    private readonly send: (req: LeaseRequestOut) => boolean,
    /** Schedules a flush after the current request (setImmediate in production). */
    private readonly schedule: (fn: () => void) => void = (fn) => setImmediate(fn),
  ) {}

  /** The sync client reports every connection change and the number of connected nodes. */
  setConnected(connected: boolean, connectedNodes = this.nodes): void {
    if (connected !== this.connected) {
      // Whatever was held belonged to the old connection (keys keep their counts for registration).
      this.epoch++;
      this.orgs.clear();
      for (const k of this.keys.values()) k.pending = false;
      this.wantKeys.clear();
      this.wantOrgs.clear();
    }
    this.connected = connected;
    this.nodes = Math.max(1, connectedNodes);
  }

  setConnectedNodes(n: number): void {
    this.nodes = Math.max(1, n);
  }

  get isConnected(): boolean {
    return this.connected;
  }

  // ── keys ──────────────────────────────────────────────────────────────────

  allowanceFor(keyId: string, minute: number, limits?: KeyLimits): MinuteAllowance {
    if (!this.connected || !limits) return UNLIMITED;
    let k = this.keys.get(keyId);
    if (!k || k.minute !== minute) {
      const rpm = finiteLimit(limits.rpmLimit);
      const tpm = finiteLimit(limits.tpmLimit);
      k = {
        minute,
        rpm,
        tpm,
        allowRequests: rpm === Infinity ? Infinity : coldShare(rpm, this.nodes),
        allowTokens: tpm === Infinity ? Infinity : coldShare(tpm, this.nodes),
        usedRequests: 0,
        usedTokens: 0,
        pending: false,
        askedRequests: 0,
        askedTokens: 0,
        exhaustedRequests: false,
        exhaustedTokens: false,
      };
      this.keys.set(keyId, k);
      if (k.allowRequests < rpm || k.allowTokens < tpm) this.askKey(keyId, k, 0);
    }
    return { requests: k.allowRequests, tokens: k.allowTokens, requestsFinal: k.exhaustedRequests, tokensFinal: k.exhaustedTokens };
  }

  noteUsage(keyId: string, minute: number, requests: number, tokens: number): void {
    const k = this.keys.get(keyId);
    if (!k || k.minute !== minute || !this.connected) return;
    k.usedRequests = requests;
    k.usedTokens = tokens;
    this.maybeTopUp(keyId, k, 0);
  }

  /** Called when a request was refused for lack of this node's slice: ask for enough for it. */
  noteRefused(keyId: string, minute: number, estimatedTokens: number): void {
    const k = this.keys.get(keyId);
    if (!k || k.minute !== minute || !this.connected) return;
    this.maybeTopUp(keyId, k, estimatedTokens);
  }

  applyKeyGrant(keyId: string, minute: number, requests: number, tokens: number): void {
    const k = this.keys.get(keyId);
    if (!k || k.minute !== minute) return;
    k.pending = false;
    k.allowRequests += requests;
    k.allowTokens += tokens;
    // The pool had nothing left for what was asked: it will not grow again this minute.
    if (k.askedRequests > 0 && requests === 0) k.exhaustedRequests = true;
    if (k.askedTokens > 0 && tokens === 0) k.exhaustedTokens = true;
  }

  private maybeTopUp(keyId: string, k: KeyMinute, needTokens: number): void {
    if (k.pending) return;
    const chunkReq = leaseChunk(k.rpm, this.nodes);
    const chunkTok = leaseChunk(k.tpm, this.nodes);
    const lowReq = !k.exhaustedRequests && k.allowRequests < k.rpm && k.allowRequests - k.usedRequests <= Math.max(1, chunkReq / 2);
    const lowTok =
      !k.exhaustedTokens &&
      k.allowTokens < k.tpm &&
      (k.allowTokens - k.usedTokens <= chunkTok / 2 || k.allowTokens - k.usedTokens < needTokens);
    if (lowReq || lowTok) this.askKey(keyId, k, needTokens);
  }

  private askKey(keyId: string, k: KeyMinute, needTokens: number): void {
    const requests = k.allowRequests < k.rpm && !k.exhaustedRequests ? leaseChunk(k.rpm, this.nodes) : 0;
    const tokens = k.allowTokens < k.tpm && !k.exhaustedTokens ? Math.max(leaseChunk(k.tpm, this.nodes), needTokens) : 0;
    if (requests === 0 && tokens === 0) return;
    k.pending = true;
    k.askedRequests = requests;
    k.askedTokens = tokens;
    this.wantKeys.set(`${keyId}:${k.minute}`, {
      keyId,
      minute: k.minute,
      heldRequests: finiteOrZero(k.allowRequests),
      heldTokens: finiteOrZero(k.allowTokens),
      requests,
      tokens,
    });
    this.queueFlush();
  }

  // ── money ─────────────────────────────────────────────────────────────────

  /** May this node admit one more request of the organisation? */
  canSpend(orgId: string): boolean {
    if (!this.connected) return true;
    let o = this.orgs.get(orgId);
    if (!o) {
      o = { sliceMicros: 0, lastGrantMicros: 0, maxCostMicros: 0, granted: false, pending: false, exhaustedAtMs: 0 };
      this.orgs.set(orgId, o);
      this.askOrg(orgId, o);
      return true;
    }
    if (o.sliceMicros > 0) return true;
    if (!o.granted) return true;
    if (o.exhaustedAtMs > 0 && this.clock.now() - o.exhaustedAtMs >= EXHAUSTED_RETRY_MS) o.exhaustedAtMs = 0;
    if (o.exhaustedAtMs === 0) this.askOrg(orgId, o);
    return false;
  }

  /**
   * Reserves the estimated cost of an admitted request (the most a request of the organisation has
   * cost here) from the slice, so the next slice is asked for while this request runs rather than
   * after it: the grant is normally back before the next request needs it.
   */
  reserveSpend(orgId: string): SpendReservation | undefined {
    const o = this.orgs.get(orgId);
    if (!o || !this.connected) return undefined;
    o.sliceMicros -= o.maxCostMicros;
    this.maybeAskOrg(orgId, o);
    return { epoch: this.epoch, micros: o.maxCostMicros };
  }

  /** What is left of an organisation's slice on this node (undefined before its first request). For tests and metrics. */
  sliceOf(orgId: string): number | undefined {
    return this.orgs.get(orgId)?.sliceMicros;
  }

  /** The real cost of a finished request replaces its reservation (0 for a request that never ran). */
  settleSpend(orgId: string, reservation: SpendReservation | undefined, costMicros: number): void {
    const o = this.orgs.get(orgId);
    if (!o || !this.connected) return;
    // A reservation from an earlier connection was never taken from this slice; the cost still
    // counts here, as the control plane counts its report against this connection.
    const reserved = reservation && reservation.epoch === this.epoch ? reservation.micros : 0;
    o.sliceMicros += reserved - costMicros;
    if (costMicros > o.maxCostMicros) o.maxCostMicros = costMicros;
    this.maybeAskOrg(orgId, o);
  }

  private maybeAskOrg(orgId: string, o: OrgSlice): void {
    if (o.exhaustedAtMs === 0 && o.sliceMicros <= Math.max(o.lastGrantMicros / 2, 2 * o.maxCostMicros)) this.askOrg(orgId, o);
  }

  applyOrgGrant(orgId: string, micros: number, exhausted: boolean): void {
    const o = this.orgs.get(orgId);
    if (!o) return;
    o.pending = false;
    o.granted = true;
    o.sliceMicros += micros;
    if (micros > 0) o.lastGrantMicros = micros;
    if (exhausted || micros === 0) o.exhaustedAtMs = this.clock.now();
    // Still low (requests ran while the grant was on its way): ask again at once.
    else this.maybeAskOrg(orgId, o);
  }

  /** The organisation's state changed at the control plane (credit, cap, tier, config): ask afresh. */
  orgChanged(orgId: string): void {
    const o = this.orgs.get(orgId);
    if (!o) return;
    o.exhaustedAtMs = 0;
    this.maybeAskOrg(orgId, o);
  }

  private askOrg(orgId: string, o: OrgSlice): void {
    if (o.pending) return;
    o.pending = true;
    // What the slice is short (requests admitted while the first slice was on its way) plus enough for
    // a few of the organisation's most expensive requests; the control plane may give more.
    this.wantOrgs.set(orgId, { orgId, micros: Math.max(0, -o.sliceMicros) + 4 * o.maxCostMicros });
    this.queueFlush();
  }

  // ── sending ───────────────────────────────────────────────────────────────

  private queueFlush(): void {
    if (this.flushQueued) return;
    this.flushQueued = true;
    this.schedule(() => this.flush());
  }

  /** Sends everything wanted as one LeaseRequest. */
  flush(): void {
    this.flushQueued = false;
    if (this.wantKeys.size === 0 && this.wantOrgs.size === 0) return;
    const req: LeaseRequestOut = { keys: [...this.wantKeys.values()], orgs: [...this.wantOrgs.values()] };
    this.wantKeys = new Map();
    this.wantOrgs = new Map();
    if (!this.send(req)) {
      // No connection: nothing is pending any more; the fallback applies until it is back.
      for (const w of req.keys) {
        const k = this.keys.get(w.keyId);
        if (k) k.pending = false;
      }
      for (const w of req.orgs) {
        const o = this.orgs.get(w.orgId);
        if (o) o.pending = false;
      }
    }
  }

  /** Drops key minutes older than `minMinute` (called now and then by the node). */
  prune(minMinute: number): void {
    for (const [id, k] of this.keys) if (k.minute < minMinute) this.keys.delete(id);
  }
}

function finiteLimit(limit: number): number {
  return Number.isFinite(limit) && limit > 0 ? limit : Infinity;
}

function finiteOrZero(n: number): number {
  return Number.isFinite(n) ? n : 0;
}
