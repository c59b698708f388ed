// The lease service of the sync service (docs/leases.md): a node's lease wants, answered with
// grants from the ledgers (lease-ledger.ts), standing shares, money slices, and the reclaims that ask
// other nodes to give back unused allowance before a shortfall is final.
import type { ControlMessage, GatewayConfig, KeyLease, KeyLeaseWant, KeyMinuteRef, KeyPoolFree, LeaseRequest, OrgLease, OrgLeaseWant, SlotLease, SlotWant } from '../../proto/gen/tollgate/v1/sync.js';
import { deploymentOfPool, deploymentPoolId } from '../../proto/lib/leases.js';
import type { ControlState } from '../state/control-state.js';
import { countLeaseAnswers } from '../metrics.js';
import { KeyLeaseLedger, type KeyLimitsForLease } from './key-lease-ledger.js';
import { MoneyLeaseLedger } from './money-lease-ledger.js';
import { SlotLedger } from './slot-ledger.js';
import { MoneyPools, partitionPools } from './money-pools.js';

/** How long a lease answer waits for the nodes asked to give back unused allowance. */
const RECLAIM_TIMEOUT_MS = 150;
/**
 * How long a money answer waits for them: a node that answers late still holds money the asker
 * would be told is spent, and a node loaded enough to take over 150 ms is no rarity. Within the
 * node's patience after "reclaiming" (data-plane lease-client.ts RECLAIMING_WAIT_MS, 1.2 s).
 */
const MONEY_RECLAIM_TIMEOUT_MS = 1000;
/** How long a former lone node has to say what it holds before others are leased its key minutes. */
const WHOLE_RECLAIM_TIMEOUT_MS = 1000;

/**
 * A node's connection as the lease service sees it (sync/node-session.ts is one): leases belong to a
 * connection, answers and reclaims go out on it, and a former lone node may hold whole key budgets.
 */
export interface LeaseSession {
  readonly connId: string;
  readonly nodeId: string;
  readonly closed: boolean;
  /** The node said it is stopping: it is granted nothing more. */
  leaving: boolean;
  /** The node's lease epoch on this connection (from its lease requests). */
  leaseEpoch: number;
  /** Reclaims sent to this node and not yet answered, by id. */
  readonly reclaims: Map<number, () => void>;
  mayHoldWhole: boolean;
  wholeReclaimId: number;
  wholeReclaim: Promise<void>;
  enqueue(message: ControlMessage): void;
}

let reclaimIds = 0;

/** The node is told the answer to its wants waits for reclaims, so it does not take it as late. */
function tellWaiting(s: LeaseSession): void {
  s.enqueue({ leaseGrant: { keys: [], orgs: [], pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: true, orgSlices: false } });
}

export class LeaseService {
  private readonly keyLeases = new KeyLeaseLedger((poolId) => this.minuteLimitsOf(poolId));
  /** The current config's deployments' limits by minute pool id (deploymentLimits). */
  private deploymentLimits: { config: GatewayConfig; byPool: Map<string, KeyLimitsForLease> } | null = null;
  private readonly slotLeases = new SlotLedger((keyId) => this.state.snapshots.keyById(keyId)?.maxParallelRequests);
  /** Also charged by the report queue (a cost reserved from this connection's slice). */
  readonly moneyLeases = new MoneyLeaseLedger();
  /** Projects' caps and keys' own limits, leased by pool id through moneyLeases (docs/money-limits.md). */
  readonly moneyPools: MoneyPools;
  /** Money reclaims awaited → the connection whose want they were made for. */
  private readonly moneyReclaimFor = new Map<number, string>();

  constructor(
    private readonly state: ControlState,
    /** Every connected node's session (the sync service's set). */
    private readonly sessions: ReadonlySet<LeaseSession>,
    private readonly log: (line: string) => void,
    /**
     * While the control plane waits for the nodes connected before its start (rejoin.ts): resolves
     * when it stops waiting. Null: not waiting. No want is answered and no share granted until then.
     */
    private readonly rejoining: () => Promise<void> | null = () => null,
  ) {
    this.moneyPools = new MoneyPools(state.snapshots, () => state.now());
  }

