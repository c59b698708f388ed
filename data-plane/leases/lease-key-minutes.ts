// Key minutes on the node's side of leases (docs/design.md#money-and-limits-across-nodes): while
// connected, a node admits a key's requests and tokens in a minute only within what it holds for that
// minute. A lone node holds the whole budget (proto/lib/leases.ts); with several nodes a node holds
// only what it leased, in chunks, and asks for the next chunk while half of one is still left, so
// steady traffic does not wait. A request the node cannot cover waits (the HTTP layer parks it,
// bounded) while the node asks for what it needs; the control plane reclaims unused allowance from
// the other nodes before it says the pool is spent (`final`): only then is the request refused. A
// reclaim is answered at once with what is held unused. While the control plane is unreachable the
// node falls back to the key's own limits locally (fail-static, docs/design.md#control-plane-unreachable).
//
// The node also says what it has used of the key minutes it leased (sendUsed, called every 100 ms
// by the sync client, only for those that changed): if it dies, the control plane frees the rest of
// what it held instead of losing it for the minute.
import { coldShare, leaseChunk } from '../../proto/lib/leases.js';
import type { KeyLease, KeyLeaseReturn, KeyLeaseWant, KeyMinuteRef, KeyPoolFree } from '../../proto/gen/tollgate/v1/sync.js';
import type { KeyLimits, MinuteAllowance } from '../limits/key-budgets.js';
import { allowanceOf, heardOthers, newKeyMinute, useAway, type KeyMinute } from './key-minute.js';
import { finiteLimit, finiteOrZero, wake, type LeaseLink } from './lease-link.js';
import type { StandingShare, LeaseStandingShares } from './lease-standing-shares.js';
import { minuteOf } from '../limits/clock.js';


const UNLIMITED: MinuteAllowance = { requests: Infinity, tokens: Infinity };

/** The key minutes this node holds, by key (LeaseClient delegates to it). */
export class LeaseKeyMinutes {
  private readonly keys = new Map<string, KeyMinute>();
  /** First chunks of the next minute, prefetched shortly before its top for keys used this minute. */
  private readonly nextKeys = new Map<string, KeyMinute>();
  /** Leased key minutes whose use changed since the node last said. */
  private usedDirty = new Set<string>();
  private usedSeq = 0;
  private usedAcked = 0;
  private readonly lastNeedTokens = new Map<string, number>();
  /**
   * What the node admitted of keys it held no key minute of, while disconnected (fail-static): said
   * in its Hello, and where the key minute starts when the key is next leased.
   */
  private readonly unleased = new Map<string, { minute: number; requests: number; tokens: number }>();
  /** What the latest Hello said this node holds, by `keyId:minute` (the new connection says only what came since). */
  private saidInHello = new Map<string, { requests: number; tokens: number }>();

  constructor(
    private readonly link: LeaseLink,
    private readonly shares: LeaseStandingShares,
  ) {}

  allowanceFor(keyId: string, minute: number, limits?: KeyLimits): MinuteAllowance {
    if (!this.link.connected || !limits) return UNLIMITED;
    return allowanceOf(this.keyMinute(keyId, minute, limits));
  }

  peekAllowance(keyId: string, minute: number): MinuteAllowance | undefined {
    const k = this.keys.get(keyId);
    if (!this.link.connected || !k || k.minute !== minute) return undefined;
    return allowanceOf(k);
  }

  private keyMinute(keyId: string, minute: number, limits: KeyLimits): KeyMinute {
    let k = this.keys.get(keyId);
    const prefetched = this.nextKeys.get(keyId);
    if ((!k || k.minute !== minute) && prefetched?.minute === minute) {
      this.nextKeys.delete(keyId);
      this.keys.set(keyId, prefetched);
      if (k) wake(k);
      return prefetched;
    }
    if (!k || k.minute !== minute) {
      const rpm = finiteLimit(limits.rpmLimit);
      const tpm = finiteLimit(limits.tpmLimit);
      const old = k;
      const n = minute >= this.link.loneFromMinute ? 1 : Math.max(2, this.link.nodes);
      k = newKeyMinute(minute, rpm, tpm, coldShare(rpm, n), coldShare(tpm, n), n <= 1 ? 0 : rpm, n <= 1 ? 0 : tpm);
      // Admitted while disconnected and said as held since: used, and held (as the control plane counts it).
      const away = this.unleased.get(keyId);
      this.unleased.delete(keyId);
      if (away?.minute === minute) useAway(k, away.requests, away.tokens);
      this.keys.set(keyId, k);
      // Requests parked on the old minute try again in the new one.
      if (old) wake(old);
      if (n > 1) {
        this.shares.askBulk(minute);
        const b = this.shares.bulk.get(minute);
        if (b) this.shares.addBulkShare(keyId, k, b);
        else if (this.shares.bulkAsked.has(minute) && !this.shares.bulkDenied.has(minute)) k.awaitingBulk = true;
      }
      if (!k.awaitingBulk) this.maybeTopUp(keyId, k, 0, 0);
    }
    return k;
  }

