// Revoking a key ends what the key has open on every node, before each node acknowledges the
// revocation: an SSE chat stream (read with the official openai client) on one node ends with a final
// error event, and a tool download on another node is reset, both within a second of `tollgate key
// revoke` returning (in practice before it returns). Another key's open download is untouched. An organisation becoming blocked (its cap set to
// 0) ends its keys' streams the same way.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { type DemoKey } from '../helpers/console.js';
import { startFastApiBackend, type FastApiBackend } from '../helpers/fastapi-backend.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { runCliAsync, type ControlPlane, type DataPlane } from '../helpers/processes.js';

let up: FakeUpstream;
let backend: FastApiBackend;
let cp: ControlPlane;
let node: DataPlane;
/** A second node: the download runs there. */
let node2: DataPlane;
let victim: DemoKey;
let bystander: DemoKey;
let blockedOrgKey: DemoKey;

const gw = gatewayFixture(async () => {
  [up, backend] = await Promise.all([startFakeUpstream(), startFastApiBackend()]);
  const yaml = configYaml((cfg) => {
    cfg.tiers.tools = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };
    addUpstreamModel(cfg, 'up-chat', up.baseUrl, ['free', 'paid', 'tools']);
    cfg.tool_backends = [{ prefix: '/v1/files', base_urls: [backend.baseUrl], idle_timeout_ms: 60_000 }];
  });
  return { controlPlane: { configYaml: yaml, env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' } }, nodes: 2 };
}, async () => {
  cp = gw.cp;
  [node, node2] = gw.nodes;
  victim = await gw.fundedKey({ tier: 'tools' });
  bystander = await gw.fundedKey({ tier: 'tools', orgId: victim.orgId, projectId: victim.projectId, name: 'bystander' });
  blockedOrgKey = await gw.fundedKey({ tier: 'tools' });
});
after(async () => {
  await Promise.all([up?.close(), backend?.close()]);
});

/** Opens a held tool download and reads its first chunk; `ended` settles with how and when it ended. */
async function openDownload(key: string, path = '/v1/files/held', firstChunk = 'first chunk\n', on: DataPlane = node): Promise<{ ended: Promise<{ how: 'done' | 'error'; at: number; rest: string }> }> {
  const res = await fetch(`${on.url}${path}`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  const first = await reader.read();
  assert.equal(Buffer.from(first.value!).toString(), firstChunk);
  const ended = (async () => {
    let rest = '';
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return { how: 'done' as const, at: Date.now(), rest };
        rest += Buffer.from(value).toString();
      }
    } catch {
      return { how: 'error' as const, at: Date.now(), rest };
    }
  })();
  return { ended };
}

/** Opens a chat stream with the openai client and reads its first chunk; `ended` settles with how it ended. */
async function openChatStream(key: string): Promise<{ ended: Promise<{ how: 'done' | 'error'; at: number; message: string }> }> {
  up.setMode('hold-stream');
  const openai = new OpenAI({ apiKey: key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const stream = await openai.chat.completions.create({ model: 'up-chat', stream: true, messages: [{ role: 'user', content: 'Say hello' }] });
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  assert.equal(first.value.choices[0].delta.content, 'Hello');
  const ended = (async () => {
    try {
      for (;;) {
        const r = await it.next();
        if (r.done) return { how: 'done' as const, at: Date.now(), message: '' };
      }
    } catch (err) {
      return { how: 'error' as const, at: Date.now(), message: (err as Error).message };
    }
  })();
  return { ended };
}

test("a revoked key's open SSE chat stream and open tool download end within a second of `tollgate key revoke` returning", { timeout: 60_000 }, async () => {
  const chat = await openChatStream(victim.key);
  const download = await openDownload(victim.key, '/v1/files/held', 'first chunk\n', node2);
  // A tool backend's own event stream (as MCP's) is reset too, never given an event of the gateway's.
  const events = await openDownload(victim.key, '/v1/files/events', 'data: {"n":1}\n\n');
  const other = await openDownload(bystander.key);

  const upstreamLetGo = up.waitForClientClose();
  const revoke = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'key', 'revoke', victim.keyId]);
  const returnedAt = Date.now();
  assert.equal(revoke.code, 0, revoke.stderr);
  assert.deepEqual([JSON.parse(revoke.stdout).nodes_confirmed, JSON.parse(revoke.stdout).nodes_total], [2, 2]);

  const [c, d] = await Promise.all([chat.ended, download.ended]);
  assert.equal(c.how, 'error', 'the chat stream ended with an error event, not a normal end');
  assert.match(c.message, /revoked/);
  assert.ok(c.at - returnedAt < 1000, `the chat stream ended ${c.at - returnedAt} ms after the CLI returned`);
  assert.equal(d.how, 'error', 'the download was reset, not ended as if complete');
  assert.ok(d.at - returnedAt < 1000, `the download ended ${d.at - returnedAt} ms after the CLI returned`);
  const e = await events.ended;
  assert.deepEqual({ how: e.how, rest: e.rest }, { how: 'error', rest: '' });
  assert.ok(e.at - returnedAt < 1000, `the tool event stream ended ${e.at - returnedAt} ms after the CLI returned`);
  // The upstream of the chat stream was let go too.
  await upstreamLetGo;

  // The key is refused from now on; another key of the same project keeps its download.
  const again = await fetch(`${node.url}/v1/files`, { headers: { authorization: `Bearer ${victim.key}` } });
  assert.equal(again.status, 401);
  backend.release();
  const o = await other.ended;
  assert.deepEqual({ how: o.how, rest: o.rest }, { how: 'done', rest: 'last chunk\n' });
  up.setMode('normal');
  up.release();
});

test("an organisation becoming blocked ends its keys' open downloads", { timeout: 60_000 }, async () => {
  const download = await openDownload(blockedOrgKey.key);
  const cap = await runCliAsync(cp, cp.secrets.operatorToken, ['--json', 'org', 'set-cap', blockedOrgKey.orgId, '--usd', '0']);
  const returnedAt = Date.now();
  assert.equal(cap.code, 0, cap.stderr);
  const d = await download.ended;
  assert.equal(d.how, 'error');
  // The cap change is pushed to the node like any change; allow for its delivery after the CLI returned.
  assert.ok(d.at - returnedAt < 5000, `the download ended ${d.at - returnedAt} ms after the CLI returned`);
  const again = await fetch(`${node.url}/v1/files`, { headers: { authorization: `Bearer ${blockedOrgKey.key}` } });
  assert.equal(again.status, 401);
  assert.equal((await again.json()).error.code, 'invalid_api_key');
  backend.release();
});
