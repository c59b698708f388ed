// The sync service's snapshot/delta/ack protocol, against a fake stream in place of gRPC. Like
// go-control-plane's mockStream, the fake checks the protocol's invariants on every message the
// service sends, so every test below also checks them:
// - a delta applies on top of exactly the version the node holds (from = held, to > from);
// - the versions a node holds only go up (a snapshot never takes it back);
// - nothing is written while the stream pushed back (write returned false) until 'drain', nor after
//   the stream ended;
// - caught_up never names a version the node does not hold yet;
// - the parts of a snapshot in parts come in order, each of a bounded size, to a node that asked for parts.
// At the end of each test, the node's copy (snapshot plus deltas applied) equals the store's state.
// Leases and report ingest are not covered here.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { test } from 'node:test';
import { Metadata, status } from '@grpc/grpc-js';
import { SyncService } from '../../control-plane/sync/sync-service.js';
import { SnapshotStore } from '../../control-plane/state/snapshot-store.js';
import type { ControlState } from '../../control-plane/state/control-state.js';
import type { ReportIngest } from '../../control-plane/sync/report-ingest.js';
import { GatewayConfig, Hello, KeyEntry, type Change, type ControlMessage, type NodeMessage, type Snapshot } from '../../proto/gen/tollgate/v1/sync.js';
import { pepperCheck } from '../../proto/lib/keys.js';

const NODE_TOKEN = 'node-token-for-the-unit-test';
const PEPPER = Buffer.from('pepper-for-the-unit-test', 'utf8');

const key = (id: string): KeyEntry => KeyEntry.fromPartial({ keyId: id, keyHash: `hash-${id}`, projectId: 'p', orgId: 'o', rpmLimit: 20, tpmLimit: 60_000, maxParallelRequests: 100 });

/** What a node holds: the state built from the snapshot and the deltas it received. */
interface Held {
  version: number;
  keys: Map<string, KeyEntry>;
}

/**
 * A ServerDuplexStream stand-in. `write` checks the invariants and throws on a violation (the
 * service catches a throwing write and drops the session, so violations are also kept in
 * `violations` and asserted by `check()`).
 */
class FakeStream extends EventEmitter {
  readonly metadata = new Metadata();
  readonly sent: ControlMessage[] = [];
  readonly violations: string[] = [];
  /** Set by the service's fail(): the status it ended the call with. */
  failure: { code: number; details: string } | undefined;
  held: Held | undefined;
  /** The version the node said it holds in Hello (a delta may start there). */
  private helloVersion: number | undefined;
  /** The node takes snapshots in parts (Hello.snapshot_parts) of at most this many entries (0: whole). */
  private partEntries = 0;
  /** A snapshot in parts being received: what its parts so far carried. */
  private assembling: { version: number; next: number; count: number; keys: KeyEntry[] } | null = null;
  /** write() returns false from now on, until unblock() (which emits 'drain'). */
  private blocked = false;
  private mustWaitForDrain = false;
  ended = false;
  paused = false;
  cancelled = false;

  constructor(token = NODE_TOKEN) {
    super();
    this.metadata.set('authorization', `Bearer ${token}`);
    this.on('error', (e: { code: number; details: string }) => {
      this.failure = e;
    });
  }

  private violate(what: string): never {
    this.violations.push(what);
    throw new Error(`protocol violation: ${what}`);
  }

