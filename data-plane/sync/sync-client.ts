// The node's side of SyncService.Connect: Hello, then snapshots and deltas applied strictly in order
// (a gap asks for a resync, so no revocation is ever skipped), an Ack after each, reports through the
// Reporter. Disconnects are retried with capped exponential back-off and jitter, resuming from the
// version held; meanwhile the node keeps serving from its last state. A refusal (pepper mismatch,
// bad node token) is fatal: one line, exit 2. Given several control planes (`a:50051,b:50051`), the node
// finds the leader itself: a standby's UNAVAILABLE names it and the next attempt goes there at once,
// each address with its own back-off (leader-search.ts, docs/design.md#several-control-planes-on-one-database);
// an attempt whose connection is not made within CONNECT_TIMEOUT_MS counts as no answer.
import { projectPoolPrefix } from '../../proto/lib/spend-limits.js';
import { Metadata, status as GrpcStatus, type ClientDuplexStream, type StatusObject } from '@grpc/grpc-js';
import { clientChannel, type TlsFiles } from '../../proto/lib/tls.js';
import { splitAddresses } from '../../proto/lib/leader-hint.js';
import { CONNECT_TIMEOUT_MS, whenConnectionSettled } from '../../proto/lib/connection-wait.js';
import { LeaderSearch } from './leader-search.js';
import { SyncServiceClient, SyncServiceService, type ControlMessage, type DeploymentHealth, type NodeMessage, type StoredResponse } from '../../proto/gen/tollgate/v1/sync.js';
import type { StateHolder } from '../state/key-table.js';
import { SnapshotDecoder } from '../state/snapshot-decoder.js';
import type { OpenStreams } from '../state/open-streams.js';
import { MINUTE_MS, minuteOf } from '../limits/clock.js';
import type { LeaseClient } from '../leases/lease-client.js';
import type { LeaseRequestOut } from '../leases/lease-link.js';
import type { Reporter } from './reporter.js';
import type { ResponseOwners } from '../state/response-owners.js';

/** How long before the top of a minute the next minute's first lease chunks are asked for. */
const PREFETCH_BEFORE_TOP_MS = 3000;
const USED_EVERY_MS = 100;
/** Every this many ticks (a second) the node says what it used of every key minute, standing shares too. */
const USED_EVERY_KEY_TICKS = 10;
/** How often the node tells the control plane its journal depth (for `tollgate nodes list`). */
const STATUS_EVERY_MS = 5000;

export interface SyncClientOptions {
  /** The control plane's HOST:PORT, or several separated by commas (the leader is found among them). */
  address: string;
  nodeToken: string;
  nodeId: string;
  instanceId: string;
  pepperCheck: string;
  listenAddress: string;
  holder: StateHolder;
  reporter: Reporter;
  /** Who owns each stored response (the Responses API): fed the control plane's records. */
  responseOwners?: ResponseOwners;
  /** What keys have open: its policy is enforced after each applied change, before the ack (state/open-streams.ts). */
  openStreams?: OpenStreams;
  /** Lease slices: told about connection changes, fed grants, and given a way to send requests. */
  leases?: LeaseClient;
  now(): number;
  /**
   * After a snapshot or delta is applied (and what keys have open was ended) and before it is acked.
   */
  onApplied?(): void;
  onFirstSnapshot(): void;
  /** A refusal that retrying cannot fix: print the line, exit 2. */
  onFatal(line: string): void;
  log(line: string): void;
  /** TLS to the control plane (default: plaintext). */
  tls?: TlsFiles | null;
  /** Usage held unacknowledged, sent in NodeStatus (the usage journal's depth once it lands). */
  journalDepth?: () => number;
  /** The journal's bytes and the request-log rows dropped because it was full, sent with the depth. */
  journalExtra?: () => { journalBytes: number; droppedLogRows: number };
  /** Pooled models' deployments as this node sees them, sent in NodeStatus (`tollgate models status`). */
  deploymentHealth?: () => DeploymentHealth[];
  minBackoffMs?: number;
  maxBackoffMs?: number;
}

