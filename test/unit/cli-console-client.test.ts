// The CLI's client of the console API given several control planes: an address whose connection is
// never made is passed over after the connect timeout, not after the call's whole deadline.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { silentPeer } from '../helpers/silent-peer.js';
import { Server, ServerCredentials, type sendUnaryData, type ServerUnaryCall } from '@grpc/grpc-js';
import { ConsoleServiceService, type WhoAmIResponse } from '../../proto/gen/tollgate/v1/console.js';
import { ConsoleClient } from '../../cli/console-client.js';
import { CONNECT_TIMEOUT_MS } from '../../proto/lib/connection-wait.js';

test('an address that takes the connection but never answers is passed over after the connect timeout', async (t) => {
  // Before, the call waited there for its whole deadline (30 s) and failed DEADLINE_EXCEEDED, never
  // trying the next address: a control plane's machine gone made the CLI fail with the leader up.
  const silentPort = await silentPeer(t);
  const server = new Server();
  // Only whoAmI is called; the rest of the service is never reached.
  server.addService(ConsoleServiceService, {
    whoAmI: (_call: ServerUnaryCall<unknown, WhoAmIResponse>, cb: sendUnaryData<WhoAmIResponse>) => cb(null, { operator: true } as WhoAmIResponse),
  } as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  t.after(() => server.forceShutdown());
  const client = new ConsoleClient(`127.0.0.1:${silentPort},127.0.0.1:${port}`, 'token');
  t.after(() => client.close());
  const started = Date.now();
  const who = await client.whoAmI();
  assert.equal(who.operator, true);
  assert.ok(Date.now() - started < CONNECT_TIMEOUT_MS + 2_000, `answered after ${Date.now() - started} ms`);
});