  noteUsage(keyId: string, minute: number, requests: number, tokens: number): void {
    const k = this.keys.get(keyId);
    if (!this.link.connected) {
      // Fail-static: the key's own limits apply here, and what they admit is said on the next
      // connection (held): a control plane that took over meanwhile counts it (docs/leases.md).
      if (k?.minute === minute) useAway(k, requests, tokens);
      else this.unleased.set(keyId, { minute, requests, tokens });
      return;
    }
    if (!k || k.minute !== minute) return;
    k.usedRequests = requests;
    k.usedTokens = tokens;
    if (minute < this.link.loneFromMinute) this.usedDirty.add(keyId);
    this.maybeTopUp(keyId, k, 0, 0);
  }

  /**
   * Says what the node used of leased key minutes that changed since it last said. `everyKey` false
   * (the sync client's ticks between whole seconds): only key minutes this node asked the control
   * plane for (it holds more than its standing share there, or has none); a key minute used within
   * its standing share waits for the next whole second (docs/leases.md, "Standing shares").
   */
  sendUsed(everyKey = true): void {
    if (!this.link.connected || this.link.leaving || this.usedDirty.size === 0) return;
    const used = [];
    for (const keyId of this.usedDirty) {
      const k = this.keys.get(keyId);
      if (!k) {
        this.usedDirty.delete(keyId);
        continue;
      }
      if (!everyKey && k.bulkApplied && !k.asked) continue;
      used.push({ keyId, minute: k.minute, requests: k.usedRequests, tokens: k.usedTokens });
      this.usedDirty.delete(keyId);
    }
    if (used.length === 0) return;
    this.link.send({ keys: [], orgs: [], reclaimId: 0, keyReturns: [], orgReturns: [], leaseEpoch: this.link.epoch, leaving: false, used, usedSeq: ++this.usedSeq, slotWants: [], slotReturns: [], taken: [], bulkMinute: 0, wantSlotShare: false, wantOrgSlices: false });
  }

  applyUsedAck(seq: number): void {
    if (seq > this.usedAcked) this.usedAcked = seq;
  }

  /** For tests and benchmarks: whether the control plane knows all this node used. */
  usedState(): { pending: number; sent: number; acked: number } {
    return { pending: this.usedDirty.size, sent: this.usedSeq, acked: this.usedAcked };
  }

  /**
   * A request of the key does not fit what this node holds: asks for at least `needRequests` and
   * `needTokens` more and calls `wake` once when the answer came (or the connection changed). False
   * when there is nothing to wait for (not connected, or the pool already said it is spent).
   */
  waitForKey(keyId: string, minute: number, limits: KeyLimits, needRequests: number, needTokens: number, wake: () => void): boolean {
    if (!this.link.connected) return false;
    const k = this.keyMinute(keyId, minute, limits);
    if ((needRequests > 0 && k.finalRequests) || (needTokens > 0 && needTokens >= k.finalTokensNeed)) return false;
    // A want of this key minute already went unanswered past the bound: no more waiting (advanceKey).
    if (k.advancing) return false;
    k.waiters.push(wake);
    // The minute's standing share is on its way: it is what the request waits for.
    if (k.awaitingBulk) return true;
    if (!k.pending || this.link.stale(k.askedAtMs)) this.askKey(keyId, k, needRequests, needTokens);
    return true;
  }

  /** Drops a waiter that gave up (its request was answered another way). */
  cancelKeyWait(keyId: string, wake: () => void): void {
    const k = this.keys.get(keyId);
    if (k) k.waiters = k.waiters.filter((w) => w !== wake);
  }

