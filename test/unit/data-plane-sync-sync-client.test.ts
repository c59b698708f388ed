// A node that reconnects stays stale until its catch-up is applied. The control plane here is a fake
// SyncService on a loopback port that sends the stream's headers and then holds the catch-up until the
// test releases it. And an address that never answers is given up after the connect timeout.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { silentPeer } from '../helpers/silent-peer.js';
import { Metadata, Server, ServerCredentials, type ServerDuplexStream } from '@grpc/grpc-js';
import { SyncServiceService, type ControlMessage, type NodeMessage } from '../../proto/gen/tollgate/v1/sync.js';
import { StateHolder } from '../../data-plane/state/key-table.js';
import { SyncClient } from '../../data-plane/sync/sync-client.js';
import { CONNECT_TIMEOUT_MS } from '../../proto/lib/connection-wait.js';
import type { Reporter } from '../../data-plane/sync/reporter.js';

type Call = ServerDuplexStream<NodeMessage, ControlMessage>;

/** Resolves the next time `pick` returns a value for an event pushed into the list. */
class Events<T> {
  private items: T[] = [];
  private waiters: Array<() => void> = [];
  push(item: T): void {
    this.items.push(item);
    for (const w of this.waiters.splice(0)) w();
  }
  async next(match: (item: T) => boolean, what: string): Promise<T> {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const i = this.items.findIndex(match);
      if (i !== -1) return this.items.splice(i, 1)[0];
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 10_000);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }
}

const KEY = { keyId: 'key_1', keyHash: 'a'.repeat(64), projectId: 'proj_1', orgId: 'org_1', allowedModels: [], rpmLimit: 20, tpmLimit: 60_000, maxParallelRequests: 100 };
const ORG = { orgId: 'org_1', tier: 'free', blocked: false, blockedReason: '', fundsVersion: 1, ownerAccountId: '' };

async function setUp(t: import('node:test').TestContext) {
  const streams = new Events<Call>();
  const fromNode = new Events<{ call: Call; msg: NodeMessage }>();
  const server = new Server();
  server.addService(SyncServiceService, {
    connect: (call: Call) => {
      call.on('data', (msg: NodeMessage) => {
        if (msg.hello) streams.push(call);
        else fromNode.push({ call, msg });
      });
      call.on('error', () => {});
    },
  });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  const holder = new StateHolder();
  const accepted = new Events<number>();
  const acks = new Events<number>();
  const logs = new Events<string>();
  let attached = 0;
  const reporter = {
    attach: () => accepted.push(++attached),
    detach: () => {},
    ack: (seq: number) => acks.push(seq),
  } as unknown as Reporter;
  let now = 1_000_000;
  const client = new SyncClient({
    address: `127.0.0.1:${port}`,
    nodeToken: 'node-token',
    nodeId: 'n1',
    instanceId: 'i1',
    pepperCheck: 'check',
    listenAddress: '127.0.0.1:1',
    holder,
    reporter,
    now: () => now,
    onFirstSnapshot: () => {},
    onFatal: (line) => assert.fail(line),
    log: (line) => logs.push(line),
    minBackoffMs: 1,
    maxBackoffMs: 5,
  });
  t.after(() => {
    client.stop();
    server.forceShutdown();
  });
  client.start();
  // First stream: a snapshot at version 5 with one key; the node is caught up.
  const first = await streams.next(() => true, 'the first hello');
  first.write({ snapshot: { version: 5, config: undefined, keys: [KEY], orgs: [ORG], tombstones: [] } });
  await fromNode.next((e) => e.msg.ack?.version === 5, 'ack of the snapshot');
  assert.equal(client.disconnectedSince, null);
  // The control plane goes away: the node is cut off from now on.
  first.end();
  await logs.next((l) => l.includes('connection lost'), 'the loss');
  now += 60_000;
  const cutOffSince = client.disconnectedSince;
  assert.notEqual(cutOffSince, null);
  return { client, holder, streams, fromNode, accepted, acks, logs, cutOffSince };
}