  write(msg: ControlMessage): boolean {
    if (this.ended) this.violate(`write after end: ${JSON.stringify(Object.keys(msg))}`);
    if (this.mustWaitForDrain) this.violate('write after write() returned false and before drain');
    if (this.assembling && !msg.snapshot?.part) this.violate(`${Object.keys(msg).join()} between the parts of a snapshot`);
    if (msg.snapshot?.part) this.applyPart(msg.snapshot);
    else if (msg.snapshot) this.applySnapshot(msg.snapshot);
    else if (msg.delta) {
      const d = msg.delta;
      const holds = this.held?.version ?? this.helloVersion;
      if (holds === undefined) this.violate(`delta ${d.fromVersion}→${d.toVersion} before any snapshot, to a node that holds nothing`);
      if (d.fromVersion !== holds) this.violate(`delta ${d.fromVersion}→${d.toVersion} on a node that holds ${holds}`);
      if (!(d.toVersion > d.fromVersion)) this.violate(`delta ${d.fromVersion}→${d.toVersion} does not move forward`);
      if (d.changes.length !== d.toVersion - d.fromVersion) this.violate(`delta ${d.fromVersion}→${d.toVersion} carries ${d.changes.length} changes`);
      if (!this.held) this.violate('a catch-up delta for a node this fake did not seed (use seed())');
      for (const c of d.changes) applyChange(this.held.keys, c);
      this.held.version = d.toVersion;
    } else if (msg.caughtUp) {
      const holds = this.held?.version ?? this.helloVersion ?? 0;
      if (msg.caughtUp.version > holds) this.violate(`caught_up at ${msg.caughtUp.version} while the node holds ${holds}`);
    }
    this.sent.push(msg);
    if (this.blocked) {
      this.mustWaitForDrain = true;
      return false;
    }
    return true;
  }

  private applyPart(s: Snapshot): void {
    const p = s.part!;
    if (this.partEntries === 0) this.violate('a snapshot in parts to a node that did not ask for parts');
    if (s.keys.length + s.tombstones.length > this.partEntries) this.violate(`a part of ${s.keys.length + s.tombstones.length} entries`);
    if (p.index === 0) this.assembling = { version: s.version, next: 0, count: p.count, keys: [] };
    const a = this.assembling;
    if (!a || p.index !== a.next || p.count !== a.count || s.version !== a.version) this.violate(`part ${p.index} of ${p.count} out of order`);
    a.keys.push(...s.keys);
    a.next++;
    if (a.next === a.count) {
      this.assembling = null;
      this.applySnapshot({ ...s, keys: a.keys, part: undefined });
    }
  }

  private applySnapshot(s: Snapshot): void {
    const holds = this.held?.version ?? this.helloVersion ?? 0;
    if (s.version < holds) this.violate(`snapshot at ${s.version} takes a node that holds ${holds} back`);
    this.held = { version: s.version, keys: new Map(s.keys.map((k) => [k.keyHash, k])) };
  }

  /** The node already holds this state (from an earlier connection) and says so in Hello. */
  seed(version: number, keys: KeyEntry[]): void {
    this.helloVersion = version;
    this.held = { version, keys: new Map(keys.map((k) => [k.keyHash, k])) };
  }

  hello(haveVersion = this.held?.version ?? 0, nodeId = 'node-a', partEntries = 0): void {
    this.helloVersion = haveVersion > 0 ? haveVersion : undefined;
    this.partEntries = partEntries;
    this.send({ hello: Hello.fromPartial({ nodeId, instanceId: `inst-${nodeId}`, pepperCheck: pepperCheck(PEPPER), haveVersion, listenAddress: '127.0.0.1:1', snapshotParts: partEntries > 0 }) });
  }

  send(msg: NodeMessage): void {
    this.emit('data', msg);
  }

  ack(version: number): void {
    this.send({ ack: { version } });
  }

  /** The stream pushes back: write() returns false until unblock(). */
  block(): void {
    this.blocked = true;
  }

  unblock(): void {
    this.blocked = false;
    if (this.mustWaitForDrain) {
      this.mustWaitForDrain = false;
      this.emit('drain');
    }
  }

  pause(): this {
    this.paused = true;
    return this;
  }

  resume(): this {
    this.paused = false;
    return this;
  }

  end(): void {
    this.ended = true;
  }

  /** The node goes away. */
  disconnect(): void {
    this.emit('cancelled');
    this.emit('close');
  }

  kinds(from = 0): string[] {
    return this.sent.slice(from).map((m) => Object.keys(m).find((k) => (m as Record<string, unknown>)[k] !== undefined)!);
  }

  versions(from = 0): string[] {
    return this.sent
      .slice(from)
      .filter((m) => m.snapshot || m.delta)
      .map((m) => (m.snapshot ? `snapshot@${m.snapshot.version}` : `delta ${m.delta!.fromVersion}→${m.delta!.toVersion}`));
  }

