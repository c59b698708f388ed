// Translates the snapshot store onto the SyncService.Connect stream (see proto/tollgate/v1/sync.proto).
// Per node session: Hello (token and pepper checked) → snapshot, one catch-up delta, or nothing → a
// delta per new version. Acks are tracked for revocation; reports are ingested in order and acked
// once committed. Writes respect backpressure: when write() returns false we wait for 'drain', and a
// node that falls far behind gets one fresh snapshot instead of an unbounded queue of deltas.
import { status, type ServerDuplexStream } from '@grpc/grpc-js';
import { secretsEqual } from '../../proto/lib/keys.js';
import type { ControlMessage, Delta, Hello, KeyLease, KeyLeaseWant, KeyMinuteRef, KeyPoolFree, LeaseRequest, NodeMessage, OrgLease, OrgLeaseWant, Report, SlotLease, SlotWant, SyncServiceServer } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../control-state.js';
import type { NodeFleet } from '../console/console-service.js';
import { touchNode, upsertNode } from '../store/sync-repo.js';
import type { ReportIngest } from './report-ingest.js';
import type { StoredResponsesFanout } from './stored-responses.js';
import { KeyLeaseLedger, MoneyLeaseLedger, SlotLedger } from './lease-ledger.js';
import { MoneyPools, partitionPools } from './money-pools.js';
import { queryUsageHandler } from './usage-query.js';
import { countIngest, countLeaseAnswers } from '../metrics.js';
import { countInbound, countOutbound } from './sync-traffic.js';

const MAX_QUEUED = 1000;
/**
 * Ingest backpressure: a node's stream is paused (no more messages read from it, so HTTP/2 flow
 * control holds the node back) while this many of its reports wait, or while all nodes together have
 * MAX_PENDING_REPORTS waiting; it is resumed as they are written. Memory for reports is bounded by
 * these counts (and by each node's window of unacknowledged reports), not by how much nodes replay.
 */
const MAX_QUEUED_REPORTS_PER_NODE = 2;
const MAX_PENDING_REPORTS = 64;
/** How long a lease answer waits for the nodes asked to give back unused allowance. */
const RECLAIM_TIMEOUT_MS = 150;
/** How long a former lone node has to say what it holds before others are leased its key minutes. */
const WHOLE_RECLAIM_TIMEOUT_MS = 1000;
/** A node left alone holds whole key budgets at once only if no other node was connected this long. */
const LONE_QUIET_MS = 90_000;
export const PEPPER_MISMATCH_DETAILS = "pepper mismatch: the node's key pepper differs from the control plane's";

type Outbound = ControlMessage | 'snapshot';
type Call = ServerDuplexStream<NodeMessage, ControlMessage>;

interface AckWaiter {
  version: number;
  resolve: (confirmed: boolean) => void;
}

class NodeSession {
  readonly queue: Outbound[] = [];
  lastSentVersion = 0;
  ackedVersion = 0;
  lastSeenAt: string;
  writing = false;
  closed = false;
  unsubscribe: () => void = () => undefined;
  readonly waiters = new Set<AckWaiter>();
  /** Reports read from the stream and not yet written, oldest first (written one at a time, in order). */
  /** Messages of reports waiting to be written, each one or more consecutive reports of one instance. */
  readonly reports: Report[][] = [];
  ingesting = false;
  /** The stream is paused for ingest backpressure. */
  paused = false;
  /** The bytes of the node's journal and the log rows it dropped, as it last said (beside journalDepth). */
  journalBytes = 0;
  droppedLogRows = 0;
  /** Identifies this connection in the lease ledgers (slices belong to a connection). */
  readonly connId: string;
  /** Reclaims sent to this node and not yet answered, by id. */
  readonly reclaims = new Map<number, () => void>();
  /**
   * The node was (or is) the only one connected, so it may hold whole key budgets it never asked
   * for; set until it answers the all-keys reclaim sent when another node joins.
   */
  mayHoldWhole = false;
  /** The node's lease epoch on this connection (from its lease requests). */
  leaseEpoch = 0;
  /** The node said it is stopping: it is granted nothing more. */
  leaving = false;
  wholeReclaimId = 0;
  wholeReclaim: Promise<void> = Promise.resolve();
  /** When the node's last usage report arrived on this connection. */
  lastReportAt = '';
  /** Usage the node holds unacknowledged, as its last NodeStatus said; null before it said. */
  journalDepth: number | null = null;