  /**
   * Admission in advance of a late answer (docs/leases.md). `timedOut`: a request waited the whole
   * bound for this key minute's want and no answer came (the control plane is slow or stalled; it did
   * not say the key is spent). From then until the answer comes, requests of the key minute that this
   * node cannot cover do not wait: the node takes what each needs, within the key's own limits
   * counted here (KeyBudgets checks them first), as it would with the connection down (fail-static),
   * and tells the control plane what it took, which counts it as held by this node. False when there
   * is nothing to take (not connected, the pool said it is spent, or no want has timed out).
   */
  advanceKey(keyId: string, minute: number, limits: KeyLimits, needRequests: number, needTokens: number, timedOut: boolean): boolean {
    if (!this.link.connected || this.link.leaving) return false;
    const k = this.keyMinute(keyId, minute, limits);
    if ((needRequests > 0 && k.finalRequests) || (needTokens > 0 && needTokens >= k.finalTokensNeed)) return false;
    if (!timedOut && !k.advancing) return false;
    k.advancing = true;
    k.asked = true;
    const requests = Number.isFinite(k.allowRequests) ? Math.max(0, needRequests) : 0;
    const tokens = Number.isFinite(k.allowTokens) ? Math.max(0, needTokens) : 0;
    k.allowRequests += requests;
    k.allowTokens += tokens;
    const id = `${keyId}:${minute}`;
    const t = this.link.taken.get(id);
    if (t) {
      t.requests += requests;
      t.tokens += tokens;
    } else this.link.taken.set(id, { keyId, minute, requests, tokens });
    this.link.queueFlush();
    return true;
  }

  applyKeyGrant(g: KeyLease): void {
    if (this.link.leaving) {
      // Granted before the control plane heard this node is stopping: straight back.
      if (g.requests > 0 || g.tokens > 0) this.link.flush({ reclaimId: 0, keyReturns: [{ keyId: g.keyId, minute: g.minute, requests: g.requests, tokens: g.tokens, heldRequests: 0, heldTokens: 0 }], orgReturns: [] });
      return;
    }
    let k = this.keys.get(g.keyId);
    if (!k || k.minute !== g.minute) k = this.nextKeys.get(g.keyId);
    if (!k || k.minute !== g.minute) return;
    k.pending = false;
    // The answer came: requests wait for the next one again (within the bound).
    k.advancing = false;
    k.allowRequests += g.requests;
    k.allowTokens += g.tokens;
    k.freeRequests = g.freeRequests;
    k.freeTokens = g.freeTokens;
    k.freeUnknown = false;
    heardOthers(k, g);
    if (g.finalRequests) k.finalRequests = true;
    if (g.finalTokens) {
      const asked = this.lastNeedTokens.get(g.keyId) ?? 1;
      k.finalTokensNeed = Math.min(k.finalTokensNeed, Math.max(1, asked));
    }
    if (g.requests > 0) k.finalRequests = false;
    // Waiting requests ask with what they need; without waiters, prefetch if the pool has more.
    if (k.waiters.length > 0) wake(k);
    else this.maybeTopUp(g.keyId, k, 0, 0);
  }

  /**
   * Shortly before the top of a minute (the sync client calls this in its last seconds): the first
   * chunk of the next minute for every key used this minute, so steady traffic does not wait at the
   * top of the minute. A lone node holds whole minutes and needs none.
   */
  prefetchNextMinute(): void {
    if (!this.link.connected) return;
    const next = minuteOf(this.link.clock.now()) + 1;
    if (next >= this.link.loneFromMinute) return;
    this.shares.askBulk(next);
    for (const [keyId, k] of this.keys) {
      // Keys that used more than their standing share this minute get their first chunk too.
      if (k.minute !== next - 1 || k.usedRequests === 0 || this.nextKeys.get(keyId)?.minute === next) continue;
      if (this.shares.bulk.has(next - 1) && !k.pending && k.freeUnknown) continue;
      const nk = newKeyMinute(next, k.rpm, k.tpm, 0, 0, k.rpm, k.tpm);
      this.nextKeys.set(keyId, nk);
      this.askKey(keyId, nk, 0, 0);
    }
  }

  /**
   * Another node leased from, or gave back to, a pool this node is in: what the pool has left
   * unleased and what the others used (in order on the stream, so the latest is the truth). Budget
   * given back lifts a "spent".
   */
  applyPoolFree(p: KeyPoolFree): void {
    let k = this.keys.get(p.keyId);
    if (!k || k.minute !== p.minute) k = this.nextKeys.get(p.keyId);
    if (!k || k.minute !== p.minute) return;
    k.freeRequests = p.freeRequests;
    k.freeTokens = p.freeTokens;
    k.freeUnknown = false;
    heardOthers(k, p);
    if (p.freeRequests > 0) k.finalRequests = false;
    if (p.freeTokens > 0) k.finalTokensNeed = Infinity;
  }