  /** No violation so far, and the node's copy equals the store's state. */
  check(store: SnapshotStore): void {
    assert.deepEqual(this.violations, []);
    assert.ok(this.held, 'the node holds a state');
    assert.equal(this.held.version, store.version, 'the node holds the current version');
    const want = new Map(store.snapshot().keys.map((k) => [k.keyHash, k]));
    assert.deepEqual([...this.held.keys.keys()].sort(), [...want.keys()].sort(), 'the node holds the same keys');
  }
}

function applyChange(keys: Map<string, KeyEntry>, c: Change): void {
  if (c.keyUpsert) keys.set(c.keyUpsert.keyHash, c.keyUpsert);
  else if (c.keyRemoved !== undefined) keys.delete(c.keyRemoved);
}

function setup(opts: { version?: number; maxRetained?: number; partEntries?: number } = {}) {
  const store = new SnapshotStore({ version: 0, config: GatewayConfig.fromPartial({ serviceName: 'tollgate' }), keys: [], orgs: [], maxRetained: opts.maxRetained ?? 100 });
  let version = 0;
  const apply = (change: Change = { keyUpsert: key(`k${version + 1}`) }) => store.apply(++version, change);
  for (let i = 0; i < (opts.version ?? 0); i++) apply();
  const logs: string[] = [];
  // The node bookkeeping writes go to a database the service does not wait for; this one refuses
  // them (logged, as a failed write is), which the protocol does not depend on.
  const db = {} as ControlState['db'];
  const state = { snapshots: store, db, now: () => 1_700_000_000_000, nowIso: () => new Date(1_700_000_000_000).toISOString() } as unknown as ControlState;
  const sync = new SyncService(state, {} as ReportIngest, { nodeToken: NODE_TOKEN, pepperCheck: pepperCheck(PEPPER), log: (l) => logs.push(l), snapshotPartEntries: opts.partEntries });
  const connect = (stream: FakeStream) => sync.handlers().connect(stream as never);
  return { store, apply, sync, connect, logs, version: () => version };
}

test('a node that holds nothing gets a snapshot of the current version, then caught_up, then one delta per new version', () => {
  const { store, apply, connect } = setup({ version: 5 });
  const s = new FakeStream();
  connect(s);
  s.hello(0);
  assert.deepEqual(s.versions(), ['snapshot@5']);
  const caught = s.sent.find((m) => m.caughtUp);
  assert.equal(caught?.caughtUp?.version, 5);
  assert.ok(s.kinds().indexOf('snapshot') < s.kinds().indexOf('caughtUp'), 'the snapshot precedes caught_up');
  const before = s.sent.length;
  apply();
  apply({ keyRemoved: 'hash-k2' });
  apply();
  assert.deepEqual(s.versions(before), ['delta 5→6', 'delta 6→7', 'delta 7→8']);
  s.check(store);
});

test('a node whose version is still retained gets one catch-up delta from it, no snapshot', () => {
  const { store, apply, connect } = setup({ version: 3 });
  const s = new FakeStream();
  s.seed(3, store.snapshot().keys);
  for (let i = 0; i < 4; i++) apply();
  connect(s);
  s.hello(3);
  assert.deepEqual(s.versions(), ['delta 3→7']);
  assert.equal(s.sent.find((m) => m.caughtUp)?.caughtUp?.version, 7);
  s.check(store);
});

test('a node at the current version gets no snapshot and no delta, only caught_up; later changes arrive as deltas', () => {
  const { store, apply, connect } = setup({ version: 4 });
  const s = new FakeStream();
  s.seed(4, store.snapshot().keys);
  connect(s);
  s.hello(4);
  assert.deepEqual(s.versions(), []);
  assert.equal(s.sent.find((m) => m.caughtUp)?.caughtUp?.version, 4);
  apply();
  assert.deepEqual(s.versions(), ['delta 4→5']);
  s.check(store);
});

test('after a gap (the node is older than what is retained, or claims a version the store never had) a snapshot comes first', () => {
  const { store, apply, connect } = setup({ version: 2, maxRetained: 3 });
  const old = store.snapshot();
  for (let i = 0; i < 6; i++) apply();
  const behind = new FakeStream();
  behind.seed(2, old.keys);
  connect(behind);
  behind.hello(2);
  assert.deepEqual(behind.versions(), ['snapshot@8']);
  behind.check(store);

  // A node that says it holds 50 when the store is at 8 (it synced from another database): what it
  // holds is unknown, so a delta of any kind would be a violation; it must get a snapshot at 8.
  const ahead = new FakeStream();
  connect(ahead);
  ahead.send({ hello: Hello.fromPartial({ nodeId: 'node-b', instanceId: 'inst-b', pepperCheck: pepperCheck(PEPPER), haveVersion: 50, listenAddress: '' }) });
  assert.deepEqual(ahead.versions(), ['snapshot@8']);
  ahead.check(store);
});