  /**
   * A minute pool's limits (docs/leases.md#minute-pools-by-id): a key's rpm and tpm, or a pooled
   * model's deployment's (the upstream account's own; 0: none). Undefined: no such key or deployment.
   */
  private minuteLimitsOf(poolId: string): KeyLimitsForLease | undefined {
    const d = deploymentOfPool(poolId);
    if (!d) {
      const e = this.state.snapshots.keyById(poolId);
      return e && { rpm: e.rpmLimit, tpm: e.tpmLimit };
    }
    const config = this.state.config;
    if (this.deploymentLimits?.config !== config) {
      const byPool = new Map<string, KeyLimitsForLease>();
      for (const m of config.models) for (const x of m.deployments) byPool.set(deploymentPoolId(m.id, x.id), { rpm: x.rpm, tpm: Number(x.tpm) });
      this.deploymentLimits = { config, byPool };
    }
    return this.deploymentLimits.byPool.get(poolId);
  }

  /** A closed connection's leases are released; what it did not say it used is free again. */
  dropConnection(s: LeaseSession): void {
    this.moneyLeases.dropConnection(s.connId);
    this.slotLeases.dropConnection(s.connId);
    // What the node did not say it used is free again (before any waiting grant goes on).
    const freed = this.keyLeases.release(s.connId);
    if (freed.length > 0) this.announceFree(freed, s.connId);
  }

