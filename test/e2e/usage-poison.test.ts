// An upstream that reports usage no report can carry. Before: after one answer with
// "prompt_tokens":1.5 the node's every report failed to encode ("The number 1.5 cannot be converted to
// a BigInt"), grpc-js cancelled the sync stream, the node reconnected and re-sent the same report
// forever, and a key revoked afterwards was still answered 200 by that node (0 of 0 nodes confirmed).
// Now the counts are made safe integers at the boundary: the stream stays up, the revocation reaches
// the node within 2 s, and `tollgate nodes list` shows it connected.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { startGateway } from '../helpers/gateway-fixture.js';
import { bearer, request } from '../helpers/http.js';
import { cliJsonAsync } from '../helpers/processes.js';
import { waitForUsageRows } from '../helpers/usage-db.js';

/** An OpenAI-compatible upstream whose `usage` is whatever the test queued next (raw JSON text). */
async function oddUpstream(usages: string[]): Promise<{ baseUrl: string; close(): void }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const usage = usages.shift() ?? '{"prompt_tokens":1,"completion_tokens":1}';
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":${usage}}`);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, close: () => server.close() };
}

test('usage of 1.5, "12", -3 and 1e30 tokens: recorded as safe integers, the sync stream stays up, a later revocation reaches the node within 2 s', async (t) => {
  const upstream = await oddUpstream([
    '{"prompt_tokens":1.5,"completion_tokens":2}',
    '{"prompt_tokens":"12","completion_tokens":-3}',
    '{"prompt_tokens":1e30,"completion_tokens":null}',
  ]);
  t.after(() => upstream.close());
  const gw = await startGateway(t, {
    controlPlane: { configYaml: configYaml((c) => addUpstreamModel(c, 'odd-chat', upstream.baseUrl)), env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' } },
    nodes: [{ nodeId: 'poisoned-node' }],
  });
  const [cp, dp, c] = [gw.cp, gw.node, gw.console];
  const k = await gw.fundedKey();

  for (let i = 0; i < 3; i++) {
    const r = await request(`${dp.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: { model: 'odd-chat', messages: [{ role: 'user', content: 'hi' }] } });
    assert.equal(r.status, 200, r.text);
  }
  // The reports got through (before the fix none ever did): the control plane holds the three rows.
  const rows = await waitForUsageRows(cp.dbPath, k.keyId, 3, 15_000);
  assert.deepEqual(rows.map((r) => [r.prompt_tokens, r.completion_tokens]), [[2, 2], [12, 0], [100_000_000, 0]]);
  for (const r of rows) assert.ok(Number.isSafeInteger(r.cost_micros) && r.cost_micros >= 0);
  assert.match(dp.proc.output(), /upstream reported usage\.prompt_tokens as 1\.5; recorded as 2/);

  // Revoked over the console API directly (a CLI process start would eat most of the 2 s here).
  const started = Date.now();
  const revoked = await c.revokeKey({ keyId: k.keyId });
  assert.equal(revoked.nodesTotal, 1);
  assert.equal(revoked.nodesConfirmed, 1);
  let status = 0;
  do {
    status = (await request(`${dp.url}/v1/models`, { headers: bearer(k.key) })).status;
  } while (status !== 401 && Date.now() - started < 2000);
  const refusedAfterMs = Date.now() - started;
  assert.equal(status, 401, 'the revoked key is refused by the node');
  assert.ok(refusedAfterMs < 2000, `refused ${refusedAfterMs} ms after the revocation started (at most 2000)`);
  const nodes = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['nodes', 'list'])).nodes;
  const node = nodes.find((n: any) => n.id === 'poisoned-node');
  assert.equal(node?.connected, true);
  assert.doesNotMatch(dp.proc.output(), /serialization failure|cannot be converted to a BigInt|connection lost/);
});
