// One node's stream (SyncService.Connect, see proto/tollgate/v1/sync.proto): what the control plane
// knows of the node on this connection, and its outbound queue. Writes respect backpressure: when
// write() returns false we wait for 'drain', and a node that falls far behind gets one fresh snapshot
// instead of an unbounded queue of deltas.
import type { ServerDuplexStream, status } from '@grpc/grpc-js';
import type { ControlMessage, Delta, DeploymentHealth, NodeMessage, Report, Snapshot } from '../../proto/gen/tollgate/v1/sync.js';
import type { LeaseSession } from '../leases/lease-service.js';
import { countOutbound } from './sync-traffic.js';
import { splitSnapshot } from '../../proto/lib/snapshot-parts.js';

const MAX_QUEUED = 1000;

export type Outbound = ControlMessage | 'snapshot';
export type Call = ServerDuplexStream<NodeMessage, ControlMessage>;

export interface AckWaiter {
  version: number;
  resolve: (confirmed: boolean) => void;
}

/** What a session needs from the service that holds it (sync-service.ts). */
export interface SessionHost {
  /** The store's current snapshot (for a node too far behind, or out of step). */
  snapshot(): Snapshot;
  /** Keys and tombstones per message of a snapshot in parts (proto/lib/snapshot-parts.ts). */
  snapshotPartEntries: number;
  /** Ends the session (its stream broke). */
  drop(s: NodeSession): void;
}

let connections = 0;

export class NodeSession implements LeaseSession {
  readonly queue: Outbound[] = [];
  lastSentVersion = 0;
  ackedVersion = 0;
  lastSeenAt: string;
  writing = false;
  closed = false;
  unsubscribe: () => void = () => undefined;
  /** A node placing owner records by project: the projects it now serves (OwnerInterest). */
  wantOwners: (projectIds: readonly string[]) => void = () => undefined;
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
  /** Its pooled models' deployments as its last NodeStatus said (`tollgate models status`). */
  deployments: DeploymentHealth[] = [];
  /** The node takes a large snapshot in parts (Hello.snapshot_parts). */
  snapshotParts = false;

  constructor(
    readonly call: Call,
    readonly nodeId: string,
    readonly instanceId: string,
    readonly address: string,
    readonly connectedAt: string,
    private readonly host: SessionHost,
  ) {
    this.lastSeenAt = connectedAt;
    this.connId = `${instanceId}#${++connections}`;
  }

  /** Ends the session (the service drops it: its leases, reports and waiters go with it). */
  drop(): void {
    this.host.drop(this);
  }

  /** Resolves true once the node acked `version`, false if it left first or after `timeoutMs`. */
  waitAck(version: number, timeoutMs: number): Promise<boolean> {
    if (this.ackedVersion >= version) return Promise.resolve(true);
    if (this.closed) return Promise.resolve(false);
    return new Promise((resolve) => {
      const waiter: AckWaiter = {
        version,
        resolve: (ok) => {
          clearTimeout(timer);
          this.waiters.delete(waiter);
          resolve(ok);
        },
      };
      const timer = setTimeout(() => waiter.resolve(false), timeoutMs);
      this.waiters.add(waiter);
    });
  }

  /** Queues a message for the node (a snapshot is taken when it is written). */
  enqueue(item: Outbound): void {
    if (this.closed) return;
    this.queue.push(item);
    if (this.queue.length > MAX_QUEUED) {
      // Too far behind: replace every queued delta (and what is left of a snapshot in parts) by one
      // fresh snapshot taken when it is written.
      const keep = this.queue.filter((q): q is ControlMessage => q !== 'snapshot' && !q.delta && !q.snapshot);
      this.queue.length = 0;
      this.queue.push('snapshot', ...keep);
    }
    this.pump();
  }

  /**
   * The store's snapshot as the next message; a large one to a node that takes parts is split, and
   * its other parts go first in the queue (each written as the stream drains, encoded one at a time).
   */
  private snapshotMessage(): ControlMessage {
    const snapshot = this.host.snapshot();
    this.lastSentVersion = snapshot.version;
    if (!this.snapshotParts) return { snapshot };
    const [first, ...rest] = splitSnapshot(snapshot, this.host.snapshotPartEntries);
    this.queue.unshift(...rest.map((part) => ({ snapshot: part })));
    return { snapshot: first };
  }

  private pump(): void {
    if (this.writing || this.closed) return;
    while (this.queue.length > 0) {
      const item = this.queue.shift()!;
      let msg: ControlMessage;
      if (item === 'snapshot') {
        msg = this.snapshotMessage();
      } else if (item.delta) {
        const d: Delta = item.delta;
        if (d.toVersion <= this.lastSentVersion) continue;
        if (d.fromVersion !== this.lastSentVersion) {
          // Cannot happen with in-order queueing; a snapshot is the safe answer if it ever does.
          msg = this.snapshotMessage();
        } else {
          this.lastSentVersion = d.toVersion;
          msg = item;
        }
      } else msg = item;
      let ok: boolean;
      try {
        countOutbound(msg);
        ok = this.call.write(msg);
      } catch {
        this.host.drop(this);
        return;
      }
      if (!ok) {
        this.writing = true;
        this.call.once('drain', () => {
          this.writing = false;
          this.pump();
        });
        return;
      }
    }
  }
}


/** Ends a call with a status (the stream's 'error' event is how grpc-js sends one). */
export function failCall(call: Call, code: status, details: string): void {
  call.emit('error', { code, details });
}