export class SyncClient {
  /**
   * When the node lost the control plane (or started); null once a stream's catch-up is applied. It
   * stays set while a new stream is accepted but its catch-up is not yet in: the node is still stale.
   */
  disconnectedSince: number | null;
  private readonly clients = new Map<string, SyncServiceClient>();
  /** Where the next stream goes, and when (leader-search.ts). */
  private readonly search: LeaderSearch;
  private call: ClientDuplexStream<NodeMessage, ControlMessage> | null = null;
  private stopped = false;
  private awaitingSnapshot = false;
  private gotFirstSnapshot = false;
  /** The version the current stream's CaughtUp names (-1: not yet received on this stream). */
  private catchUpVersion = -1;
  private retryTimer: NodeJS.Timeout | null = null;
  /** Numbers the attempts: a connection wait of an attempt given up answers nothing. */
  private attemptSeq = 0;
  private lostLogged = false;
  /** The highest stored-response record seq received from the control plane. */
  private storedResponsesSeq = 0;
  /** The health last sent in NodeStatus (healthSignature). */
  private healthSent = '';
  private readonly pruneTimer: NodeJS.Timeout;
  private readonly prefetchTimer: NodeJS.Timeout;
  private readonly usedTimer: NodeJS.Timeout;
  private readonly statusTimer: NodeJS.Timeout;

  constructor(private readonly opts: SyncClientOptions) {
    const list = splitAddresses(opts.address);
    this.search = new LeaderSearch(list.length > 0 ? list : [opts.address], {
      minBackoffMs: opts.minBackoffMs ?? 100,
      maxBackoffMs: opts.maxBackoffMs ?? 5_000,
      now: opts.now,
      random: Math.random,
    });
    this.disconnectedSince = opts.now();
    this.pruneTimer = setInterval(() => opts.leases?.prune(minuteOf(opts.now()) - 1), 30_000);
    this.pruneTimer.unref();
    // In the last seconds of a minute, lease the next minute's first chunks for the keys in use.
    this.prefetchTimer = setInterval(() => {
      if (MINUTE_MS - (opts.now() % MINUTE_MS) <= PREFETCH_BEFORE_TOP_MS) opts.leases?.prefetchNextMinute();
      // A circuit that opened or closed, or a cooling, reaches `models status` within a second.
      if (opts.deploymentHealth && healthSignature(opts.deploymentHealth()) !== this.healthSent) this.sendStatus();
    }, 1000);
    this.prefetchTimer.unref();
    // What the node used of its leases (freed if the node dies): of key minutes it asked for, at most
    // ten times a second; of those used within their standing share, once a second (docs/leases.md).
    let usedTicks = 0;
    this.usedTimer = setInterval(() => opts.leases?.sendUsed(++usedTicks % USED_EVERY_KEY_TICKS === 0), USED_EVERY_MS);
    this.usedTimer.unref();
    this.statusTimer = setInterval(() => this.sendStatus(), STATUS_EVERY_MS);
    this.statusTimer.unref();
  }

  /** The control plane streams go to now (the usage queries follow it). */
  get currentAddress(): string {
    return this.search.address;
  }

  private get client(): SyncServiceClient {
    const address = this.search.address;
    let c = this.clients.get(address);
    if (!c) {
      const channel = clientChannel(this.opts.tls ?? null, address);
      c = new SyncServiceClient(address, channel.credentials, {
        ...channel.options,
        'grpc.keepalive_time_ms': 10_000,
        'grpc.keepalive_timeout_ms': 5_000,
        'grpc.initial_reconnect_backoff_ms': 100,
        'grpc.max_reconnect_backoff_ms': 1_000,
        // A snapshot comes in parts of about 1.3 MB (Hello.snapshot_parts), but a control plane of an
        // earlier version sends it whole: about 132 bytes per key, so 1,000,000 keys is ~130 MiB (the
        // default, 4 MiB, refused snapshots of ~30,000 keys and more). As large as a control plane sends.
        'grpc.max_receive_message_length': 256 * 1024 * 1024,
      });
      this.clients.set(address, c);
    }
    return c;
  }

  private sendStatus(): void {
    if (this.call && this.opts.journalDepth) {
      const extra = this.opts.journalExtra?.() ?? { journalBytes: 0, droppedLogRows: 0 };
      const deployments = this.opts.deploymentHealth?.() ?? [];
      this.healthSent = healthSignature(deployments);
      this.call.write({ status: { journalDepth: this.opts.journalDepth(), ...extra, deployments } });
    }
  }