  /** Returns first (a reclaim's answer, or allowance given back unasked), then what is wanted. */
  onLeaseRequest(s: LeaseSession, req: LeaseRequest): void {
    if (req.leaseEpoch) s.leaseEpoch = req.leaseEpoch;
    if (req.leaving) s.leaving = true;
    for (const r of req.keyReturns) {
      for (const c of this.keyLeases.applyReturn(s.connId, r)) this.reclaimUnasked(c, [{ keyId: r.keyId, minute: r.minute }], []);
    }
    // Budget given back: the other nodes in those pools learn it is free again (a node told the
    // minute was spent may be served again, and its rate headers go back up).
    const grown = req.keyReturns.filter((r) => r.requests > 0 || r.tokens > 0).map((r) => ({ keyId: r.keyId, minute: r.minute }));
    if (grown.length > 0) this.announceFree(grown, s.connId);
    // Money given back to a reclaim still awaited is kept for the want it was made for.
    const forConn = req.reclaimId && s.reclaims.has(req.reclaimId) ? this.moneyReclaimFor.get(req.reclaimId) : undefined;
    for (const r of req.orgReturns) this.moneyLeases.giveBack(s.connId, r.orgId, r.micros, r.debtMicros, forConn);
    for (const u of req.used) this.keyLeases.recordUsed(s.connId, u);
    for (const t of req.taken) this.keyLeases.applyTaken(s.connId, t);
    // A node that stops gave back what it used of what it touched: its untouched shares are free.
    if (req.leaving) this.keyLeases.leave(s.connId);
    if (req.bulkMinute || req.wantSlotShare) this.grantShares(s, req.bulkMinute, req.wantSlotShare);
    if (req.wantOrgSlices) this.grantOrgSlices(s).catch((err: Error) => this.log(`sync: money slices of node ${s.nodeId} failed: ${err.message}`));
    for (const r of req.slotReturns) for (const c of this.slotLeases.applyHeld(s.connId, r)) this.reclaimUnasked(c, [], [r.keyId]);
    if (req.usedSeq) s.enqueue({ leaseGrant: { keys: [], orgs: [], pools: [], usedAck: req.usedSeq, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
    if (req.reclaimId) {
      if (req.reclaimId === s.wholeReclaimId) s.mayHoldWhole = false;
      const done = s.reclaims.get(req.reclaimId);
      s.reclaims.delete(req.reclaimId);
      done?.();
    }
    // Every want is answered, even when answering failed, so no node waits on a want never granted.
    if (req.keys.length > 0 || req.slotWants.length > 0) {
      this.grantLeases(s, req).catch((err: Error) => {
        this.log(`sync: lease request of node ${s.nodeId} failed: ${err.message}`);
        const keys = req.keys.map((w) => ({ keyId: w.keyId, minute: w.minute, requests: 0, tokens: 0, finalRequests: false, finalTokens: false, freeRequests: 0, freeTokens: 0 }));
        const slots = req.slotWants.map((w) => ({ keyId: w.keyId, slots: 0, final: false }));
        s.enqueue({ leaseGrant: { keys, orgs: [], pools: [], usedAck: 0, slots, bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
      });
    }
    // Money is answered apart: its reclaims wait longer (MONEY_RECLAIM_TIMEOUT_MS).
    if (req.orgs.length > 0) {
      this.grantMoney(s, req.orgs).catch((err: Error) => {
        this.log(`sync: money lease of node ${s.nodeId} failed: ${err.message}`);
        const orgs = req.orgs.map((w) => ({ orgId: w.orgId, micros: 0, exhausted: false }));
        s.enqueue({ leaseGrant: { keys: [], orgs, pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
      });
    }
  }

  /**
   * Standing shares of every key (docs/leases.md): of the budgets of `minute` (0: not asked) and of
   * the parallel slots. Only with several nodes; after any node that was alone said what it holds.
   */
  private grantShares(s: LeaseSession, minute: number, slots: boolean): void {
    const rejoining = this.rejoining();
    if (rejoining) {
      void rejoining.then(() => {
        if (!s.closed) this.grantShares(s, minute, slots);
      });
      return;
    }
    const whole = [...this.sessions].filter((x) => x.mayHoldWhole).map((x) => x.wholeReclaim);
    const answer = () => {
      if (s.closed) return;
      const nodes = this.sessions.size;
      const several = nodes >= 2 && !s.leaving;
      let bulk;
      if (minute) {
        const exceptions = several ? this.keyLeases.grantBulk(s.connId, minute, nodes) : null;
        bulk = { minute, granted: exceptions !== null, nodes, exceptions: exceptions ?? [] };
      }
      let slotShare;
      if (slots) {
        const exceptions = several ? this.slotLeases.grantShare(s.connId, nodes) : null;
        slotShare = { granted: exceptions !== null, nodes, exceptions: exceptions ?? [] };
      }
      s.enqueue({ leaseGrant: { keys: [], orgs: [], pools: [], usedAck: 0, slots: [], bulk, slotShare, reclaiming: false, orgSlices: false } });
    };
    if (whole.length > 0 && this.sessions.size >= 2) {
      tellWaiting(s);
      void Promise.all(whole).then(answer);
    }
    else answer();
  }

  /**
   * A money slice of every organisation with money left, in one database job (so no usage report
   * commits between reading what is spendable and recording the slice), once per connection: an
   * organisation's first requests on the node do not wait (docs/leases.md). Each slice is a share for
   * at least two nodes, even for a node alone: nodes of a cluster connect one after the other, and a
   * first node given everything left the next ones nothing, so each organisation's first request on
   * them waited for a reclaim, and the first node then asked back for what it gave (issue 19: 17% of
   * requests waited for money in the first 20 s of three nodes with 500 organisations). A lone node
   * takes the rest with its first refill (the whole of what is free).
   */
  private async grantOrgSlices(s: LeaseSession): Promise<void> {
    const whole = [...this.sessions].filter((x) => x.mayHoldWhole).map((x) => x.wholeReclaim);
    if (whole.length > 0) await Promise.all(whole);
    if (s.closed || s.leaving) return;
    const orgs = await this.state.db.read(async (q) => {
      const out: OrgLease[] = [];
      // One statement for every organisation, inside one database job: no report commits between
      // reading what is spendable and recording the slices.
      const spendableOf = await this.state.spendableMany(q, this.state.snapshots.orgIds(), { committed: true });
      for (const [orgId, spendable] of spendableOf) {
        if (s.closed || spendable <= 0) continue;
        // No reclaim: an organisation whose money is all leased elsewhere is asked for when used.
        const nodes = Math.max(2, this.sessions.size);
        const r = this.moneyLeases.grant(s.connId, orgId, spendable, nodes, { micros: 0, ahead: true }, true);
        if (r.kind === 'grant' && r.micros > 0) out.push({ orgId, micros: r.micros, exhausted: false, advanceMicros: this.moneyLeases.advanceFor(s.connId, orgId, spendable, nodes) });
      }
      return out;
    });
    s.enqueue({ leaseGrant: { keys: [], orgs, pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: true } });
  }

  /** Asks a node for standing shares back without waiting for its answer (a pool went past its limit). */
  private reclaimUnasked(connId: string, keys: KeyMinuteRef[], slotKeyIds: string[]): void {
    const target = this.sessionByConn(connId);
    if (target) void this.reclaim(target, keys, [], false, RECLAIM_TIMEOUT_MS, slotKeyIds).done;
  }

  /** Asks a node to give back unused allowance; resolves when it answered, left, or after `timeoutMs`. */
  private reclaim(target: LeaseSession, keys: KeyMinuteRef[], orgIds: string[], allKeys: boolean, timeoutMs: number, slotKeyIds: string[] = []): { id: number; done: Promise<void> } {
    const id = ++reclaimIds;
    const done = new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        target.reclaims.delete(id);
        resolve();
      }, timeoutMs);
      target.reclaims.set(id, () => {
        clearTimeout(timer);
        resolve();
      });
    });
    target.enqueue({ leaseReclaim: { id, keys, allKeys, orgIds, slotKeyIds } });
    if (target.closed) target.reclaims.get(id)?.();
    return { id, done };
  }

  /** A former lone node is asked what it holds of every key minute before others lease them. */
  reclaimWhole(target: LeaseSession): void {
    const r = this.reclaim(target, [], [], true, WHOLE_RECLAIM_TIMEOUT_MS);
    target.wholeReclaimId = r.id;
    target.wholeReclaim = r.done.then(() => {
      // Unanswered in time: treat it as holding only what it said (a stuck node must not block all).
      if (target.wholeReclaimId === r.id) target.mayHoldWhole = false;
    });
  }

  /**
   * Answers a LeaseRequest's key and slot wants with one LeaseGrant (docs/leases.md); its money
   * wants are answered by grantMoney. Key slices come from in-memory minute pools. What does not fit
   * is answered only after the nodes holding unused allowance were asked to give it back (bounded by
   * RECLAIM_TIMEOUT_MS): a shortfall after that is final.
   */
  private async grantLeases(s: LeaseSession, req: LeaseRequest): Promise<void> {
    // What a node not yet back holds is unknown: the answer waits for it (the roster told every node
    // so, Roster.rejoining, and their requests wait meanwhile).
    const rejoining = this.rejoining();
    if (rejoining) await rejoining;
    const keys: KeyLease[] = [];
    const keyReclaims = new Map<string, KeyMinuteRef[]>();
    let waitWhole = false;
    const suspects = [...this.sessions].filter((x) => x !== s && x.mayHoldWhole).map((x) => x.connId);
    const laterKeys: KeyLeaseWant[] = [];
    for (const w of req.keys) {
      const r = this.grantKey(s, w, suspects, false);
      if (r === null) continue;
      if ('from' in r) {
        laterKeys.push(w);
        for (const c of r.from) {
          if (suspects.includes(c)) waitWhole = true;
          else push(keyReclaims, c, { keyId: w.keyId, minute: w.minute });
        }
      } else keys.push(r);
    }
    const slots: SlotLease[] = [];
    const slotReclaims = new Map<string, string[]>();
    const laterSlots: SlotWant[] = [];
    for (const w of req.slotWants) {
      const r = this.grantSlots(s, w, suspects, false);
      if ('from' in r) {
        laterSlots.push(w);
        for (const c of r.from) {
          if (suspects.includes(c)) waitWhole = true;
          else push(slotReclaims, c, w.keyId);
        }
      } else slots.push(r);
    }
    if (laterKeys.length > 0 || laterSlots.length > 0) {
      // The node is told its answer waits for reclaims, so it does not take it as late.
      tellWaiting(s);
      const waits: Promise<void>[] = [];
      if (waitWhole) for (const x of this.sessions) if (x !== s && x.mayHoldWhole) waits.push(x.wholeReclaim);
      for (const target of this.sessions) {
        if (target === s) continue;
        const k = keyReclaims.get(target.connId) ?? [];
        const sl = slotReclaims.get(target.connId) ?? [];
        if (k.length > 0 || sl.length > 0) waits.push(this.reclaim(target, k, [], false, RECLAIM_TIMEOUT_MS, sl).done);
      }
      await Promise.all(waits);
      for (const w of laterSlots) {
        const r = this.grantSlots(s, w, [], true);
        if (!('from' in r)) slots.push(r);
      }
      for (const w of laterKeys) {
        const r = this.grantKey(s, w, [], true);
        if (r && !('from' in r)) keys.push(r);
      }
    }
    countLeaseAnswers(keys, []);
    s.enqueue({ leaseGrant: { keys, orgs: [], pools: [], usedAck: 0, slots, bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
    // The other nodes holding part of a pool that shrank learn what it has left (rate headers).
    this.announceFree(keys.filter((g) => g.requests > 0 || g.tokens > 0), s.connId);
  }

  /** Tells every other node registered in these pools what each has left unleased, and what the others used. */
  private announceFree(pools: Array<{ keyId: string; minute: number }>, exceptConn: string): void {
    const updates = new Map<LeaseSession, KeyPoolFree[]>();
    for (const p of pools) {
      const limits = this.minuteLimitsOf(p.keyId);
      if (!limits) continue;
      const free = this.keyLeases.freeOf(p.keyId, p.minute, limits);
      for (const c of this.keyLeases.members(p.keyId, p.minute, exceptConn)) {
        const target = this.sessionByConn(c);
        if (!target) continue;
        const list = updates.get(target) ?? [];
        const used = this.keyLeases.othersUsedOf(p.keyId, p.minute, c);
        list.push({ keyId: p.keyId, minute: p.minute, freeRequests: free.requests, freeTokens: free.tokens, othersUsedRequests: used.requests, othersUsedTokens: used.tokens });
        updates.set(target, list);
      }
    }
    for (const [target, list] of updates) target.enqueue({ leaseGrant: { keys: [], orgs: [], pools: list, usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
  }

  private sessionByConn(connId: string): LeaseSession | undefined {
    for (const x of this.sessions) if (x.connId === connId) return x;
    return undefined;
  }

  /**
   * Answers a request's money wants with one LeaseGrant (docs/money-limits.md#exact-across-nodes).
   * A want a request waits for, when less than it needs is free, first has the other nodes holding
   * money give back what they hold unused (bounded by MONEY_RECLAIM_TIMEOUT_MS); what is left after
   * that is granted with "exhausted". Wants made ahead of need take only what is free.
   */
  private async grantMoney(s: LeaseSession, wants: OrgLeaseWant[]): Promise<void> {
    const orgs: OrgLease[] = [];
    const later: OrgLeaseWant[] = [];
    const reclaims = new Map<string, string[]>();
    for (const [w, r] of await this.grantOrgs(s, wants, false)) {
      if ('from' in r) {
        later.push(w);
        for (const c of r.from) push(reclaims, c, w.orgId);
      } else orgs.push(r);
    }
    if (later.length > 0) {
      // The node is told its answer waits for reclaims, so it does not take it as late.
      tellWaiting(s);
      const waits: Promise<void>[] = [];
      const ids: number[] = [];
      for (const target of this.sessions) {
        const o = target === s ? undefined : reclaims.get(target.connId);
        if (!o) continue;
        const r = this.reclaim(target, [], o, false, MONEY_RECLAIM_TIMEOUT_MS);
        this.moneyReclaimFor.set(r.id, s.connId);
        ids.push(r.id);
        waits.push(r.done);
      }
      await Promise.all(waits);
      for (const id of ids) this.moneyReclaimFor.delete(id);
      for (const [, r] of await this.grantOrgs(s, later, true)) if (!('from' in r)) orgs.push(r);
    }
    countLeaseAnswers([], orgs);
    s.enqueue({ leaseGrant: { keys: [], orgs, pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
  }

  private grantKey(s: LeaseSession, w: KeyLeaseWant, suspects: string[], afterReclaim: boolean): KeyLease | { from: string[] } | null {
    const limits = this.minuteLimitsOf(w.keyId);
    const none = { keyId: w.keyId, minute: w.minute, requests: 0, tokens: 0, finalRequests: false, finalTokens: false, freeRequests: 0, freeTokens: 0 };
    if (!limits || s.closed || s.leaving) return none;
    const r = this.keyLeases.grant(s.connId, w, limits, suspects, afterReclaim);
    if (r.kind === 'reclaim') return { from: r.from };
    return { keyId: w.keyId, minute: w.minute, ...r.grant };
  }

  private grantSlots(s: LeaseSession, w: SlotWant, suspects: string[], afterReclaim: boolean): SlotLease | { from: string[] } {
    const entry = this.state.snapshots.keyById(w.keyId);
    if (!entry || s.closed || s.leaving) return { keyId: w.keyId, slots: 0, final: false };
    const r = this.slotLeases.grant(s.connId, w, entry.maxParallelRequests, suspects, afterReclaim);
    if (r.kind === 'reclaim') return { from: r.from };
    return { keyId: w.keyId, slots: r.slots, final: r.final };
  }

  private async grantOrgs(s: LeaseSession, wants: OrgLeaseWant[], afterReclaim: boolean): Promise<Array<[OrgLeaseWant, OrgLease | { from: string[] }]>> {
    const nodes = this.sessions.size;
    // Projects' and keys' pools (docs/money-limits.md) are decided from memory too, in the same step.
    const { orgIds, poolIds } = partitionPools(wants.map((w) => w.orgId));
    const decide = (orgSpendable: Map<string, number>) => {
      const spendableOf = poolIds.length > 0 ? new Map([...orgSpendable, ...(this.moneyPools.spendableFromMemory(poolIds) ?? [])]) : orgSpendable;
      return wants.map((w): [OrgLeaseWant, OrgLease | { from: string[] }] => {
        if (s.closed || s.leaving) return [w, { orgId: w.orgId, micros: 0, exhausted: false }];
        // A pool not known now (its limit just changed) is not said to be spent: asked again later.
        if (!spendableOf.has(w.orgId) && poolIds.includes(w.orgId)) return [w, { orgId: w.orgId, micros: 0, exhausted: false }];
        const spendable = spendableOf.get(w.orgId) ?? 0;
        const r = this.moneyLeases.grant(s.connId, w.orgId, spendable, nodes, w, afterReclaim);
        if (r.kind === 'reclaim') return [w, { from: r.from }];
        // With what the node may take in advance of its next answer, should that be late.
        return [w, { orgId: w.orgId, micros: r.micros, exhausted: r.exhausted, advanceMicros: this.moneyLeases.advanceFor(s.connId, w.orgId, spendable, nodes) }];
      });
    };
    // Usually every organisation's committed money is in memory: decided and recorded in one
    // synchronous step, so no report commits in between, and no statement is run.
    const known = this.state.spendableFromMemory(orgIds);
    if (known && this.moneyPools.spendableFromMemory(poolIds)) return decide(known);
    try {
      // Else inside one serialised database job (one statement for all of them), for the same reason.
      return await this.state.db.read(async (q) => {
        await this.moneyPools.load(q, poolIds);
        return decide(orgIds.length > 0 ? await this.state.spendableMany(q, orgIds, { committed: true }) : new Map());
      });
    } catch (err) {
      this.log(`sync: money lease of node ${s.nodeId} failed: ${(err as Error).message}`);
      // Not exhausted: the node asks again after its back-off.
      return wants.map((w) => [w, { orgId: w.orgId, micros: 0, exhausted: false }]);
    }
  }
}

function push<T>(m: Map<string, T[]>, k: string, v: T): void {
  const list = m.get(k);
  if (list) list.push(v);
  else m.set(k, [v]);
}
