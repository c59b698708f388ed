// The sync service (SyncService.Connect, see proto/tollgate/v1/sync.proto): one session per node's
// stream (node-session.ts). Per session: Hello (token and pepper checked) → snapshot, one catch-up
// delta, or nothing → a delta per new version. Acks are tracked for revocation; reports go to the
// report queue (report-queue.ts), written in order and acked once committed; lease requests go to the
// lease service (lease-service.ts).
import { status } from '@grpc/grpc-js';
import { isInstanceId, isNodeId } from '../../proto/lib/node-ids.js';
import { secretsEqual } from '../../proto/lib/keys.js';
import { LeaseRequest, type Hello, type NodeMessage, type Report, type SyncServiceServer } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../state/control-state.js';
import type { NodeFleet } from '../console/console-access.js';
import { connectedNodeIds, nodeDisconnected, nodesGone, touchNode, upsertNode } from '../store/sync-repo.js';
import type { ReportIngest } from './report-ingest.js';
import type { StoredResponsesFanout } from './stored-responses.js';
import { LeaseService } from '../leases/lease-service.js';
import { failCall, NodeSession, type Call, type SessionHost } from './node-session.js';
import type { MoneyPools } from '../leases/money-pools.js';
import { ReportQueue } from './report-queue.js';
import { queryUsageHandler } from './usage-query.js';
import { countInbound } from './sync-traffic.js';
import { PART_ENTRIES } from '../../proto/lib/snapshot-parts.js';
import { Rejoin } from '../leases/rejoin.js';

/** A node left alone holds whole key budgets at once only if no other node was connected this long. */
const LONE_QUIET_MS = 90_000;
export const PEPPER_MISMATCH_DETAILS = "pepper mismatch: the node's key pepper differs from the control plane's";

export interface SyncServiceOptions {
  nodeToken: string;
  /** pepperCheck(pepper) of this control plane. */
  pepperCheck: string;
  log?: (line: string) => void;
  /** A node's stream ended (not at shutdown): webhooks. */
  onNodeDisconnected?: (node: { id: string; address: string; connectedAt: string; lastSeenAt: string }) => void;
  /** Stored responses of the Responses API, sent to every node (stored-responses.ts). */
  storedResponses?: StoredResponsesFanout;
  /** Keys and tombstones per message of a snapshot sent in parts (default PART_ENTRIES). */
  snapshotPartEntries?: number;
}

export class SyncService implements NodeFleet {
  private readonly sessions = new Set<NodeSession>();
  private readonly leases: LeaseService;
  private readonly reportQueue: ReportQueue;
  /** What every session asks of this service (one object for all of them). */
  private readonly sessionHost: SessionHost;
  private readonly log: (line: string) => void;
  /** When several nodes were last connected (wall clock). */
  private lastSeveralAtMs = -Infinity;
  /** Set by closeAll: nodes leaving at shutdown are not reported as disconnected. */
  private closing = false;
  /** The nodes connected to the previous control plane, waited for after the start (rejoin.ts). */
  private rejoin: Rejoin | null = null;

  constructor(
    private readonly state: ControlState,
    ingest: ReportIngest,
    private readonly opts: SyncServiceOptions,
  ) {
    this.log = opts.log ?? ((l) => console.log(l));
    this.leases = new LeaseService(state, this.sessions, this.log, () => (this.rejoin?.pending ? this.rejoin.done : null));
    this.reportQueue = new ReportQueue(ingest, this.sessions, this.leases.moneyLeases, this.leases.moneyPools, this.log);
    this.sessionHost = { snapshot: () => this.state.snapshots.snapshot(), snapshotPartEntries: opts.snapshotPartEntries ?? PART_ENTRIES, drop: (s) => this.drop(s) };
  }

  /**
   * Before the server serves: the nodes that were connected when the previous control plane stopped
   * or died are waited for, up to `graceMs` from startRejoinGrace (docs/leases.md, "A control plane
   * that restarts").
   */
  async expectRejoin(graceMs: number): Promise<void> {
    const expected = await connectedNodeIds(this.state.db);
    if (expected.length === 0) return;
    this.log(`sync: waiting up to ${graceMs} ms for the ${expected.length} node${expected.length === 1 ? '' : 's'} connected before the start: ${expected.join(', ')}`);
    this.rejoin = new Rejoin(expected, graceMs, (missing) => {
      if (this.closing) return;
      if (missing.length > 0) {
        this.log(`sync: ${missing.length} node${missing.length === 1 ? '' : 's'} did not come back within ${graceMs} ms of the start: ${missing.join(', ')}`);
        this.persist(() => nodesGone(this.state.db, missing));
        if (this.sessions.size === 1) for (const other of this.sessions) other.mayHoldWhole = true;
      }
      // Every node learns the wait is over (and how many are connected) before the answers it held back.
      this.broadcastRoster();
    });
  }

