// What an operator sees, following the README: revocation names the nodes that did not confirm and
// the known nodes that are cut off; a second node under an id already connected is refused, named;
// `models list` shows audio prices; `nodes list` shows lag, last report and journal depth; an
// upstream key can come from a file and change with `config reload`; and the messages that were
// wrong before: "connection lost (OK: OK)", "pepper mismatch (pepper mismatch: …)", a 401 with no hint.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { eventually } from '../helpers/data-plane.js';
import { startFakeNode } from '../helpers/fake-node.js';
import { startFakeUpstream } from '../helpers/fake-upstream.js';
import { startGateway } from '../helpers/gateway-fixture.js';
import { bearer, chatBody, request } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, startControlPlane, startDataPlane, stopAll, tempDir } from '../helpers/processes.js';

after(stopAll);

test('key revoke names the connected nodes that did not confirm and the known nodes that are not connected', async (t) => {
  const gw = await startGateway(t, { controlPlane: { extraArgs: ['--revoke-ack-timeout-ms', '1500'] }, nodes: 0 });
  const [cp, c] = [gw.cp, gw.console];
  const op = cp.secrets.operatorToken;
  const live = await gw.addNode({ nodeId: 'edge-live' });
  const gone = await gw.addNode({ nodeId: 'edge-gone' });
  await gone.proc.kill('SIGKILL');
  await eventually(async () => (await c.listNodes()).nodes.some((n) => n.id === 'edge-gone' && !n.connected), 'edge-gone to be seen as disconnected');
  const holder = await startFakeNode(cp, { nodeId: 'edge-stuck', holdAcks: true });
  t.after(() => holder.close());

  const doomed = await gw.fundedKey({ knownOn: [live] });
  const r = await runCliAsync(cp, op, ['--json', 'key', 'revoke', doomed.keyId]);
  assert.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.equal(out.status, 'revoked');
  assert.equal(out.nodes_total, 2);
  assert.equal(out.nodes_confirmed, 1);
  assert.deepEqual(out.nodes_unconfirmed, ['edge-stuck']);
  assert.deepEqual(out.nodes_disconnected.map((n: { id: string }) => n.id), ['edge-gone']);
  assert.equal(typeof out.nodes_disconnected[0].last_seen_at, 'string');

  // The table form says the same in words.
  const other = await gw.fundedKey({ orgId: doomed.orgId, projectId: doomed.projectId, knownOn: [] });
  const text = await runCliAsync(cp, op, ['key', 'revoke', other.keyId]);
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, /nodes:\s+1 of 2 connected confirmed, 1 known node\(s\) not connected/);
  assert.match(text.stderr, /did not confirm in time: edge-stuck;/);
  assert.match(text.stderr, /known but not connected, which may still accept the key .*: edge-gone \(last seen \d{4}-/);
});

test('a node whose node id holds a character outside A-Z a-z 0-9 . _ : - is refused with INVALID_ARGUMENT, before it is given anything', async () => {
  const cp = await startControlPlane();
  for (const nodeId of ['edge\u0000nul', 'edge with space', 'edge\nline']) {
    await assert.rejects(startFakeNode(cp, { nodeId }), (err: Error & { code?: number }) => {
      assert.equal(err.code, 3, `${JSON.stringify(nodeId)}: ${err.message}`);
      assert.match(err.message, /node id and instance id must be 1-128 characters of A-Z a-z 0-9 \. _ : -/);
      return true;
    });
  }
  await cp.proc.waitFor(/sync: refused a node: node id \\?"edge with space\\?" or instance id \\?"[0-9a-f]+\\?" is not plain/);
  assert.deepEqual((await cliJsonAsync(cp, cp.secrets.operatorToken, ['nodes', 'list'])).nodes, []);
});

test('a second node under a node id already connected is refused and named; the first keeps it', async () => {
  const cp = await startControlPlane();
  const first = await startDataPlane(cp, { nodeId: 'edge-dup' });
  const second = await startDataPlane(cp, { nodeId: 'edge-dup', waitReady: false });
  await second.proc.waitFor(new RegExp(`refused by control plane: node id \\\\?"edge-dup\\\\?" is already connected from ${first.address.replace(/\./g, '\\.')}; give every node its own --node-id; retrying`));
  await cp.proc.waitFor(/sync: refused node \\?"edge-dup\\?" from \S+: that node id is already connected/);
  assert.doesNotMatch(second.proc.output(), /data plane ready/);
  const nodes = (await cliJsonAsync(cp, cp.secrets.operatorToken, ['nodes', 'list'])).nodes;
  assert.deepEqual(nodes.map((n: { id: string; address: string }) => [n.id, n.address]), [['edge-dup', first.address]]);
});

