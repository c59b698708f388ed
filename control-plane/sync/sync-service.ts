// Translates the snapshot store onto the SyncService.Connect stream (see proto/tollgate/v1/sync.proto).
// Per node session: Hello (token and pepper checked) → snapshot, one catch-up delta, or nothing → a
// delta per new version. Acks are tracked for revocation; reports are ingested in order and acked
// once committed. Writes respect backpressure: when write() returns false we wait for 'drain', and a
// node that falls far behind gets one fresh snapshot instead of an unbounded queue of deltas.
import { status, type ServerDuplexStream } from '@grpc/grpc-js';
import { secretsEqual } from '../../proto/lib/keys.js';
import type { ControlMessage, Delta, Hello, KeyLease, LeaseRequest, NodeMessage, OrgLease, SyncServiceServer } from '../../proto/gen/tollgate/v1/sync.js';
import type { ControlState } from '../control-state.js';
import type { NodeFleet } from '../console/console-service.js';
import { touchNode, upsertNode } from '../store/sync-repo.js';
import type { ReportIngest } from './report-ingest.js';
import { KeyLeaseLedger, MoneyLeaseLedger } from './lease-ledger.js';

const MAX_QUEUED = 1000;
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
  reports: Promise<void> = Promise.resolve();
  /** Identifies this connection in the lease ledgers (slices belong to a connection). */
  readonly connId: string;

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

export interface SyncServiceOptions {
  nodeToken: string;
  /** pepperCheck(pepper) of this control plane. */
  pepperCheck: string;
  log?: (line: string) => void;
}

export class SyncService implements NodeFleet {
  private readonly sessions = new Set<NodeSession>();
  private readonly keyLeases = new KeyLeaseLedger();
  private readonly moneyLeases = new MoneyLeaseLedger();
  private readonly log: (line: string) => void;

  constructor(
    private readonly state: ControlState,
    private readonly ingest: ReportIngest,
    private readonly opts: SyncServiceOptions,
  ) {
    this.log = opts.log ?? ((l) => console.log(l));
  }

  handlers(): SyncServiceServer {
    return { connect: (call) => this.connect(call) };
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
    }));
  }

  awaitAcks(version: number, timeoutMs: number): Promise<{ total: number; confirmed: number }> {
    const sessions = [...this.sessions];
    return Promise.all(sessions.map((s) => this.waitAck(s, version, timeoutMs))).then((r) => ({
      total: sessions.length,
      confirmed: r.filter(Boolean).length,
    }));
  }

  /** Ends every stream (at shutdown) so the server can stop. */
  closeAll(): void {
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
    let session: NodeSession | null = null;
    let failed = false;
    const endCall = () => {
      if (session) this.drop(session);
    };
    call.on('data', (msg: NodeMessage) => {
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
    const now = this.state.nowIso();
    const s = new NodeSession(call, nodeId, hello.instanceId, hello.listenAddress, now);
    const store = this.state.snapshots;
    // Catch-up and subscription in one synchronous step: no version can slip in between.
    const first = store.catchUp(hello.haveVersion);
    s.unsubscribe = store.subscribe((delta) => this.enqueue(s, { delta }));
    this.sessions.add(s);
    if (first.kind === 'snapshot') this.enqueue(s, 'snapshot');
    else {
      s.lastSentVersion = hello.haveVersion;
      if (first.kind === 'delta') this.enqueue(s, { delta: first.delta });
    }
    this.broadcastRoster();
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
      const report = msg.report;
      // In order per session: a cursor must never pass a report that failed.
      s.reports = s.reports.then(async () => {
        if (s.closed) return;
        try {
          await this.ingest.ingest({ nodeId: s.nodeId, instanceId: s.instanceId }, report, (orgId, cost) =>
            this.moneyLeases.consume(s.connId, orgId, cost),
          );
        } catch (err) {
          this.log(`sync: report ${report.seq} from node ${s.nodeId} not written: ${(err as Error).message}`);
          this.drop(s);
          this.fail(s.call, status.UNAVAILABLE, 'report not written; reconnect and resend');
          return;
        }
        this.enqueue(s, { reportAck: { seq: report.seq } });
      });
    } else if (msg.leaseRequest) {
      this.grantLeases(s, msg.leaseRequest);
    }
  }

  /**
   * Answers a LeaseRequest with one LeaseGrant (design.md, "Money and limits across nodes"). Key
   * slices come from in-memory minute pools; money slices are computed inside one serialised database
   * job, so no usage report can commit between reading what is spendable and recording the slice.
   */
  private grantLeases(s: NodeSession, req: LeaseRequest): void {
    const nodes = this.sessions.size;
    const keys: KeyLease[] = req.keys.map((w) => {
      const entry = this.state.snapshots.keyById(w.keyId);
      if (!entry) return { keyId: w.keyId, minute: w.minute, requests: 0, tokens: 0 };
      const g = this.keyLeases.grant(s.connId, w, { rpm: entry.rpmLimit, tpm: entry.tpmLimit }, nodes);
      return { keyId: w.keyId, minute: w.minute, requests: g.requests, tokens: g.tokens };
    });
    if (req.orgs.length === 0) {
      this.enqueue(s, { leaseGrant: { keys, orgs: [] } });
      return;
    }
    this.state.db
      .read(async (q) => {
        const orgs: OrgLease[] = [];
        for (const w of req.orgs) {
          const spendable = await this.state.spendableMicros(q, w.orgId);
          const micros = s.closed ? 0 : this.moneyLeases.grant(s.connId, w.orgId, spendable, nodes, w.micros);
          orgs.push({ orgId: w.orgId, micros, exhausted: micros === 0 });
        }
        return orgs;
      })
      .then(
        (orgs) => this.enqueue(s, { leaseGrant: { keys, orgs } }),
        (err: Error) => {
          this.log(`sync: lease request of node ${s.nodeId} failed: ${err.message}`);
          this.enqueue(s, { leaseGrant: { keys, orgs: req.orgs.map((w) => ({ orgId: w.orgId, micros: 0, exhausted: false })) } });
        },
      );
  }

  /** Every node learns how many nodes are connected (it sizes each node's cold share of key budgets). */
  private broadcastRoster(): void {
    const connectedNodes = this.sessions.size;
    for (const s of this.sessions) this.enqueue(s, { roster: { connectedNodes } });
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
    this.sessions.delete(s);
    this.moneyLeases.dropConnection(s.connId);
    s.queue.length = 0;
    for (const w of [...s.waiters]) w.resolve(false);
    this.broadcastRoster();
    this.log(`sync: node ${s.nodeId} disconnected`);
    this.persist(() => touchNode(this.state.db, s.nodeId, this.state.nowIso(), s.ackedVersion));
  }

  private persist(write: () => Promise<unknown>): void {
    write().catch((err: Error) => this.log(`sync: node bookkeeping not written: ${err.message}`));
  }
}