test('while the stream pushes back nothing more is written; after drain the deltas continue where they stopped', () => {
  const { store, apply, connect } = setup({ version: 1 });
  const s = new FakeStream();
  connect(s);
  s.hello(0);
  s.block();
  apply(); // written: write() returns false on it
  const written = s.sent.length;
  for (let i = 0; i < 20; i++) apply();
  assert.equal(s.sent.length, written, 'nothing written until drain');
  s.unblock();
  assert.deepEqual(s.versions(), ['snapshot@1', ...Array.from({ length: 21 }, (_, i) => `delta ${i + 1}→${i + 2}`)]);
  s.check(store);
});

test('a node too far behind a pushed-back stream gets one fresh snapshot instead of a queue of deltas, then deltas from it', () => {
  const { store, apply, connect } = setup({ version: 1, maxRetained: 5000 });
  const s = new FakeStream();
  connect(s);
  s.hello(0);
  s.block();
  apply();
  const mark = s.sent.length;
  for (let i = 0; i < 1500; i++) apply();
  assert.equal(s.sent.length, mark);
  s.unblock();
  const after = s.versions(mark);
  assert.equal(after[0], `snapshot@${store.version}`, 'the backlog of deltas became one snapshot');
  assert.equal(after.length, 1, `no stale delta after it: ${after.slice(0, 5).join(', ')}`);
  apply();
  assert.deepEqual(s.versions(mark + 1).slice(-1), [`delta ${store.version - 1}→${store.version}`]);
  s.check(store);
});

test('acks move forward only; awaitAcks resolves once every node acked the version', async () => {
  const { store, apply, connect, sync } = setup({ version: 2 });
  const a = new FakeStream();
  const b = new FakeStream();
  connect(a);
  a.hello(0, 'node-a');
  connect(b);
  b.hello(0, 'node-b');
  apply();
  apply();
  const waiting = sync.awaitAcks(4, 10_000);
  a.ack(4);
  a.ack(2); // a stale ack
  assert.deepEqual(
    sync.liveNodes().map((n) => [n.id, n.ackedVersion]),
    [
      ['node-a', 4],
      ['node-b', 0],
    ],
  );
  b.ack(3);
  b.ack(4);
  assert.deepEqual(await waiting, { total: 2, confirmed: 2, unconfirmed: [] });
  assert.deepEqual(await sync.awaitAcks(3, 10), { total: 2, confirmed: 2, unconfirmed: [] }, 'an older version is already acked');
  a.check(store);
  b.check(store);
});

test('a node that leaves is counted as unconfirmed at once, and nothing is written to its stream after', async () => {
  const { apply, connect, sync } = setup({ version: 1 });
  const s = new FakeStream();
  connect(s);
  s.hello(0);
  apply();
  const waiting = sync.awaitAcks(2, 10_000);
  s.disconnect();
  assert.deepEqual(await waiting, { total: 1, confirmed: 0, unconfirmed: ['node-a'] });
  const count = s.sent.length;
  s.ended = true; // a write now would be a violation
  apply();
  assert.equal(s.sent.length, count);
  assert.deepEqual(s.violations, []);
  assert.equal(sync.connectedCount(), 0);
});

test('a resync request is answered with a snapshot of the current version; deltas continue from it', () => {
  const { store, apply, connect } = setup({ version: 3 });
  const s = new FakeStream();
  connect(s);
  s.hello(0);
  apply();
  s.send({ resync: { haveVersion: 4, reason: 'unit test' } });
  apply();
  assert.deepEqual(s.versions(), ['snapshot@3', 'delta 3→4', 'snapshot@4', 'delta 4→5']);
  s.check(store);
});