  constructor(
    readonly call: Call,
    readonly nodeId: string,
    readonly instanceId: string,
    readonly address: string,
    readonly connectedAt: string,
  ) {
    this.lastSeenAt = connectedAt;
    this.connId = `${instanceId}#${++connections}`;
  }
}

let connections = 0;
let reclaimIds = 0;

export interface SyncServiceOptions {
  nodeToken: string;
  /** pepperCheck(pepper) of this control plane. */
  pepperCheck: string;
  log?: (line: string) => void;
  /** A node's stream ended (not at shutdown): webhooks. */
  onNodeDisconnected?: (node: { id: string; address: string; connectedAt: string; lastSeenAt: string }) => void;
  /** Stored responses of the Responses API, sent to every node (stored-responses.ts). */
  storedResponses?: StoredResponsesFanout;
}

export class SyncService implements NodeFleet {
  private readonly sessions = new Set<NodeSession>();
  private readonly keyLeases = new KeyLeaseLedger((keyId) => {
    const e = this.state.snapshots.keyById(keyId);
    return e && { rpm: e.rpmLimit, tpm: e.tpmLimit };
  });
  private readonly slotLeases = new SlotLedger((keyId) => this.state.snapshots.keyById(keyId)?.maxParallelRequests);
  private readonly moneyLeases = new MoneyLeaseLedger();
  /** Projects' caps and keys' own limits, leased by pool id through moneyLeases (docs/money-limits.md). */
  readonly moneyPools: MoneyPools;
  private readonly log: (line: string) => void;
  /** When several nodes were last connected (wall clock). */
  private lastSeveralAtMs = -Infinity;
  /** Reports waiting to be written, over all nodes. */
  private pendingReports = 0;
  /** Set by closeAll: nodes leaving at shutdown are not reported as disconnected. */
  private closing = false;

  constructor(
    private readonly state: ControlState,
    private readonly ingest: ReportIngest,
    private readonly opts: SyncServiceOptions,
  ) {
    this.log = opts.log ?? ((l) => console.log(l));
    this.moneyPools = new MoneyPools(state.snapshots, () => state.now());
  }

  handlers(): SyncServiceServer {
    return { connect: (call) => this.connect(call), queryUsage: queryUsageHandler(this.state, this.opts.nodeToken, this.log) };
  }

  connectedCount(): number {
    return this.sessions.size;
  }

  liveNodes() {
    return [...this.sessions].map((s) => ({
      id: s.nodeId,
      address: s.address,
      ackedVersion: s.ackedVersion,
      connectedAt: s.connectedAt,
      lastSeenAt: s.lastSeenAt,
      lastReportAt: s.lastReportAt,
      journalDepth: s.journalDepth,
      journalBytes: s.journalBytes,
      droppedLogRows: s.droppedLogRows,
    }));
  }

  /** Reports read from node streams and not yet written (for benchmarks and monitoring). */
  get ingestBacklog(): number {
    return this.pendingReports;
  }

  awaitAcks(version: number, timeoutMs: number): Promise<{ total: number; confirmed: number; unconfirmed: string[] }> {
    const sessions = [...this.sessions];
    return Promise.all(sessions.map((s) => this.waitAck(s, version, timeoutMs))).then((r) => ({
      total: sessions.length,
      confirmed: r.filter(Boolean).length,
      unconfirmed: sessions.filter((_, i) => !r[i]).map((s) => s.nodeId),
    }));
  }

  /** Ends every stream (at shutdown) so the server can stop. */
  closeAll(): void {
    this.closing = true;
    for (const s of [...this.sessions]) {
      this.drop(s);
      s.call.end();
    }
  }

  private waitAck(s: NodeSession, version: number, timeoutMs: number): Promise<boolean> {
    if (s.ackedVersion >= version) return Promise.resolve(true);
    if (s.closed) return Promise.resolve(false);
    return new Promise((resolve) => {
      const waiter: AckWaiter = {
        version,
        resolve: (ok) => {
          clearTimeout(timer);
          s.waiters.delete(waiter);
          resolve(ok);
        },
      };
      const timer = setTimeout(() => waiter.resolve(false), timeoutMs);
      s.waiters.add(waiter);
    });
  }