  /** Asks for the owner records of a project this node now serves (sent again on the next stream if none now). */
  sendOwnerInterest(projectIds: string[]): void {
    this.call?.write({ ownerInterest: { projectIds } });
  }

  /** Sends a LeaseRequest on the current stream; false when there is none. */
  sendLeaseRequest(req: LeaseRequestOut): boolean {
    if (!this.call) return false;
    this.call.write({ leaseRequest: req });
    return true;
  }

  start(): void {
    this.connect();
  }

  stop(): void {
    // Unused allowance goes back before the stream closes, so the other nodes can use it this minute.
    this.opts.leases?.giveBackAll();
    this.stopped = true;
    clearInterval(this.pruneTimer);
    clearInterval(this.prefetchTimer);
    clearInterval(this.usedTimer);
    clearInterval(this.statusTimer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.opts.reporter.detach();
    if (this.call) this.call.cancel();
    this.call = null;
    for (const c of this.clients.values()) c.close();
  }

  /** Opens a stream once the address's connection is made; gives the attempt up after CONNECT_TIMEOUT_MS. */
  private connect(): void {
    if (this.stopped) return;
    const client = this.client;
    const attempt = ++this.attemptSeq;
    whenConnectionSettled(client.getChannel(), CONNECT_TIMEOUT_MS, (settled) => {
      if (this.stopped || attempt !== this.attemptSeq) return;
      if (settled) this.openStream(client);
      else this.retry({ code: GrpcStatus.UNAVAILABLE, details: `no connection within ${CONNECT_TIMEOUT_MS} ms`, metadata: new Metadata() });
    });
  }

  private openStream(client: SyncServiceClient): void {
    const md = new Metadata();
    md.set('authorization', `Bearer ${this.opts.nodeToken}`);
    // The generated client's Connect, with a deserializer that packs a snapshot's keys as it reads
    // them and assembles a snapshot sent in parts (one decoder per stream: a broken stream's parts go with it).
    const method = SyncServiceService.connect;
    const call = client.makeBidiStreamRequest(method.path, method.requestSerialize, new SnapshotDecoder().decode, md);
    this.call = call;
    this.awaitingSnapshot = false;
    this.catchUpVersion = -1;
    // Reports go on a stream only once the control plane has accepted it: written to a call that is
    // still connecting they would only be buffered, and during an outage every retry would decode and
    // buffer the journal's oldest reports again.
    let attached = false;
    const accepted = () => {
      if (this.call !== call) return;
      this.markConnected();
      if (!attached) {
        attached = true;
        this.opts.reporter.attach(call);
      }
    };
    call.on('data', (msg: ControlMessage) => {
      try {
        if (this.call === call) accepted();
        if (this.call === call) this.onMessage(call, msg);
      } catch (err) {
        this.opts.log(`sync: failed to apply a message: ${(err as Error).message}; resyncing`);
        this.awaitingSnapshot = true;
        call.write({ resync: { haveVersion: this.opts.holder.current.version, reason: 'apply failed' } });
      }
    });
    // 'error' always precedes 'status' for a failed call; 'status' is the one end signal handled.
    call.on('error', () => {});
    // Response headers mean the control plane accepted the stream (it may have nothing to send yet).
    call.on('metadata', accepted);
    call.on('status', (s: StatusObject) => this.onStatus(call, s));
    call.write({
      hello: {
        nodeId: this.opts.nodeId,
        instanceId: this.opts.instanceId,
        pepperCheck: this.opts.pepperCheck,
        haveVersion: this.opts.holder.ready ? this.opts.holder.current.version : 0,
        listenAddress: this.opts.listenAddress,
        storedResponsesSeq: this.storedResponsesSeq,
        // Placed: the records of the projects it holds after that seq; those asked for, again below.
        ownerRecordsByProject: this.opts.responseOwners?.placed === true,
        ownerProjects: this.opts.responseOwners?.placed ? this.opts.responseOwners.heldProjects() : [],
        snapshotParts: true,
        ...(this.opts.leases?.held() ?? { heldSlots: [], heldKeyMinutes: [] }),
      },
    });
    const asked = this.opts.responseOwners?.placed ? this.opts.responseOwners.askedProjects() : [];
    if (asked.length > 0) call.write({ ownerInterest: { projectIds: asked } });
    this.sendStatus();
  }

  private onMessage(call: ClientDuplexStream<NodeMessage, ControlMessage>, msg: ControlMessage): void {
    this.markConnected();
    const holder = this.opts.holder;
    const leases = this.opts.leases;
    if (msg.snapshot) {
      holder.applySnapshot(msg.snapshot);
      this.endWhatNoLongerHolds();
      if (leases) for (const o of msg.snapshot.orgs) leases.orgChanged(o.orgId);
      // A project's cap (docs/money-limits.md): its money pool is asked for afresh.
      if (leases) for (const p of msg.snapshot.projectCaps?.projects ?? []) leases.poolsChanged(projectPoolPrefix(p.projectId));
      this.awaitingSnapshot = false;
      this.opts.onApplied?.();
      // A snapshot is a whole catch-up by itself (a control plane that sends no CaughtUp too).
      this.markCaughtUp();
      call.write({ ack: { version: msg.snapshot.version } });
      if (!this.gotFirstSnapshot) {
        this.gotFirstSnapshot = true;
        this.opts.onFirstSnapshot();
      }
    } else if (msg.delta) {
      if (this.awaitingSnapshot || !holder.ready) return;
      const r = holder.current.applyDelta(msg.delta);
      if (r === 'applied') {
        this.endWhatNoLongerHolds();
        this.opts.onApplied?.();
        // Deltas come in order after the catch-up: one applied on this stream means it is in.
        this.markCaughtUp();
        call.write({ ack: { version: msg.delta.toVersion } });
        // Credit, cap, tier or config changes: a node told "nothing left" asks again.
        if (leases) for (const c of msg.delta.changes) if (c.orgUpsert) leases.orgChanged(c.orgUpsert.orgId);
        if (leases) for (const c of msg.delta.changes) if (c.projectUpsert) leases.poolsChanged(projectPoolPrefix(c.projectUpsert.projectId));
      }
      else if (r === 'gap') {
        this.awaitingSnapshot = true;
        call.write({ resync: { haveVersion: holder.current.version, reason: `gap: have ${holder.current.version}, delta from ${msg.delta.fromVersion}` } });
      }
    } else if (msg.caughtUp) {
      this.catchUpVersion = msg.caughtUp.version;
      // Not in yet when the catch-up asked for a resync: the snapshot that answers it ends staleness.
      if (!this.awaitingSnapshot && holder.ready && holder.current.version >= this.catchUpVersion) this.markCaughtUp();
    } else if (msg.storedResponses) {
      this.applyStoredResponses(msg.storedResponses.responses);
      if (msg.storedResponses.caughtUpProjects.length > 0) this.opts.responseOwners?.caughtUp(msg.storedResponses.caughtUpProjects);
    } else if (msg.reportAck) {
      this.opts.reporter.ack(msg.reportAck.seq, msg.reportAck.instanceId);
    } else if (msg.reportAcks) {
      for (const a of msg.reportAcks.acks) this.opts.reporter.ack(a.seq, a.instanceId);
    } else if (msg.leaseGrant && leases) {
      for (const k of msg.leaseGrant.keys) leases.applyKeyGrant(k);
      for (const p of msg.leaseGrant.pools) leases.applyPoolFree(p);
      if (msg.leaseGrant.orgSlices) leases.applyOrgSlices(msg.leaseGrant.orgs);
      else for (const o of msg.leaseGrant.orgs) leases.applyOrgGrant(o.orgId, o.micros, o.exhausted, o.advanceMicros);
      for (const sl of msg.leaseGrant.slots) leases.applySlotGrant(sl);
      if (msg.leaseGrant.usedAck) leases.applyUsedAck(msg.leaseGrant.usedAck);
      if (msg.leaseGrant.reclaiming) leases.noteReclaiming();
      if (msg.leaseGrant.bulk) leases.applyBulk(msg.leaseGrant.bulk);
      if (msg.leaseGrant.slotShare) leases.applySlotShare(msg.leaseGrant.slotShare);
    } else if (msg.roster && leases) {
      leases.setConnectedNodes(msg.roster.connectedNodes, msg.roster.wholeNow, msg.roster.rejoining === true);
    } else if (msg.leaseReclaim && leases) {
      leases.onReclaim(msg.leaseReclaim);
    }
  }

  /** Stored-response records from the control plane, in ascending seq: the owners of responses made anywhere. */
  private applyStoredResponses(records: StoredResponse[]): void {
    const owners = this.opts.responseOwners;
    for (const r of records) {
      owners?.add(r.responseId, { projectId: r.projectId, model: r.model, createdAtMs: r.createdAtMs, deployment: r.deployment });
      if (r.seq > this.storedResponsesSeq) this.storedResponsesSeq = r.seq;
    }
  }

  /**
   * Ends what keys have open that the state just applied no longer allows (a revoked key, a blocked
   * organisation, a narrowed scope), before the ack: state/open-streams.ts holds the policy.
   */
  private endWhatNoLongerHolds(): void {
    this.opts.openStreams?.enforce(this.opts.holder.current);
  }

  /** The stream is accepted: reports and leases may use it. The node is not caught up yet (markCaughtUp). */
  private markConnected(): void {
    this.opts.leases?.setConnected(true);
    this.search.connected();
  }

  /** The stream's catch-up is applied: the node holds what the control plane held, and is no longer stale. */
  private markCaughtUp(): void {
    this.disconnectedSince = null;
    if (this.lostLogged) {
      this.lostLogged = false;
      this.opts.log('control plane connection restored');
    }
  }

  private onStatus(call: ClientDuplexStream<NodeMessage, ControlMessage>, s: StatusObject): void {
    if (this.call !== call) return;
    this.call = null;
    this.opts.reporter.detach();
    // Slices belong to a connection; until the next one the key's own limits apply locally.
    this.opts.leases?.setConnected(false);
    this.retry(s);
  }

  /** An attempt ended (its stream, or the wait for its connection): fatal, or the next attempt is timed. */
  private retry(s: StatusObject): void {
    if (this.stopped) return;
    if (s.code === GrpcStatus.FAILED_PRECONDITION) {
      // The details already say "pepper mismatch: …".
      this.opts.onFatal(`refused by control plane: ${s.details || 'pepper mismatch'}; check TOLLGATE_PEPPER or --pepper-file`);
      return;
    }
    if (s.code === GrpcStatus.UNAUTHENTICATED) {
      this.opts.onFatal(`refused by control plane: node token not accepted; check TOLLGATE_NODE_TOKEN or --node-token-file`);
      return;
    }
    if (this.disconnectedSince === null) this.disconnectedSince = this.opts.now();
    if (s.code === GrpcStatus.ALREADY_EXISTS) {
      // Another process holds this node id. Retried: a restarted node waits until its predecessor's
      // stream is gone, while a true duplicate never gets in (and is never ready).
      if (!this.lostLogged) this.opts.log(`refused by control plane: ${s.details}; retrying`);
      this.lostLogged = true;
    } else if (!this.lostLogged) {
      this.lostLogged = true;
      this.opts.log(`control plane connection lost (${describeStatus(s)}); serving from version ${this.opts.holder.current.version}, reconnecting`);
    }
    const from = this.search.address;
    const next = this.search.ended(s);
    if (next.leaderNamed !== null) this.opts.log(`control plane ${from} stands by; the leader is at ${next.leaderNamed}`);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.connect();
    }, next.delayMs);
  }
}

/** "UNAVAILABLE: No connection established", never "OK: OK" or a status name repeated. */

function describeStatus(s: StatusObject): string {
  if (s.code === GrpcStatus.OK) return 'the control plane ended the stream';
  const name = GrpcStatus[s.code] ?? String(s.code);
  const details = (s.details ?? '').trim();
  return details && details.toUpperCase() !== name && details !== name.replace(/_/g, ' ') ? `${name}: ${details}` : name;
}

/** What changes a deployment's health (not its counts): a status is sent at once when it differs from the last sent. */
function healthSignature(rows: readonly DeploymentHealth[]): string {
  let sig = '';
  for (const h of rows) sig += `${h.model}/${h.deployment}:${h.circuit}:${h.openUntilMs}:${h.coolUntilMs}:${h.consecutiveFailures};`;
  return sig;
}