  /**
   * Prefetch: ask for the next chunk while half of one is still left, if the pool had any left
   * when last heard (a request that finds nothing here asks with its need, which reclaims).
   */
  private maybeTopUp(keyId: string, k: KeyMinute, needRequests: number, needTokens: number): void {
    if ((k.pending && !this.link.stale(k.askedAtMs)) || !this.link.connected) return;
    const chunkReq = leaseChunk(k.rpm, this.link.nodes);
    const chunkTok = leaseChunk(k.tpm, this.link.nodes);
    const lowReq = !k.finalRequests && (k.freeRequests > 0 || k.freeUnknown) && k.allowRequests < k.rpm && k.allowRequests - k.usedRequests <= chunkReq / 2;
    const lowTok = k.finalTokensNeed === Infinity && (k.freeTokens > 0 || k.freeUnknown) && k.allowTokens < k.tpm && k.allowTokens - k.usedTokens <= chunkTok / 2;
    if (lowReq || lowTok) this.askKey(keyId, k, needRequests, needTokens);
  }

  private askKey(keyId: string, k: KeyMinute, needRequests: number, needTokens: number): void {
    if (this.link.leaving) return;
    const chunkReq = leaseChunk(k.rpm, this.link.nodes);
    const chunkTok = leaseChunk(k.tpm, this.link.nodes);
    const requests = k.allowRequests < k.rpm && !k.finalRequests ? Math.min(chunkReq, k.rpm - k.allowRequests) : 0;
    const tokens = k.allowTokens < k.tpm ? Math.min(Math.max(chunkTok, needTokens), k.tpm - k.allowTokens) : 0;
    if (requests === 0 && tokens === 0 && needRequests === 0 && needTokens === 0) return;
    k.pending = true;
    k.asked = true;
    k.askedAtMs = this.link.clock.now();
    this.lastNeedTokens.set(keyId, needTokens);
    this.link.wantKeys.set(`${keyId}:${k.minute}`, {
      keyId,
      minute: k.minute,
      heldRequests: finiteOrZero(k.allowRequests),
      heldTokens: finiteOrZero(k.allowTokens),
      requests,
      tokens,
      needRequests: Math.max(0, needRequests),
      needTokens: Math.max(0, needTokens),
    });
    this.link.queueFlush();
  }

  /** The answer to a bulk want (LeaseStandingShares.recordBulk): every key minute of that minute gets its standing share (none: `share` undefined). */
  addShare(minute: number, share: StandingShare | undefined): void {
    for (const [keyId, k] of [...this.keys, ...this.nextKeys]) {
      if (k.minute !== minute) continue;
      if (share) this.shares.addBulkShare(keyId, k, share);
      else if (k.awaitingBulk) {
        k.awaitingBulk = false;
        wake(k);
        this.maybeTopUp(keyId, k, 0, 0);
      }
    }
  }

  /** A reclaim: the unused part of the named key minutes (every one: `allKeys`) goes back. */
  reclaim(allKeys: boolean, keyRefs: KeyMinuteRef[]): KeyLeaseReturn[] {
    const keyReturns: KeyLeaseReturn[] = [];
    const refs = allKeys ? [...this.keys, ...this.nextKeys].map(([keyId, k]) => ({ keyId, minute: k.minute })) : keyRefs;
    for (const ref of refs) {
      let k = this.keys.get(ref.keyId);
      if (!k || k.minute !== ref.minute) k = this.nextKeys.get(ref.keyId);
      // The minute's standing share of a key not touched here is given back: it is never added. (A
      // share still on its way was granted after this reclaim was sent, as the stream is in order, so
      // the control plane counts it after this answer: it is kept.)
      if ((!k || k.minute !== ref.minute) && this.shares.bulk.has(ref.minute)) this.shares.forfeited.add(`${ref.keyId}:${ref.minute}`);
      if (!k || k.minute !== ref.minute) {
        keyReturns.push({ keyId: ref.keyId, minute: ref.minute, requests: 0, tokens: 0, heldRequests: 0, heldTokens: 0 });
        continue;
      }
      const req = Number.isFinite(k.allowRequests) ? Math.max(0, k.allowRequests - k.usedRequests) : 0;
      const tok = Number.isFinite(k.allowTokens) ? Math.max(0, k.allowTokens - k.usedTokens) : 0;
      k.allowRequests -= req;
      k.allowTokens -= tok;
      keyReturns.push({ keyId: ref.keyId, minute: ref.minute, requests: req, tokens: tok, heldRequests: finiteOrZero(k.allowRequests), heldTokens: finiteOrZero(k.allowTokens) });
    }
    return keyReturns;
  }