  private connect(call: Call): void {
    const header = call.metadata.get('authorization')[0];
    const m = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m || !secretsEqual(m[1], this.opts.nodeToken)) {
      this.fail(call, status.UNAUTHENTICATED, 'missing or invalid node token');
      return;
    }
    // A paused stream would still read ahead up to its highWaterMark (16 messages in object mode;
    // grpc-js takes no option for it): one message read ahead keeps a paused node's reports in memory
    // bounded by two reports, the rest held back by HTTP/2 flow control on the node.
    const readable = (call as unknown as { _readableState?: { highWaterMark: number } })._readableState;
    if (readable && typeof readable.highWaterMark === 'number') readable.highWaterMark = 1;
    let session: NodeSession | null = null;
    let failed = false;
    const endCall = () => {
      if (session) this.drop(session);
    };
    call.on('data', (msg: NodeMessage) => {
      countInbound(msg);
      if (failed) return;
      try {
        if (!session) {
          if (!msg.hello) {
            failed = true;
            this.fail(call, status.FAILED_PRECONDITION, 'the first message must be hello');
            return;
          }
          session = this.hello(call, msg.hello);
          if (!session) failed = true;
          return;
        }
        this.onMessage(session, msg);
      } catch (err) {
        failed = true;
        this.log(`sync: internal error: ${(err as Error).message}`);
        if (session) this.drop(session);
        this.fail(call, status.INTERNAL, 'internal error');
      }
    });
    call.on('end', () => {
      endCall();
      if (!failed) call.end();
    });
    call.on('cancelled', endCall);
    call.on('close', endCall);
    call.on('error', endCall);
  }

  private fail(call: Call, code: status, details: string): void {
    call.emit('error', { code, details });
  }

  private hello(call: Call, hello: Hello): NodeSession | null {
    if (!secretsEqual(hello.pepperCheck, this.opts.pepperCheck)) {
      this.log(`sync: refused node ${JSON.stringify(hello.nodeId)}: pepper mismatch`);
      this.fail(call, status.FAILED_PRECONDITION, PEPPER_MISMATCH_DETAILS);
      return null;
    }
    const nodeId = hello.nodeId.trim() || `node-${hello.instanceId.slice(0, 8) || 'unnamed'}`;
    // Two processes under one node id would share a row in `nodes list` and hide each other's acks.
    // The same process reconnecting (same instance id) replaces its old stream.
    for (const other of this.sessions) {
      if (other.nodeId !== nodeId) continue;
      if (other.instanceId === hello.instanceId) {
        this.drop(other);
        other.call.end();
        continue;
      }
      this.log(`sync: refused node ${JSON.stringify(nodeId)} from ${hello.listenAddress || 'an unknown address'}: that node id is already connected from ${other.address}`);
      this.fail(call, status.ALREADY_EXISTS, `node id ${JSON.stringify(nodeId)} is already connected from ${other.address}; give every node its own --node-id`);
      return null;
    }
    const now = this.state.nowIso();
    const s = new NodeSession(call, nodeId, hello.instanceId, hello.listenAddress, now);
    const store = this.state.snapshots;
    // Catch-up and subscription in one synchronous step: no version can slip in between.
    const first = store.catchUp(hello.haveVersion);
    s.unsubscribe = store.subscribe((delta) => this.enqueue(s, { delta }));
    this.sessions.add(s);
    const detachResponses = this.opts.storedResponses?.attach((responses) => this.enqueue(s, { storedResponses: { responses } }), hello.storedResponsesSeq ?? 0);
    if (detachResponses) {
      const unsubscribe = s.unsubscribe;
      s.unsubscribe = () => {
        unsubscribe();
        detachResponses();
      };
    }
    if (first.kind === 'snapshot') this.enqueue(s, 'snapshot');
    else {
      s.lastSentVersion = hello.haveVersion;
      if (first.kind === 'delta') this.enqueue(s, { delta: first.delta });
    }
    // The node stays stale until it holds this version (its catch-up is applied), not merely until
    // the stream is accepted.
    this.enqueue(s, { caughtUp: { version: store.version } });
    this.broadcastRoster();
    if (this.sessions.size === 1) s.mayHoldWhole = true;
    else for (const other of this.sessions) if (other !== s && other.mayHoldWhole) this.reclaimWhole(other);
    this.log(`sync: node ${nodeId} connected (have ${hello.haveVersion}, current ${store.version}, ${first.kind})`);
    this.persist(() => upsertNode(this.state.db, { id: nodeId, address: hello.listenAddress, connected_at: now, last_seen_at: now, acked_version: hello.haveVersion }));
    return s;
  }

  private onMessage(s: NodeSession, msg: NodeMessage): void {
    s.lastSeenAt = this.state.nowIso();
    if (msg.ack) {
      const v = msg.ack.version;
      if (v > s.ackedVersion) s.ackedVersion = v;
      for (const w of [...s.waiters]) if (w.version <= s.ackedVersion) w.resolve(true);
      this.persist(() => touchNode(this.state.db, s.nodeId, s.lastSeenAt, s.ackedVersion));
    } else if (msg.resync) {
      this.log(`sync: node ${s.nodeId} asked for a resync at ${msg.resync.haveVersion}: ${msg.resync.reason || 'no reason given'}`);
      this.enqueue(s, 'snapshot');
    } else if (msg.report) {
      s.lastReportAt = s.lastSeenAt;
      this.queueReport(s, [msg.report]);
    } else if (msg.reports) {
      s.lastReportAt = s.lastSeenAt;
      // Consecutive reports of one instance are one unit (a node replaying its journal may send its
      // former instance's last reports and its own first ones together).
      let unit: Report[] = [];
      for (const r of msg.reports.reports) {
        if (unit.length > 0 && r.instanceId !== unit[0].instanceId) {
          this.queueReport(s, unit);
          unit = [];
        }
        unit.push(r);
      }
      if (unit.length > 0) this.queueReport(s, unit);
    } else if (msg.leaseRequest) {
      this.onLeaseRequest(s, msg.leaseRequest);
    } else if (msg.status) {
      s.journalDepth = Math.max(0, msg.status.journalDepth);
      s.journalBytes = Math.max(0, msg.status.journalBytes);
      s.droppedLogRows = Math.max(0, msg.status.droppedLogRows);
    }
  }

  /** Queues a report for writing; pauses the node's stream while its ingest is behind. */
  private queueReport(s: NodeSession, reports: Report[]): void {
    s.reports.push(reports);
    this.pendingReports++;
    if (!s.paused && (s.reports.length >= MAX_QUEUED_REPORTS_PER_NODE || this.pendingReports >= MAX_PENDING_REPORTS)) {
      s.paused = true;
      s.call.pause();
    }
    void this.ingestNext(s);
  }

  /** Writes a node's queued reports one at a time, in order (a cursor must never pass a report that failed). */
  private async ingestNext(s: NodeSession): Promise<void> {
    if (s.ingesting) return;
    s.ingesting = true;
    try {
      while (s.reports.length > 0 && !s.closed) {
        const unit = s.reports[0];
        try {
          // A cost counts against this connection's slice only if it was reserved from it.
          const written = await this.ingest.ingestMany(
            { nodeId: s.nodeId, instanceId: s.instanceId },
            unit,
            (orgId, cost, epoch) => {
              if (epoch !== 0 && epoch === s.leaseEpoch) this.moneyLeases.consume(s.connId, orgId, cost);
            },
            (costs) => this.moneyPools.charge(this.moneyLeases, s.connId, s.leaseEpoch, costs),
          );
          countIngest(written);
        } catch (err) {
          this.log(`sync: reports ${unit[0].seq}..${unit[unit.length - 1].seq} from node ${s.nodeId} not written: ${(err as Error).message}`);
          this.drop(s);
          this.fail(s.call, status.UNAVAILABLE, 'report not written; reconnect and resend');
          return;
        }
        if (s.closed) return;
        s.reports.shift();
        this.pendingReports--;
        // Reports written together are acknowledged in one message (docs/scale.md).
        if (unit.length === 1) this.enqueue(s, { reportAck: { seq: unit[0].seq, instanceId: unit[0].instanceId } });
        else this.enqueue(s, { reportAcks: { acks: unit.map((r) => ({ seq: r.seq, instanceId: r.instanceId })) } });
        this.resumeReaders();
      }
    } finally {
      s.ingesting = false;
    }
  }

  /** Resumes paused streams whose node has room again, while the total has room. */
  private resumeReaders(): void {
    for (const x of this.sessions) {
      if (this.pendingReports >= MAX_PENDING_REPORTS) return;
      if (x.paused && x.reports.length < MAX_QUEUED_REPORTS_PER_NODE) {
        x.paused = false;
        x.call.resume();
      }
    }
  }

  /** Returns first (a reclaim's answer, or allowance given back unasked), then what is wanted. */
  private onLeaseRequest(s: NodeSession, req: LeaseRequest): void {
    if (req.leaseEpoch) s.leaseEpoch = req.leaseEpoch;
    if (req.leaving) s.leaving = true;
    for (const r of req.keyReturns) {
      for (const c of this.keyLeases.applyReturn(s.connId, r)) this.reclaimUnasked(c, [{ keyId: r.keyId, minute: r.minute }], []);
    }
    // Budget given back: the other nodes in those pools learn it is free again (a node told the
    // minute was spent may be served again, and its rate headers go back up).
    const grown = req.keyReturns.filter((r) => r.requests > 0 || r.tokens > 0).map((r) => ({ keyId: r.keyId, minute: r.minute }));
    if (grown.length > 0) this.announceFree(grown, s.connId);
    for (const r of req.orgReturns) this.moneyLeases.giveBack(s.connId, r.orgId, r.micros);
    for (const u of req.used) this.keyLeases.recordUsed(s.connId, u);
    for (const t of req.taken) this.keyLeases.applyTaken(s.connId, t);
    // A node that stops gave back what it used of what it touched: its untouched shares are free.
    if (req.leaving) this.keyLeases.leave(s.connId);
    if (req.bulkMinute || req.wantSlotShare) this.grantShares(s, req.bulkMinute, req.wantSlotShare);
    if (req.wantOrgSlices) this.grantOrgSlices(s).catch((err: Error) => this.log(`sync: money slices of node ${s.nodeId} failed: ${err.message}`));
    for (const r of req.slotReturns) for (const c of this.slotLeases.applyHeld(s.connId, r)) this.reclaimUnasked(c, [], [r.keyId]);
    if (req.usedSeq) this.enqueue(s, { leaseGrant: { keys: [], orgs: [], pools: [], usedAck: req.usedSeq, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
    if (req.reclaimId) {
      if (req.reclaimId === s.wholeReclaimId) s.mayHoldWhole = false;
      const done = s.reclaims.get(req.reclaimId);
      s.reclaims.delete(req.reclaimId);
      done?.();
    }
    if (req.keys.length > 0 || req.orgs.length > 0 || req.slotWants.length > 0) {
      this.grantLeases(s, req).catch((err: Error) => {
        this.log(`sync: lease request of node ${s.nodeId} failed: ${err.message}`);
        // Every want is answered, so no node waits on a want that will never be granted.
        const keys = req.keys.map((w) => ({ keyId: w.keyId, minute: w.minute, requests: 0, tokens: 0, finalRequests: false, finalTokens: false, freeRequests: 0, freeTokens: 0 }));
        const orgs = req.orgs.map((w) => ({ orgId: w.orgId, micros: 0, exhausted: false }));
        const slots = req.slotWants.map((w) => ({ keyId: w.keyId, slots: 0, final: false }));
        this.enqueue(s, { leaseGrant: { keys, orgs, pools: [], usedAck: 0, slots, bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
      });
    }
  }

  /**
   * Standing shares of every key (docs/leases.md): of the budgets of `minute` (0: not asked) and of
   * the parallel slots. Only with several nodes; after any node that was alone said what it holds.
   */
  private grantShares(s: NodeSession, minute: number, slots: boolean): void {
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
      this.enqueue(s, { leaseGrant: { keys: [], orgs: [], pools: [], usedAck: 0, slots: [], bulk, slotShare, reclaiming: false, orgSlices: false } });
    };
    if (whole.length > 0 && this.sessions.size >= 2) {
      this.enqueue(s, { leaseGrant: { keys: [], orgs: [], pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: true, orgSlices: false } });
      void Promise.all(whole).then(answer);
    }
    else answer();
  }

  /**
   * A money slice of every organisation with money left, in one database job (so no usage report
   * commits between reading what is spendable and recording the slice), once per connection: an
   * organisation's first requests on the node do not wait (docs/leases.md). A lone node gets all that
   * is leasable, as with single slices; nodes that join take it back with reclaims when they need it.
   */
  private async grantOrgSlices(s: NodeSession): Promise<void> {
    const whole = [...this.sessions].filter((x) => x.mayHoldWhole).map((x) => x.wholeReclaim);
    if (whole.length > 0) await Promise.all(whole);
    if (s.closed || s.leaving) return;
    const orgs = await this.state.db.read(async (q) => {
      const out: OrgLease[] = [];
      for (const orgId of this.state.snapshots.orgIds()) {
        const spendable = await this.state.spendableMicros(q, orgId);
        if (s.closed || spendable <= 0) continue;
        // No reclaim: an organisation whose money is all leased elsewhere is asked for when used.
        const r = this.moneyLeases.grant(s.connId, orgId, spendable, this.sessions.size, 0, true);
        if (r.kind === 'grant' && r.micros > 0) out.push({ orgId, micros: r.micros, exhausted: false });
      }
      return out;
    });
    this.enqueue(s, { leaseGrant: { keys: [], orgs, pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: true } });
  }

  /** Asks a node for standing shares back without waiting for its answer (a pool went past its limit). */
  private reclaimUnasked(connId: string, keys: KeyMinuteRef[], slotKeyIds: string[]): void {
    const target = this.sessionByConn(connId);
    if (target) void this.reclaim(target, keys, [], false, RECLAIM_TIMEOUT_MS, slotKeyIds).done;
  }

  /** Asks a node to give back unused allowance; resolves when it answered, left, or after `timeoutMs`. */
  private reclaim(target: NodeSession, keys: KeyMinuteRef[], orgIds: string[], allKeys: boolean, timeoutMs: number, slotKeyIds: string[] = []): { id: number; done: Promise<void> } {
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
    this.enqueue(target, { leaseReclaim: { id, keys, allKeys, orgIds, slotKeyIds } });
    if (target.closed) target.reclaims.get(id)?.();
    return { id, done };
  }

  /** A former lone node is asked what it holds of every key minute before others lease them. */
  private reclaimWhole(target: NodeSession): void {
    const r = this.reclaim(target, [], [], true, WHOLE_RECLAIM_TIMEOUT_MS);
    target.wholeReclaimId = r.id;
    target.wholeReclaim = r.done.then(() => {
      // Unanswered in time: treat it as holding only what it said (a stuck node must not block all).
      if (target.wholeReclaimId === r.id) target.mayHoldWhole = false;
    });
  }

  /**
   * Answers a LeaseRequest with one LeaseGrant (docs/design.md#money-and-limits-across-nodes). Key
   * slices come from in-memory minute pools; money slices are computed inside one serialised database
   * job, so no usage report can commit between reading what is spendable and recording the slice.
   * What does not fit is answered only after the nodes holding unused allowance were asked to give
   * it back (bounded by RECLAIM_TIMEOUT_MS): a shortfall after that is final.
   */
  private async grantLeases(s: NodeSession, req: LeaseRequest): Promise<void> {
    const keys: KeyLease[] = [];
    const orgs: OrgLease[] = [];
    const keyReclaims = new Map<string, KeyMinuteRef[]>();
    const orgReclaims = new Map<string, string[]>();
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
    const laterOrgs: OrgLeaseWant[] = [];
    if (req.orgs.length > 0) {
      const first = await this.grantOrgs(s, req.orgs, false);
      for (const [w, r] of first) {
        if ('from' in r) {
          laterOrgs.push(w);
          for (const c of r.from) push(orgReclaims, c, w.orgId);
        } else orgs.push(r);
      }
    }
    if (laterKeys.length > 0 || laterOrgs.length > 0 || laterSlots.length > 0) {
      // The node is told its answer waits for reclaims, so it does not take it as late.
      this.enqueue(s, { leaseGrant: { keys: [], orgs: [], pools: [], usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: true, orgSlices: false } });
      const waits: Promise<void>[] = [];
      if (waitWhole) for (const x of this.sessions) if (x !== s && x.mayHoldWhole) waits.push(x.wholeReclaim);
      for (const target of this.sessions) {
        if (target === s) continue;
        const k = keyReclaims.get(target.connId) ?? [];
        const o = orgReclaims.get(target.connId) ?? [];
        const sl = slotReclaims.get(target.connId) ?? [];
        if (k.length > 0 || o.length > 0 || sl.length > 0) waits.push(this.reclaim(target, k, o, false, RECLAIM_TIMEOUT_MS, sl).done);
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
      if (laterOrgs.length > 0) for (const [, r] of await this.grantOrgs(s, laterOrgs, true)) if (!('from' in r)) orgs.push(r);
    }
    countLeaseAnswers(keys, orgs);
    this.enqueue(s, { leaseGrant: { keys, orgs, pools: [], usedAck: 0, slots, bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
    // The other nodes holding part of a pool that shrank learn what it has left (rate headers).
    this.announceFree(keys.filter((g) => g.requests > 0 || g.tokens > 0), s.connId);
  }

  /** Tells every other node registered in these pools what each has left unleased. */
  private announceFree(pools: Array<{ keyId: string; minute: number }>, exceptConn: string): void {
    const updates = new Map<NodeSession, KeyPoolFree[]>();
    for (const p of pools) {
      const entry = this.state.snapshots.keyById(p.keyId);
      if (!entry) continue;
      const free = this.keyLeases.freeOf(p.keyId, p.minute, { rpm: entry.rpmLimit, tpm: entry.tpmLimit });
      for (const c of this.keyLeases.members(p.keyId, p.minute, exceptConn)) {
        const target = this.sessionByConn(c);
        if (!target) continue;
        const list = updates.get(target) ?? [];
        list.push({ keyId: p.keyId, minute: p.minute, freeRequests: free.requests, freeTokens: free.tokens });
        updates.set(target, list);
      }
    }
    for (const [target, list] of updates) this.enqueue(target, { leaseGrant: { keys: [], orgs: [], pools: list, usedAck: 0, slots: [], bulk: undefined, slotShare: undefined, reclaiming: false, orgSlices: false } });
  }

  private sessionByConn(connId: string): NodeSession | undefined {
    for (const x of this.sessions) if (x.connId === connId) return x;
    return undefined;
  }

  private grantKey(s: NodeSession, w: KeyLeaseWant, suspects: string[], afterReclaim: boolean): KeyLease | { from: string[] } | null {
    const entry = this.state.snapshots.keyById(w.keyId);
    const none = { keyId: w.keyId, minute: w.minute, requests: 0, tokens: 0, finalRequests: false, finalTokens: false, freeRequests: 0, freeTokens: 0 };
    if (!entry || s.closed || s.leaving) return none;
    const r = this.keyLeases.grant(s.connId, w, { rpm: entry.rpmLimit, tpm: entry.tpmLimit }, suspects, afterReclaim);
    if (r.kind === 'reclaim') return { from: r.from };
    return { keyId: w.keyId, minute: w.minute, ...r.grant };
  }

  private grantSlots(s: NodeSession, w: SlotWant, suspects: string[], afterReclaim: boolean): SlotLease | { from: string[] } {
    const entry = this.state.snapshots.keyById(w.keyId);
    if (!entry || s.closed || s.leaving) return { keyId: w.keyId, slots: 0, final: false };
    const r = this.slotLeases.grant(s.connId, w, entry.maxParallelRequests, suspects, afterReclaim);
    if (r.kind === 'reclaim') return { from: r.from };
    return { keyId: w.keyId, slots: r.slots, final: r.final };
  }

  private async grantOrgs(s: NodeSession, wants: OrgLeaseWant[], afterReclaim: boolean): Promise<Array<[OrgLeaseWant, OrgLease | { from: string[] }]>> {
    const nodes = this.sessions.size;
    // Projects' and keys' pools (docs/money-limits.md) are decided from memory too, in the same step.
    const { orgIds, poolIds } = partitionPools(wants.map((w) => w.orgId));
    const decide = (orgSpendable: Map<string, number>) => {
      const spendableOf = poolIds.length > 0 ? new Map([...orgSpendable, ...(this.moneyPools.spendableFromMemory(poolIds) ?? [])]) : orgSpendable;
      return wants.map((w): [OrgLeaseWant, OrgLease | { from: string[] }] => {
        if (s.closed || s.leaving) return [w, { orgId: w.orgId, micros: 0, exhausted: false }];
        // A pool not known now (its limit just changed) is not said to be spent: asked again later.
        if (!spendableOf.has(w.orgId) && poolIds.includes(w.orgId)) return [w, { orgId: w.orgId, micros: 0, exhausted: false }];
        const r = this.moneyLeases.grant(s.connId, w.orgId, spendableOf.get(w.orgId) ?? 0, nodes, w.micros, afterReclaim, w.debtMicros ?? 0);
        return [w, r.kind === 'reclaim' ? { from: r.from } : { orgId: w.orgId, micros: r.micros, exhausted: r.micros === 0 }];
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

  /** Every node learns how many nodes are connected (it sizes each node's cold share of key budgets). */
  private broadcastRoster(): void {
    const connectedNodes = this.sessions.size;
    const now = this.state.now();
    if (connectedNodes > 1) this.lastSeveralAtMs = now;
    // A lone node may hold this minute's whole budgets only if nobody else can have used them.
    const wholeNow = connectedNodes === 1 && now - this.lastSeveralAtMs > LONE_QUIET_MS;
    for (const s of this.sessions) this.enqueue(s, { roster: { connectedNodes, wholeNow } });
  }

  private enqueue(s: NodeSession, item: Outbound): void {
    if (s.closed) return;
    s.queue.push(item);
    if (s.queue.length > MAX_QUEUED) {
      // Too far behind: replace every queued delta by one fresh snapshot taken when it is written.
      const keep = s.queue.filter((q): q is ControlMessage => q !== 'snapshot' && !q.delta);
      s.queue.length = 0;
      s.queue.push('snapshot', ...keep);
    }
    this.pump(s);
  }

  private pump(s: NodeSession): void {
    if (s.writing || s.closed) return;
    while (s.queue.length > 0) {
      const item = s.queue.shift()!;
      let msg: ControlMessage;
      if (item === 'snapshot') {
        const snapshot = this.state.snapshots.snapshot();
        s.lastSentVersion = snapshot.version;
        msg = { snapshot };
      } else if (item.delta) {
        const d: Delta = item.delta;
        if (d.toVersion <= s.lastSentVersion) continue;
        if (d.fromVersion !== s.lastSentVersion) {
          // Cannot happen with in-order queueing; a snapshot is the safe answer if it ever does.
          const snapshot = this.state.snapshots.snapshot();
          s.lastSentVersion = snapshot.version;
          msg = { snapshot };
        } else {
          s.lastSentVersion = d.toVersion;
          msg = item;
        }
      } else msg = item;
      let ok: boolean;
      try {
        countOutbound(msg);
        ok = s.call.write(msg);
      } catch {
        this.drop(s);
        return;
      }
      if (!ok) {
        s.writing = true;
        s.call.once('drain', () => {
          s.writing = false;
          this.pump(s);
        });
        return;
      }
    }
  }

  private drop(s: NodeSession): void {
    if (s.closed) return;
    s.closed = true;
    s.unsubscribe();
    if (this.sessions.size > 1) this.lastSeveralAtMs = this.state.now();
    this.sessions.delete(s);
    this.moneyLeases.dropConnection(s.connId);
    this.slotLeases.dropConnection(s.connId);
    // What the node did not say it used is free again (before any waiting grant goes on).
    const freed = this.keyLeases.release(s.connId);
    if (freed.length > 0) this.announceFree(freed, s.connId);
    for (const done of [...s.reclaims.values()]) done();
    s.reclaims.clear();
    s.queue.length = 0;
    this.pendingReports -= s.reports.length;
    s.reports.length = 0;
    this.resumeReaders();
    for (const w of [...s.waiters]) w.resolve(false);
    this.broadcastRoster();
    // The last node left is alone again: it holds whole key budgets of the minutes it starts.
    if (this.sessions.size === 1) for (const other of this.sessions) other.mayHoldWhole = true;
    this.log(`sync: node ${s.nodeId} disconnected`);
    if (!this.closing) this.opts.onNodeDisconnected?.({ id: s.nodeId, address: s.address, connectedAt: s.connectedAt, lastSeenAt: s.lastSeenAt });
    this.persist(() => touchNode(this.state.db, s.nodeId, this.state.nowIso(), s.ackedVersion));
  }

  private persist(write: () => Promise<unknown>): void {
    write().catch((err: Error) => this.log(`sync: node bookkeeping not written: ${err.message}`));
  }
}

function push<T>(m: Map<string, T[]>, k: string, v: T): void {
  const list = m.get(k);
  if (list) list.push(v);
  else m.set(k, [v]);
}