test('models list shows audio prices; nodes list shows applied version, lag, last report and journal depth', async (t) => {
  const gw = await startGateway(t, { nodes: 0 });
  const cp = gw.cp;
  const op = cp.secrets.operatorToken;
  const models = (await cliJsonAsync(cp, op, ['models', 'list'])).models;
  const speech = models.find((m: { id: string }) => m.id === 'demo-speech');
  assert.equal(speech.audio_usd_per_unit, '0.015');
  assert.equal(models.find((m: { id: string }) => m.id === 'demo-transcribe').audio_usd_per_unit, '0.0001');
  const table = await runCliAsync(cp, op, ['models', 'list']);
  assert.match(table.stdout, /AUDIO_USD_PER_UNIT/);
  assert.match(table.stdout, /demo-speech\s+speech\s+demo\s+-\s+-\s+0\.015 \/1k chars/);
  assert.match(table.stdout, /demo-transcribe\s+transcription\s+demo\s+-\s+-\s+0\.0001 \/second/);

  const node = await gw.addNode({ nodeId: 'edge-1' });
  const c = gw.console;
  const key = await gw.fundedKey();
  assert.equal((await request(`${node.url}/v1/chat/completions`, { method: 'POST', json: chatBody(), headers: bearer(key.key) })).status, 200);
  await eventually(async () => {
    const n = (await c.listNodes()).nodes.find((x) => x.id === 'edge-1');
    return !!n && n.lastReportAt !== '' && n.journalDepth === 0;
  }, 'the usage report to arrive and the node to say its journal is empty');
  const listed = await cliJsonAsync(cp, op, ['nodes', 'list']);
  const n = listed.nodes.find((x: { id: string }) => x.id === 'edge-1');
  assert.equal(n.address, node.address);
  assert.equal(n.connected, true);
  assert.equal(n.lag, listed.current_version - n.acked_version);
  assert.equal(n.journal_depth, 0);
  assert.match(n.last_report_at, /^\d{4}-\d\d-\d\dT/);
  const words = await runCliAsync(cp, op, ['nodes', 'list']);
  assert.match(words.stdout, /ID\s+ADDRESS\s+CONNECTED\s+APPLIED_VERSION\s+LAG\s+LAST_REPORT_AT\s+JOURNAL_DEPTH\s+LAST_SEEN_AT/);
});

test("an upstream's API key comes from api_key_file, and a changed file is picked up by config reload", async (t) => {
  const upstream = await startFakeUpstream();
  t.after(() => upstream.close());
  const dir = tempDir();
  writeFileSync(join(dir, 'upstream.key'), 'sk-upstream-first\n', { mode: 0o600 });
  const yaml = configYaml((cfg) => {
    addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid'], { api_key_env: undefined, api_key_file: 'upstream.key' });
    delete cfg.models.at(-1).api_key_env;
  });
  const gw = await startGateway(t, { controlPlane: { dir, configYaml: yaml } });
  const [cp, node] = [gw.cp, gw.node];
  const key = await gw.fundedKey();
  const chat = () => request(`${node.url}/v1/chat/completions`, { method: 'POST', json: chatBody('hi', 'up-chat'), headers: bearer(key.key) });
  assert.equal((await chat()).status, 200);
  assert.equal(upstream.requests.at(-1)!.headers.authorization, 'Bearer sk-upstream-first');

  // A new key in the file: no restart, a reload.
  writeFileSync(join(dir, 'upstream.key'), 'sk-upstream-second\n');
  const reload = await runCliAsync(cp, cp.secrets.operatorToken, ['config', 'reload']);
  assert.equal(reload.code, 0, reload.stderr);
  await eventually(async () => {
    assert.equal((await chat()).status, 200);
    return upstream.requests.at(-1)!.headers.authorization === 'Bearer sk-upstream-second';
  }, 'the node to use the new upstream key');

  // A file that cannot be read is refused, named, and the old config stays; its contents never show.
  writeFileSync(join(dir, 'gateway.yaml'), yaml.replace('api_key_file: upstream.key', 'api_key_file: missing.key'));
  const bad = await runCliAsync(cp, cp.secrets.operatorToken, ['config', 'reload']);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /config not reloaded, old config kept: .*model up-chat\.api_key_file: cannot read \S*missing\.key \(ENOENT\)/);
  assert.equal((await chat()).status, 200);
  assert.doesNotMatch(cp.proc.output() + node.proc.output(), /sk-upstream-/);
});

test('messages: a clean end of the stream, a pepper mismatch, and a 401 that says how to give a token', async () => {
  const cp = await startControlPlane();
  const node = await startDataPlane(cp, { nodeId: 'edge-msg' });
  const wrong = await startDataPlane({ address: cp.address, secrets: { ...cp.secrets, pepper: randomBytes(32).toString('hex') } }, { waitReady: false });
  await wrong.proc.waitFor(/refused by control plane/);
  assert.match(wrong.proc.output(), /refused by control plane: pepper mismatch: the node's key pepper differs from the control plane's; check TOLLGATE_PEPPER or --pepper-file/);
  assert.doesNotMatch(wrong.proc.output(), /pepper mismatch \(/);

  const noToken = await runCliAsync(cp, undefined, ['org', 'list']);
  assert.equal(noToken.code, 1);
  assert.equal(noToken.stderr.trim(), '401 missing or invalid token: pass --token or set TOLLGATE_TOKEN (npm start keeps the operator token in data/operator-token)');

  await cp.proc.kill('SIGTERM');
  await node.proc.waitFor(/control plane connection lost/);
  assert.match(node.proc.output(), /control plane connection lost \((the control plane ended the stream|UNAVAILABLE[^)]*)\); serving from version \d+, reconnecting/);
  assert.doesNotMatch(node.proc.output(), /OK: OK/);
});