  /** The server listens: the grace of the nodes waited for starts now. */
  startRejoinGrace(): void {
    this.rejoin?.startGrace();
  }

  /** Projects' caps and keys' own limits (docs/money-limits.md), kept by the lease service. */
  get moneyPools(): MoneyPools {
    return this.leases.moneyPools;
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
      deployments: s.journalDepth === null ? null : s.deployments,
    }));
  }

  /** Reports read from node streams and not yet written (for benchmarks and monitoring). */
  get ingestBacklog(): number {
    return this.reportQueue.pendingReports;
  }

  awaitAcks(version: number, timeoutMs: number): Promise<{ total: number; confirmed: number; unconfirmed: string[] }> {
    const sessions = [...this.sessions];
    return Promise.all(sessions.map((s) => s.waitAck(version, timeoutMs))).then((r) => ({
      total: sessions.length,
      confirmed: r.filter(Boolean).length,
      unconfirmed: sessions.filter((_, i) => !r[i]).map((s) => s.nodeId),
    }));
  }

  /** Ends every stream (at shutdown) so the server can stop. */
  closeAll(): void {
    this.closing = true;
    this.rejoin?.end();
    for (const s of [...this.sessions]) {
      this.drop(s);
      s.call.end();
    }
  }

  private connect(call: Call): void {
    const header = call.metadata.get('authorization')[0];
    const m = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!m || !secretsEqual(m[1], this.opts.nodeToken)) {
      failCall(call, status.UNAUTHENTICATED, 'missing or invalid node token');
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
            failCall(call, status.FAILED_PRECONDITION, 'the first message must be hello');
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
        failCall(call, status.INTERNAL, 'internal error');
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

  private hello(call: Call, hello: Hello): NodeSession | null {
    if (!secretsEqual(hello.pepperCheck, this.opts.pepperCheck)) {
      this.log(`sync: refused node ${JSON.stringify(hello.nodeId)}: pepper mismatch`);
      failCall(call, status.FAILED_PRECONDITION, PEPPER_MISMATCH_DETAILS);
      return null;
    }
    const nodeId = hello.nodeId.trim() || `node-${hello.instanceId.slice(0, 8) || 'unnamed'}`;
    if (!isNodeId(nodeId) || !isInstanceId(hello.instanceId)) {
      this.log(`sync: refused a node: node id ${JSON.stringify(nodeId.slice(0, 128))} or instance id ${JSON.stringify(hello.instanceId.slice(0, 128))} is not plain`);
      failCall(call, status.INVALID_ARGUMENT, 'node id and instance id must be 1-128 characters of A-Z a-z 0-9 . _ : -');
      return null;
    }
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
      failCall(call, status.ALREADY_EXISTS, `node id ${JSON.stringify(nodeId)} is already connected from ${other.address}; give every node its own --node-id`);
      return null;
    }
    const now = this.state.nowIso();
    const s = new NodeSession(call, nodeId, hello.instanceId, hello.listenAddress, now, this.sessionHost);
    s.snapshotParts = hello.snapshotParts === true;
    const store = this.state.snapshots;
    // Catch-up and subscription in one synchronous step: no version can slip in between.
    const first = store.catchUp(hello.haveVersion);
    s.unsubscribe = store.subscribe((delta) => s.enqueue({ delta }));
    this.sessions.add(s);
    const fanout = this.opts.storedResponses;
    let detachResponses: (() => void) | undefined;
    if (fanout && hello.ownerRecordsByProject === true) {
      // Only the records of the projects it serves (docs/design.md#owner-records).
      const sub = fanout.attachByProject((responses, caughtUpProjects) => s.enqueue({ storedResponses: { responses, caughtUpProjects } }), hello.storedResponsesSeq ?? 0, hello.ownerProjects);
      s.wantOwners = sub.want;
      detachResponses = sub.detach;
    } else detachResponses = fanout?.attach((responses) => s.enqueue({ storedResponses: { responses, caughtUpProjects: [] } }), hello.storedResponsesSeq ?? 0);
    if (detachResponses) {
      const unsubscribe = s.unsubscribe;
      s.unsubscribe = () => {
        unsubscribe();
        detachResponses();
      };
    }
    if (first.kind === 'snapshot') s.enqueue('snapshot');
    else {
      s.lastSentVersion = hello.haveVersion;
      if (first.kind === 'delta') s.enqueue({ delta: first.delta });
    }
    // The node stays stale until it holds this version (its catch-up is applied), not merely until
    // the stream is accepted.
    s.enqueue({ caughtUp: { version: store.version } });
    // What the node holds as it connects counts from now: before the roster, any share or any want.
    if (hello.heldSlots.length > 0 || hello.heldKeyMinutes.length > 0) {
      this.leases.onLeaseRequest(s, LeaseRequest.fromPartial({ slotReturns: hello.heldSlots, keyReturns: hello.heldKeyMinutes }));
    }
    this.rejoin?.arrived(nodeId);
    this.broadcastRoster();
    if (this.rosterSize() === 1) s.mayHoldWhole = true;
    else for (const other of this.sessions) if (other !== s && other.mayHoldWhole) this.leases.reclaimWhole(other);
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
      s.enqueue('snapshot');
    } else if (msg.report) {
      s.lastReportAt = s.lastSeenAt;
      this.reportQueue.queueReport(s, [msg.report]);
    } else if (msg.reports) {
      s.lastReportAt = s.lastSeenAt;
      // Consecutive reports of one instance are one unit (a node replaying its journal may send its
      // former instance's last reports and its own first ones together).
      let unit: Report[] = [];
      for (const r of msg.reports.reports) {
        if (unit.length > 0 && r.instanceId !== unit[0].instanceId) {
          this.reportQueue.queueReport(s, unit);
          unit = [];
        }
        unit.push(r);
      }
      if (unit.length > 0) this.reportQueue.queueReport(s, unit);
    } else if (msg.leaseRequest) {
      this.leases.onLeaseRequest(s, msg.leaseRequest);
    } else if (msg.ownerInterest) {
      s.wantOwners(msg.ownerInterest.projectIds);
    } else if (msg.status) {
      s.journalDepth = Math.max(0, msg.status.journalDepth);
      s.journalBytes = Math.max(0, msg.status.journalBytes);
      s.droppedLogRows = Math.max(0, msg.status.droppedLogRows);
      s.deployments = msg.status.deployments;
    }
  }

  /** Every node learns how many nodes are connected (it sizes each node's cold share of key budgets). */
  private broadcastRoster(): void {
    const connectedNodes = this.rosterSize();
    const now = this.state.now();
    if (connectedNodes > 1) this.lastSeveralAtMs = now;
    // A lone node may hold this minute's whole budgets only if nobody else can have used them.
    const wholeNow = connectedNodes === 1 && now - this.lastSeveralAtMs > LONE_QUIET_MS;
    const rejoining = this.rejoin?.pending === true;
    for (const s of this.sessions) s.enqueue({ roster: { connectedNodes, wholeNow, rejoining } });
  }

  /** The nodes connected, and those waited for after the start (rejoin.ts). */
  private rosterSize(): number {
    return this.sessions.size + (this.rejoin?.missing ?? 0);
  }

  private drop(s: NodeSession): void {
    if (s.closed) return;
    s.closed = true;
    s.unsubscribe();
    if (this.sessions.size > 1) this.lastSeveralAtMs = this.state.now();
    this.sessions.delete(s);
    this.leases.dropConnection(s);
    for (const done of [...s.reclaims.values()]) done();
    s.reclaims.clear();
    s.queue.length = 0;
    this.reportQueue.forget(s);
    for (const w of [...s.waiters]) w.resolve(false);
    this.broadcastRoster();
    // The last node left is alone again: it holds whole key budgets of the minutes it starts.
    if (this.rosterSize() === 1) for (const other of this.sessions) other.mayHoldWhole = true;
    this.log(`sync: node ${s.nodeId} disconnected`);
    if (!this.closing) this.opts.onNodeDisconnected?.({ id: s.nodeId, address: s.address, connectedAt: s.connectedAt, lastSeenAt: s.lastSeenAt });
    // At shutdown the node stays marked connected: the next control plane waits for it.
    const at = this.state.nowIso();
    this.persist(() => (this.closing ? touchNode(this.state.db, s.nodeId, at, s.ackedVersion) : nodeDisconnected(this.state.db, s.nodeId, at, s.ackedVersion)));
  }

  private persist(write: () => Promise<unknown>): void {
    write().catch((err: Error) => this.log(`sync: node bookkeeping not written: ${err.message}`));
  }
}
