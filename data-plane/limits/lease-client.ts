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

export interface KeyLeaseWant {
  keyId: string;
  minute: number;
  heldRequests: number;
  heldTokens: number;
  requests: number;
  tokens: number;
}

export interface OrgLeaseWant {
  orgId: string;
  micros: number;
}

export interface LeaseRequestOut {
  keys: KeyLeaseWant[];
  orgs: OrgLeaseWant[];
}

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
  sliceMicros: number;
  lastGrantMicros: number;
  granted: boolean;
  pending: boolean;
  exhaustedAtMs: number;
}

const UNLIMITED: MinuteAllowance = { requests: Infinity, tokens: Infinity };
/** After "nothing left", ask again at most this often (other nodes' slices may have come back). */
const EXHAUSTED_RETRY_MS = 1000;

export class LeaseClient implements AllowanceSource {
  private connected = false;
  private nodes = 1;
  private readonly keys = new Map<string, KeyMinute>();
  private readonly orgs = new Map<string, OrgSlice>();
  private wantKeys = new Map<string, KeyLeaseWant>();
  private wantOrgs = new Map<string, OrgLeaseWant>();
  private flushQueued = false;

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
    return { requests: k.allowRequests, tokens: k.allowTokens };
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
      o = { sliceMicros: 0, lastGrantMicros: 0, granted: false, pending: false, exhaustedAtMs: 0 };
      this.orgs.set(orgId, o);
      this.askOrg(orgId, o);
      return true;
    }
    if (o.sliceMicros > 0) return true;
    if (!o.granted) return true;
    if (o.exhaustedAtMs > 0 && this.clock.now() - o.exhaustedAtMs >= EXHAUSTED_RETRY_MS) {
      o.exhaustedAtMs = 0;
      this.askOrg(orgId, o);
    }
    return false;
  }

  /** The cost of a finished request comes off the slice it was admitted against. */
  charge(orgId: string, costMicros: number): void {
    const o = this.orgs.get(orgId);
    if (!o || !this.connected) return;
    o.sliceMicros -= costMicros;
    if (o.exhaustedAtMs === 0 && o.sliceMicros <= o.lastGrantMicros / 2) this.askOrg(orgId, o);
  }

  applyOrgGrant(orgId: string, micros: number, exhausted: boolean): void {
    const o = this.orgs.get(orgId);
    if (!o) return;
    o.pending = false;
    o.granted = true;
    o.sliceMicros += micros;
    if (micros > 0) o.lastGrantMicros = micros;
    if (exhausted || micros === 0) o.exhaustedAtMs = this.clock.now();
  }

  /** The organisation's state changed at the control plane (credit, cap, tier, config): ask afresh. */
  orgChanged(orgId: string): void {
    const o = this.orgs.get(orgId);
    if (!o) return;
    o.exhaustedAtMs = 0;
    if (o.sliceMicros <= o.lastGrantMicros / 2) this.askOrg(orgId, o);
  }

  private askOrg(orgId: string, o: OrgSlice): void {
    if (o.pending) return;
    o.pending = true;
    this.wantOrgs.set(orgId, { orgId, micros: 0 });
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