test('a wrong node token or a first message other than hello ends the stream with a status and writes nothing', () => {
  const { connect, sync } = setup({ version: 1 });
  const wrong = new FakeStream('not-the-token');
  connect(wrong);
  assert.equal(wrong.failure?.code, status.UNAUTHENTICATED);
  const noHello = new FakeStream();
  connect(noHello);
  noHello.ack(1);
  assert.equal(noHello.failure?.code, status.FAILED_PRECONDITION);
  const badPepper = new FakeStream();
  connect(badPepper);
  badPepper.send({ hello: Hello.fromPartial({ nodeId: 'x', instanceId: 'i', pepperCheck: pepperCheck(Buffer.from('another pepper')), haveVersion: 0, listenAddress: '' }) });
  assert.equal(badPepper.failure?.code, status.FAILED_PRECONDITION);
  for (const s of [wrong, noHello, badPepper]) assert.deepEqual(s.sent, []);
  assert.equal(sync.connectedCount(), 0);
});

test('the fake stream itself refuses what the protocol forbids (so the tests above can fail)', () => {
  const s = new FakeStream();
  s.hello(0);
  assert.throws(() => s.write({ delta: { fromVersion: 0, toVersion: 1, changes: [{ keyUpsert: key('a') }] } }), /before any snapshot/);
  s.write({ snapshot: { version: 3, config: undefined, keys: [], orgs: [], tombstones: [] } });
  assert.throws(() => s.write({ delta: { fromVersion: 2, toVersion: 4, changes: [{}, {}] } }), /holds 3/);
  assert.throws(() => s.write({ snapshot: { version: 2, config: undefined, keys: [], orgs: [], tombstones: [] } }), /back/);
  assert.throws(() => s.write({ caughtUp: { version: 9 } }), /holds 3/);
  s.block();
  s.write({ delta: { fromVersion: 3, toVersion: 4, changes: [{ keyUpsert: key('b') }] } });
  assert.throws(() => s.write({ delta: { fromVersion: 4, toVersion: 5, changes: [{ keyUpsert: key('c') }] } }), /before drain/);
  assert.equal(s.violations.length, 5);
});

test('a node that asks for parts gets a large snapshot in parts, in order, then caught_up; a node that does not gets it whole', () => {
  const { store, apply, connect } = setup({ version: 23, partEntries: 5 });
  const parts = new FakeStream();
  connect(parts);
  parts.hello(0, 'node-a', 5);
  const snaps = parts.sent.filter((m) => m.snapshot);
  assert.deepEqual(snaps.map((m) => m.snapshot!.part?.index), [0, 1, 2, 3, 4], '23 keys in parts of 5');
  assert.ok(parts.kinds().lastIndexOf('snapshot') < parts.kinds().indexOf('caughtUp'), 'caught_up after the last part');
  apply();
  assert.deepEqual(parts.versions().slice(-1), ['delta 23→24']);
  parts.check(store);
  const whole = new FakeStream();
  connect(whole);
  whole.hello(0, 'node-b');
  assert.deepEqual(whole.versions(), ['snapshot@24']);
  assert.equal(whole.sent.find((m) => m.snapshot)!.snapshot!.part, undefined);
  whole.check(store);
});

test('the parts of a snapshot wait for drain like any message; a backlog while they wait becomes one fresh snapshot in parts', () => {
  const { store, apply, connect } = setup({ version: 12, partEntries: 4, maxRetained: 5000 });
  const s = new FakeStream();
  s.block();
  connect(s);
  s.hello(0, 'node-a', 4);
  assert.equal(s.sent.length, 1, 'one part written, then the stream pushed back');
  s.unblock();
  assert.deepEqual(s.sent.filter((m) => m.snapshot).map((m) => m.snapshot!.part?.index), [0, 1, 2]);
  // Pushed back in the middle of a new snapshot's parts, with a backlog past the queue's bound.
  s.block();
  s.send({ resync: { haveVersion: 12, reason: 'test' } });
  const mark = s.sent.length;
  for (let i = 0; i < 1500; i++) apply();
  s.unblock();
  const after = s.sent.slice(mark).filter((m) => m.snapshot || m.delta);
  assert.ok(after.every((m) => m.snapshot), 'no delta: the backlog became a snapshot');
  assert.equal(after.at(-1)!.snapshot!.version, store.version);
  s.check(store);
});
