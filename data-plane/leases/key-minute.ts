// One key minute as a node holds it (lease-key-minutes.ts keeps them, lease-standing-shares.ts adds
// the standing share to them), and what KeyBudgets reads of one (key-budgets.ts, MinuteAllowance).
// Pure.
import type { MinuteAllowance } from '../limits/key-budgets.js';

export interface KeyMinute {
  minute: number;
  rpm: number;
  tpm: number;
  allowRequests: number;
  allowTokens: number;
  usedRequests: number;
  usedTokens: number;
  pending: boolean;
  /** When the pending want was sent (a want unanswered this long is asked again). */
  askedAtMs: number;
  /** The pool had less than one request free even after reclaiming. */
  finalRequests: boolean;
  /** The smallest token need the pool could not cover after reclaiming (Infinity: none). */
  finalTokensNeed: number;
  freeRequests: number;
  freeTokens: number;
  /** What the control plane last said the key's other holders used of this minute (the rate headers). */
  othersUsedRequests: number;
  othersUsedTokens: number;
  /** Requests waiting for this key minute's next grant. */
  waiters: Array<() => void>;
  /**
   * A want of this key minute went unanswered past the wait bound: until the next answer the node
   * admits against the key's own limits counted here (fail-static for this key minute), and the
   * control plane counts what it used from the node's used reports (docs/leases.md).
   */
  advancing: boolean;
  /** The minute's standing share (BulkShare) is on its way: requests wait for it, not for a want. */
  awaitingBulk: boolean;
  /** The standing share was added (or given back before it came). */
  bulkApplied: boolean;
  /** Nothing heard yet of what the pool has free (a standing share is used without asking). */
  freeUnknown: boolean;
  /** The node asked the control plane for this key minute (a want, or what it took in advance): its use is said every 100 ms. */
  asked: boolean;
}

/** A key's minute as a node starts it: `allow*` leased so far (unlimited stays unlimited), nothing used. */
export function newKeyMinute(minute: number, rpm: number, tpm: number, allowRequests: number, allowTokens: number, freeRequests: number, freeTokens: number): KeyMinute {
  return {
    minute,
    rpm,
    tpm,
    allowRequests: rpm === Infinity ? Infinity : allowRequests,
    allowTokens: tpm === Infinity ? Infinity : allowTokens,
    usedRequests: 0,
    usedTokens: 0,
    pending: false,
    askedAtMs: 0,
    finalRequests: false,
    finalTokensNeed: Infinity,
    freeRequests,
    freeTokens,
    othersUsedRequests: 0,
    othersUsedTokens: 0,
    waiters: [],
    advancing: false,
    awaitingBulk: false,
    bulkApplied: false,
    freeUnknown: false,
    asked: false,
  };
}

/** What KeyBudgets reads of a key minute: what this node may admit, and what the others used (the rate headers). */
export function allowanceOf(k: KeyMinute): MinuteAllowance {
  return {
    requests: k.allowRequests,
    tokens: k.allowTokens,
    requestsFinal: k.finalRequests,
    tokensFinalNeed: k.finalTokensNeed,
    othersUsedRequests: k.othersUsedRequests,
    othersUsedTokens: k.othersUsedTokens,
  };
}

/** The control plane's latest word on what the key's other holders used (absent: it did not say). */
export function heardOthers(k: KeyMinute, m: { othersUsedRequests?: number; othersUsedTokens?: number }): void {
  if (m.othersUsedRequests !== undefined) k.othersUsedRequests = Math.max(0, m.othersUsedRequests);
  if (m.othersUsedTokens !== undefined) k.othersUsedTokens = Math.max(0, m.othersUsedTokens);
}

/**
 * What the node admitted of a key minute while disconnected (fail-static): used, and held, as the
 * node says in its next Hello. Unlimited stays unlimited.
 */
export function useAway(k: KeyMinute, requests: number, tokens: number): void {
  k.usedRequests = requests;
  k.usedTokens = tokens;
  if (Number.isFinite(k.allowRequests)) k.allowRequests = Math.max(k.allowRequests, k.usedRequests);
  if (Number.isFinite(k.allowTokens)) k.allowTokens = Math.max(k.allowTokens, k.usedTokens);
}