  /** The node stops: every key minute's unused part goes back. */
  giveBack(): KeyLeaseReturn[] {
    const keyReturns: KeyLeaseReturn[] = [];
    for (const [keyId, k] of [...this.keys, ...this.nextKeys]) {
      const req = Number.isFinite(k.allowRequests) ? Math.max(0, k.allowRequests - k.usedRequests) : 0;
      const tok = Number.isFinite(k.allowTokens) ? Math.max(0, k.allowTokens - k.usedTokens) : 0;
      k.allowRequests -= req;
      k.allowTokens -= tok;
      keyReturns.push({ keyId, minute: k.minute, requests: req, tokens: tok, heldRequests: finiteOrZero(k.allowRequests), heldTokens: finiteOrZero(k.allowTokens) });
    }
    return keyReturns;
  }

  /**
   * A connection change: whatever was held belonged to the old connection; the control plane
   * released it. What was used stays used, and is what the node says it holds when it next asks.
   */
  reset(): void {
    for (const k of this.keys.values()) {
      k.pending = false;
      k.advancing = false;
      k.awaitingBulk = false;
      k.bulkApplied = false;
      // (What was admitted in advance of an answer is used, and held like the rest.)
      if (Number.isFinite(k.allowRequests)) k.allowRequests = k.usedRequests;
      if (Number.isFinite(k.allowTokens)) k.allowTokens = k.usedTokens;
      k.finalRequests = false;
      k.finalTokensNeed = Infinity;
    }
    this.usedDirty.clear();
  }

  /**
   * What this node holds of the minute's key minutes, what it admitted while disconnected included
   * (said in a Hello: remembered, so the new connection says only what was admitted after it).
   */
  held(minute: number): KeyLeaseReturn[] {
    const out: KeyLeaseReturn[] = [];
    for (const [keyId, k] of this.keys) {
      const heldRequests = finiteOrZero(k.allowRequests);
      const heldTokens = finiteOrZero(k.allowTokens);
      if (k.minute === minute && (heldRequests > 0 || heldTokens > 0)) out.push({ keyId, minute, requests: 0, tokens: 0, heldRequests, heldTokens });
    }
    for (const [keyId, u] of this.unleased) {
      if (u.minute === minute && this.keys.get(keyId)?.minute !== minute && (u.requests > 0 || u.tokens > 0)) out.push({ keyId, minute, requests: 0, tokens: 0, heldRequests: u.requests, heldTokens: u.tokens });
    }
    this.saidInHello = new Map(out.map((h) => [`${h.keyId}:${minute}`, { requests: h.heldRequests, tokens: h.heldTokens }]));
    return out;
  }

  /**
   * On a new connection (LeaseClient.sayHeld): what this node admitted of the current minute since its
   * Hello was written (still disconnected) is said at once, as taken (the control plane adds it to
   * what the Hello registered), so it is counted once.
   */
  sayHeld(minute: number): void {
    const hello = this.saidInHello;
    this.saidInHello = new Map();
    for (const h of this.held(minute)) {
      const id = `${h.keyId}:${minute}`;
      const before = hello.get(id);
      const requests = Math.max(0, h.heldRequests - (before?.requests ?? 0));
      const tokens = Math.max(0, h.heldTokens - (before?.tokens ?? 0));
      if (requests > 0 || tokens > 0) this.link.taken.set(id, { keyId: h.keyId, minute, requests, tokens });
    }
    this.saidInHello = new Map();
  }

  wakeAll(): void {
    for (const k of this.keys.values()) wake(k);
  }

  /** Wants that could not be sent: not pending any more. */
  unsent(wants: KeyLeaseWant[]): void {
    for (const w of wants) {
      const k = this.keys.get(w.keyId);
      if (k) {
        k.pending = false;
        wake(k);
      }
    }
  }

  /** Drops key minutes older than `minMinute`. */
  prune(minMinute: number): void {
    for (const [id, u] of this.unleased) if (u.minute < minMinute) this.unleased.delete(id);
    for (const [id, k] of this.nextKeys) if (k.minute < minMinute) this.nextKeys.delete(id);
    for (const [id, k] of this.keys) {
      if (k.minute < minMinute) {
        this.keys.delete(id);
        this.lastNeedTokens.delete(id);
        wake(k);
      }
    }
  }
}