test('a reconnecting node stays stale after the stream is accepted, until its catch-up delta is applied', async (t) => {
  // Before the fix the node stopped being stale on the new stream's response headers, before its
  // catch-up was in: a node that had been cut off past its maximum staleness served again from its old
  // state, with keys revoked meanwhile still authenticating.
  const { client, holder, streams, fromNode, accepted } = await setUp(t);
  const second = await streams.next(() => true, 'the second hello');
  second.sendMetadata(new Metadata());
  await accepted.next((n) => n === 2, 'the second stream accepted');
  assert.ok(holder.current.keysByHash.has(KEY.keyHash), 'still the old state');
  assert.notEqual(client.disconnectedSince, null, 'stale while the catch-up is not in');
  // The catch-up: the key was revoked while the node was cut off.
  second.write({ delta: { fromVersion: 5, toVersion: 6, changes: [{ keyRemoved: KEY.keyHash }] } });
  second.write({ caughtUp: { version: 6 } });
  await fromNode.next((e) => e.msg.ack?.version === 6, 'ack of the catch-up delta');
  assert.equal(holder.current.keysByHash.has(KEY.keyHash), false);
  assert.equal(client.disconnectedSince, null);
});

test('with nothing to catch up, CaughtUp ends staleness; after a gap only the resync snapshot does', async (t) => {
  const { client, holder, streams, fromNode, accepted, acks, logs } = await setUp(t);
  // Nothing changed while the node was away: the control plane sends only CaughtUp at the node's version.
  const second = await streams.next(() => true, 'the second hello');
  second.sendMetadata(new Metadata());
  await accepted.next((n) => n === 2, 'the second stream accepted');
  assert.notEqual(client.disconnectedSince, null);
  second.write({ caughtUp: { version: 5 } });
  await logs.next((l) => l.includes('connection restored'), 'caught up');
  assert.equal(client.disconnectedSince, null);

  // Cut off again; this time the catch-up does not fit (a gap): the node asks for a snapshot and stays
  // stale after CaughtUp, until that snapshot is applied.
  second.end();
  await logs.next((l) => l.includes('connection lost'), 'the second loss');
  const third = await streams.next(() => true, 'the third hello');
  third.write({ delta: { fromVersion: 7, toVersion: 8, changes: [] } });
  await fromNode.next((e) => e.msg.resync !== undefined, 'the resync request');
  third.write({ caughtUp: { version: 8 } });
  // A report ack after CaughtUp: once it is handled, CaughtUp was too.
  third.write({ reportAck: { seq: 1, instanceId: 'i1' } });
  await acks.next((s) => s === 1, 'the report ack');
  assert.notEqual(client.disconnectedSince, null, 'stale: the catch-up is not applied');
  third.write({ snapshot: { version: 8, config: undefined, keys: [], orgs: [ORG], tombstones: [] } });
  await fromNode.next((e) => e.msg.ack?.version === 8, 'ack of the snapshot');
  assert.equal(client.disconnectedSince, null);
  assert.equal(holder.current.version, 8);
});

test('an address that takes the connection but never answers is given up after the connect timeout, and the next one tried', async (t) => {
  // Before, a stream to a control plane whose machine had gone (a TCP peer that never answers) waited
  // for ever (grpc-js has no connect timeout): a node given that address first, or retrying a leader
  // that vanished, never tried the standby that now leads.
  const silentPort = await silentPeer(t);
  const streams = new Events<Call>();
  const server = new Server();
  server.addService(SyncServiceService, {
    connect: (call: Call) => {
      call.on('data', (msg: NodeMessage) => msg.hello && streams.push(call));
      call.on('error', () => {});
    },
  });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  const logs: string[] = [];
  const client = new SyncClient({
    address: `127.0.0.1:${silentPort},127.0.0.1:${port}`,
    nodeToken: 'node-token',
    nodeId: 'n1',
    instanceId: 'i1',
    pepperCheck: 'check',
    listenAddress: '127.0.0.1:1',
    holder: new StateHolder(),
    reporter: { attach: () => {}, detach: () => {}, ack: () => {} } as unknown as Reporter,
    now: () => Date.now(),
    onFirstSnapshot: () => {},
    onFatal: (line) => assert.fail(line),
    log: (line) => logs.push(line),
  });
  t.after(() => {
    client.stop();
    server.forceShutdown();
  });
  const started = Date.now();
  client.start();
  await streams.next(() => true, 'a hello on the second address');
  assert.ok(Date.now() - started < CONNECT_TIMEOUT_MS + 2_000, `${Date.now() - started} ms`);
  assert.match(logs.join('\n'), new RegExp(`control plane connection lost \\(UNAVAILABLE: no connection within ${CONNECT_TIMEOUT_MS} ms\\)`));
});
