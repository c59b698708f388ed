// The node's reader of usage (data-plane/sync/usage-client.ts) against a gRPC server on loopback: what
// each control-plane answer becomes for the client, the 503 at once while the sync stream is down, and
// the bound on reads waiting at one node.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Server, ServerCredentials, status, type sendUnaryData, type ServerUnaryCall } from '@grpc/grpc-js';
import { SyncServiceService, type QueryUsageRequest, type QueryUsageResponse } from '../../proto/gen/tollgate/v1/sync.js';
import { GatewayError } from '../../data-plane/errors.js';
import { MAX_USAGE_QUERIES_IN_FLIGHT, UsageClient } from '../../data-plane/sync/usage-client.js';

let server: Server;
let address: string;
const held: Array<sendUnaryData<QueryUsageResponse>> = [];
const seenTokens: string[] = [];

before(async () => {
  server = new Server();
  server.addService(SyncServiceService, {
    connect: (call: any) => call.end(),
    queryUsage: (call: ServerUnaryCall<QueryUsageRequest, QueryUsageResponse>, cb: sendUnaryData<QueryUsageResponse>) => {
      seenTokens.push(String(call.metadata.get('authorization')[0]));
      const k = call.request.keyId;
      if (k === 'ok') cb(null, { projectId: 'proj_a', buckets: [] });
      else if (k === 'gone') cb({ code: status.NOT_FOUND, details: 'no such key' });
      else if (k === 'bad') cb({ code: status.INVALID_ARGUMENT, details: 'bad' });
      else if (k === 'busy') cb({ code: status.RESOURCE_EXHAUSTED, details: 'busy' });
      else held.push(cb); // 'hold': answered at the end
    },
  });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  address = `127.0.0.1:${port}`;
});
after(() => server.forceShutdown());

function ask(client: UsageClient, keyId: string): Promise<{ err: GatewayError | null; res?: QueryUsageResponse }> {
  return new Promise((resolve) => client.query({ keyId, sinceMs: 0, untilMs: 0, groupBy: 'day' }, (err, res) => resolve({ err, res })));
}

test('control-plane answers become 200, 401, 500 or 503 with retry-after', async () => {
  const client = new UsageClient({ address, nodeToken: 'node-secret', tls: null, connected: () => true });
  try {
    assert.deepEqual(await ask(client, 'ok'), { err: null, res: { projectId: 'proj_a', buckets: [] } });
    assert.equal(seenTokens.at(-1), 'Bearer node-secret');
    assert.equal((await ask(client, 'gone')).err?.code, 'KEY_INVALID');
    assert.equal((await ask(client, 'bad')).err?.code, 'INTERNAL');
    const busy = (await ask(client, 'busy')).err!;
    assert.equal(busy.code, 'CONTROL_PLANE_UNAVAILABLE');
    assert.equal(busy.retryAfterSec, 5);
  } finally {
    client.close();
  }
});

test('while the sync stream is down the answer is 503 at once, without a call', async () => {
  const client = new UsageClient({ address, nodeToken: 'node-secret', tls: null, connected: () => false });
  const calls = seenTokens.length;
  let answered = false;
  client.query({ keyId: 'ok', sinceMs: 0, untilMs: 0, groupBy: 'day' }, (err) => {
    answered = true;
    assert.equal(err?.code, 'CONTROL_PLANE_UNAVAILABLE');
  });
  assert.equal(answered, true, 'answered synchronously');
  const up = new UsageClient({ address, nodeToken: 'x', tls: null, connected: () => true });
  await ask(up, 'ok');
  assert.equal(seenTokens.length, calls + 1, 'only the second client called');
  up.close();
  client.close();
});

test(`at most ${MAX_USAGE_QUERIES_IN_FLIGHT} reads wait at one node; a slow one times out as 503; cancel ends one`, async () => {
  const client = new UsageClient({ address, nodeToken: 'node-secret', tls: null, connected: () => true, timeoutMs: 60_000 });
  try {
    const waiting = Array.from({ length: MAX_USAGE_QUERIES_IN_FLIGHT }, () => ask(client, 'hold'));
    // Wait until the server holds them all, then one more is refused at once.
    while (held.length < MAX_USAGE_QUERIES_IN_FLIGHT) await new Promise((r) => setTimeout(r, 10));
    assert.equal((await ask(client, 'ok')).err?.code, 'CONTROL_PLANE_UNAVAILABLE');
    for (const cb of held.splice(0)) cb(null, { projectId: 'proj_a', buckets: [] });
    for (const r of await Promise.all(waiting)) assert.equal(r.err, null);
    // Room again.
    assert.equal((await ask(client, 'ok')).err, null);
  } finally {
    client.close();
  }
  const slow = new UsageClient({ address, nodeToken: 'node-secret', tls: null, connected: () => true, timeoutMs: 200 });
  const timedOut = await ask(slow, 'hold');
  assert.equal(timedOut.err?.code, 'CONTROL_PLANE_UNAVAILABLE');
  let cancelled: GatewayError | null | undefined;
  const done = new Promise<void>((resolve) => {
    const cancel = slow.query({ keyId: 'hold', sinceMs: 0, untilMs: 0, groupBy: 'day' }, (err) => {
      cancelled = err;
      resolve();
    });
    cancel();
  });
  await done;
  assert.equal(cancelled?.code, 'CONTROL_PLANE_UNAVAILABLE');
  slow.close();
  for (const cb of held.splice(0)) cb(null, { projectId: 'p', buckets: [] });
});
