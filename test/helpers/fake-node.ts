// A fake data-plane node for tests of the sync protocol's acknowledgements: it connects to the
// control plane's SyncService like a real node (node token, Hello with the pepper check), receives the
// snapshot and acks it, then records every Delta and, when told to, holds their acks until the test
// releases them. That is how a test observes "the record stays active until every node acked".
import { credentials, Metadata, type ClientDuplexStream } from '@grpc/grpc-js';
import { randomBytes } from 'node:crypto';
import { SyncServiceClient, type ControlMessage, type Delta, type Hello, type NodeMessage, type Snapshot } from '../../proto/gen/tollgate/v1/sync.js';
import { pepperCheck } from '../../proto/lib/keys.js';
import type { Secrets } from './processes.js';

export interface FakeNodeOptions {
  nodeId?: string;
  /** Hold the acks of deltas until release() (default true). The snapshot is always acked. */
  holdAcks?: boolean;
  /** Listen address reported in Hello (shown by `tollgate nodes list`). */
  listenAddress?: string;
  /** Told every message from the control plane (lease grants, for a fake node that plays leases). */
  onMessage?: (msg: ControlMessage) => void;
  /** What the node says it holds in its Hello (parallel slots in use, key minutes). */
  held?: Pick<Hello, 'heldSlots' | 'heldKeyMinutes'>;
}

export interface FakeNode {
  nodeId: string;
  snapshot: Snapshot;
  /** Every delta received so far, in order. */
  deltas: Delta[];
  /** Versions received whose acks are being held. */
  heldAcks(): number[];
  /** Resolves with the first delta (already received or still to come) that `match` accepts. */
  waitForDelta(match: (d: Delta) => boolean, timeoutMs?: number): Promise<Delta>;
  /** Sends the held acks, in order; with `keepHolding: false` later deltas are acked at once. */
  release(opts?: { keepHolding?: boolean }): void;
  /** Set when the stream ended or failed (e.g. the control plane was killed). */
  streamError(): Error | undefined;
  /** Writes a message as is; false when the stream's buffer is full (the control plane is not reading). */
  write(msg: NodeMessage): boolean;
  /** Resolves when the stream can take more (after write returned false). */
  drained(): Promise<void>;
  /** The seq of every ReportAck received, in order. */
  reportAcks: number[];
  close(): void;
}

/** A delta that removes the credential with this hex hash. */
export function removesKeyHash(hash: string): (d: Delta) => boolean {
  return (d) => d.changes.some((c) => c.keyRemoved === hash);
}

/** A delta that removes any credential. */
export function removesAnyKey(d: Delta): boolean {
  return d.changes.some((c) => c.keyRemoved !== undefined);
}

export async function startFakeNode(
  cp: { address: string; secrets: Secrets },
  opts: FakeNodeOptions = {},
  timeoutMs = 15_000,
): Promise<FakeNode> {
  const nodeId = opts.nodeId ?? `fake-${randomBytes(3).toString('hex')}`;
  let holding = opts.holdAcks ?? true;
  // As a real node: snapshots of many keys are larger than gRPC's default 4 MB.
  const client = new SyncServiceClient(cp.address, credentials.createInsecure(), { 'grpc.max_receive_message_length': 256 * 1024 * 1024 });
  const md = new Metadata();
  md.set('authorization', `Bearer ${cp.secrets.nodeToken}`);
  const stream: ClientDuplexStream<NodeMessage, ControlMessage> = client.connect(md);
  const deltas: Delta[] = [];
  const reportAcks: number[] = [];
  const held: number[] = [];
  const waiters = new Set<() => void>();
  let failure: Error | undefined;
  let closed = false;
  const notify = () => {
    for (const w of [...waiters]) w();
  };
  const send = (msg: NodeMessage) => {
    if (!closed && !failure) stream.write(msg);
  };

  let resolveSnapshot!: (s: Snapshot) => void;
  let rejectSnapshot!: (e: Error) => void;
  const snapshotPromise = new Promise<Snapshot>((resolve, reject) => {
    resolveSnapshot = resolve;
    rejectSnapshot = reject;
  });

  stream.on('data', (msg: ControlMessage) => {
    if (msg.snapshot) {
      send({ ack: { version: msg.snapshot.version } });
      resolveSnapshot(msg.snapshot);
    } else if (msg.delta) {
      deltas.push(msg.delta);
      if (holding) held.push(msg.delta.toVersion);
      else send({ ack: { version: msg.delta.toVersion } });
      notify();
    }
    if (msg.reportAck) {
      reportAcks.push(msg.reportAck.seq);
      notify();
    }
    if (msg.reportAcks) {
      for (const a of msg.reportAcks.acks) reportAcks.push(a.seq);
      notify();
    }
    // Lease grants are not part of what this fake node plays, unless its owner does.
    opts.onMessage?.(msg);
  });
  stream.on('error', (err: Error) => {
    failure = err;
    rejectSnapshot(err);
    notify();
  });
  stream.on('end', () => {
    failure ??= new Error('sync stream ended by the control plane');
    rejectSnapshot(failure);
    notify();
  });

  send({
    hello: {
      nodeId,
      instanceId: randomBytes(8).toString('hex'),
      // The pepper's bytes are the UTF-8 bytes of the TOLLGATE_PEPPER string (docs/design.md#peppered-hash).
      pepperCheck: pepperCheck(Buffer.from(cp.secrets.pepper, 'utf8')),
      haveVersion: 0,
      ownerProjects: [],
      listenAddress: opts.listenAddress ?? '127.0.0.1:0',
      heldSlots: opts.held?.heldSlots ?? [],
      heldKeyMinutes: opts.held?.heldKeyMinutes ?? [],
    },
  });

  let timer: NodeJS.Timeout | undefined;
  const snapshot = await Promise.race([
    snapshotPromise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`fake node ${nodeId}: no snapshot within ${timeoutMs} ms`)), timeoutMs);
    }),
  ]).finally(() => clearTimeout(timer));

  return {
    nodeId,
    snapshot,
    deltas,
    heldAcks: () => [...held],
    reportAcks,
    write: (msg) => stream.write(msg),
    drained: () => new Promise<void>((resolve) => stream.once('drain', () => resolve())),
    waitForDelta(match, waitMs = 15_000) {
      return new Promise<Delta>((resolve, reject) => {
        const check = () => {
          const d = deltas.find(match);
          if (d) {
            done();
            resolve(d);
          } else if (failure) {
            done();
            reject(new Error(`fake node ${nodeId}: stream failed before the delta arrived: ${failure.message}`));
          }
        };
        const t = setTimeout(() => {
          done();
          reject(new Error(`fake node ${nodeId}: no matching delta within ${waitMs} ms (got ${deltas.length} deltas)`));
        }, waitMs);
        const done = () => {
          clearTimeout(t);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
    release({ keepHolding = false } = {}) {
      holding = keepHolding;
      for (const version of held.splice(0)) send({ ack: { version } });
    },
    streamError: () => failure,
    close() {
      if (closed) return;
      closed = true;
      stream.cancel();
      client.close();
    },
  };
}
