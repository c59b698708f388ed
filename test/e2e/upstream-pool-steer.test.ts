// Upstream pools seen and steered (issue 36, deliverable 7): `tollgate models status` shows each
// deployment's health as each node sees it (a circuit one node opened shows on that node only) and
// its room this minute; `tollgate models drain|disable|enable` steers one deployment without a config
// reload: the state is the control plane's (persisted, audited), reaches every node by the sync stream
// before the command returns, and survives a control-plane restart. Nodes' clocks are injected.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { configYaml, type GatewayYaml } from '../helpers/config.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer, chatBody, minuteStart, request, setClock } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, startControlPlane } from '../helpers/processes.js';
import { eventually } from '../helpers/data-plane.js';
import type { DemoKey } from '../helpers/console.js';

/** A weight that makes a deployment the first choice (the draw picks another once in 10^9). */
const FIRST = 1_000_000_000;
const KEY_ENV = { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' };

const fakes: Record<string, FakeUpstream> = {};
after(() => Promise.all(Object.values(fakes).map((f) => f.close())));
const clock = minuteStart() + 5_000;

const dep = (id: string, baseUrl: string, weight = 1, extra: GatewayYaml = {}): GatewayYaml => ({ id, base_url: baseUrl, api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', upstream_model: `up-${id}`, weight, ...extra });

function pooled(cfg: GatewayYaml, id: string, deployments: GatewayYaml[], extra: GatewayYaml = {}): void {
  cfg.models.push({ id, provider: 'openai', kind: 'chat', input_usd_per_mtok: '0.50', output_usd_per_mtok: '1.50', timeout_ms: 10_000, deployments, ...extra });
  cfg.tiers.paid.models.push(id);
}

const gw = gatewayFixture(async () => {
  for (const name of ['flaky', 'ok', 'held', 'other', 'x', 'y']) fakes[name] = await startFakeUpstream();
  fakes.flaky.setMode('error-503');
  const yaml = configYaml((cfg) => {
    pooled(cfg, 'steer-circuit', [dep('flaky', fakes.flaky.baseUrl, FIRST), dep('ok', fakes.ok.baseUrl, 1, { rpm: 100, tpm: 50_000 })], { circuit_failures: 2, circuit_cooldown_ms: 60_000 });
    pooled(cfg, 'steer-drain', [dep('a', fakes.held.baseUrl, FIRST), dep('b', fakes.other.baseUrl)]);
    pooled(cfg, 'steer-pair', [dep('x', fakes.x.baseUrl, FIRST), dep('y', fakes.y.baseUrl)]);
  });
  const node = (nodeId: string) => ({ nodeId, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' }, extraArgs: ['--report-every-ms', '0'] });
  return { controlPlane: { configYaml: yaml, env: KEY_ENV }, nodes: [node('node-a'), node('node-b')] };
}, async (g) => {
  for (const n of g.nodes) await setClock(n.adminUrl!, { now_ms: clock });
});

let key: DemoKey;
async function paidKey(): Promise<DemoKey> {
  key ??= await gw.fundedKey({ tier: 'paid', creditMicros: 10_000_000 });
  return key;
}

async function ask(model: string, node = gw.nodes[0]) {
  const k = await paidKey();
  return request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(k.key), json: chatBody('Hello', model) });
}

const cli = (args: string[]) => runCliAsync(gw.cp, gw.cp.secrets.operatorToken, args);
const cliJson = (args: string[]) => cliJsonAsync(gw.cp, gw.cp.secrets.operatorToken, args);

interface NodeHealthJson {
  node_id: string;
  circuit: string;
  open_until: string | null;
  cooling_until: string | null;
  consecutive_failures: number;
  recent_errors: Record<string, number>;
  in_flight: number;
  minute_requests: number;
  minute_tokens: number;
}
interface DeploymentJson {
  id: string;
  state: string;
  circuit: string;
  rpm: number;
  tpm: number;
  minute_requests: number;
  minute_tokens: number;
  nodes: NodeHealthJson[];
}

async function deploymentsOf(model: string): Promise<DeploymentJson[]> {
  const out = await cliJson(['models', 'status', '--model', model]);
  assert.deepEqual(out.models.map((m: { id: string }) => m.id), [model]);
  return out.models[0].deployments;
}

test('models status: the circuit node-a opened shows open on node-a only, with its errors by kind and the cooling end; each deployment its room this minute', async () => {
  // Two 503s from flaky (each failed over to ok) open its circuit on node-a.
  for (let i = 0; i < 2; i++) assert.equal((await ask('steer-circuit')).status, 200);
  assert.equal(fakes.flaky.requests.length, 2);
  let deps: DeploymentJson[] = [];
  await eventually(async () => {
    deps = await deploymentsOf('steer-circuit');
    const flaky = deps.find((d) => d.id === 'flaky');
    return flaky?.nodes.find((n) => n.node_id === 'node-a')?.circuit === 'open' && flaky.nodes.some((n) => n.node_id === 'node-b');
  }, 'node-a reports flaky open');
  const [flaky, ok] = deps;
  assert.deepEqual([flaky.id, ok.id], ['flaky', 'ok']);
  assert.equal(flaky.state, 'enabled');
  // The nodes differ: node-b never saw a failure.
  assert.equal(flaky.circuit, 'mixed');
  const a = flaky.nodes.find((n) => n.node_id === 'node-a')!;
  const b = flaky.nodes.find((n) => n.node_id === 'node-b')!;
  assert.equal(b.circuit, 'closed');
  assert.equal(a.consecutive_failures, 2);
  assert.deepEqual(a.recent_errors, { '5xx': 2 });
  assert.deepEqual(b.recent_errors, {});
  // Open for the configured 60 s from node-a's (injected) clock.
  assert.equal(a.open_until, new Date(clock + 60_000).toISOString());
  // Room: ok served both requests this minute, of its rpm 100 (tokens: the input estimates).
  assert.equal(ok.circuit, 'closed');
  assert.deepEqual([ok.rpm, ok.tpm], [100, 50_000]);
  await eventually(async () => {
    const o = (await deploymentsOf('steer-circuit')).find((d) => d.id === 'ok')!;
    return o.minute_requests === 2 && o.minute_tokens > 0;
  }, 'ok has served 2 requests this minute');
  // The table names the node where they differ.
  const table = await cli(['models', 'status', '--model', 'steer-circuit']);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /flaky/);
  assert.match(table.stdout, /node-a: open/);
  assert.match(table.stdout, /node-b: closed/);
  assert.match(table.stdout, /2\/100/);
});

test('drain: the request in flight on the deployment finishes; every node stops choosing it once the command returns; enable brings it back; audited', async () => {
  const held = fakes.held;
  held.setMode('hold-head');
  const inFlight = ask('steer-drain');
  await held.waitForHeld(1);
  const r = await cli(['models', 'drain', 'steer-drain', 'a']);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /steer-drain\/a: drained/);
  assert.match(r.stdout, /confirmed by 2 of 2 node/);
  // Both nodes send every new request to b, however heavy a's weight.
  const before = fakes.other.requests.length;
  for (const n of gw.nodes) for (let i = 0; i < 3; i++) assert.equal((await ask('steer-drain', n)).status, 200);
  assert.equal(fakes.other.requests.length, before + 6);
  assert.equal(held.requests.length, 1);
  // The one in flight finishes on a.
  held.release();
  const done = await inFlight;
  assert.equal(done.status, 200, done.text);
  assert.equal(held.requests.length, 1);
  held.setMode('normal');
  const status = (await deploymentsOf('steer-drain')).map((d) => [d.id, d.state]);
  assert.deepEqual(status, [['a', 'drained'], ['b', 'enabled']]);
  const e = await cli(['models', 'enable', 'steer-drain', 'a']);
  assert.equal(e.code, 0, e.stderr);
  assert.equal((await ask('steer-drain')).status, 200);
  assert.equal(held.requests.length, 2, 'a is chosen again');
  const { entries } = await cliJson(['audit', '--action', 'models.set_deployment_state']);
  const mine = (entries as { target_id: string; detail: string; outcome: string }[]).filter((x) => x.target_id === 'steer-drain/a');
  assert.deepEqual(mine.map((x) => [x.detail, x.outcome]), [['state=enabled', 'ok'], ['state=drained', 'ok']]);
});

test('disable: no request goes to the deployment; the last enabled deployment of a model may not be drained or disabled', async () => {
  const d = await cli(['models', 'disable', 'steer-pair', 'x']);
  assert.equal(d.code, 0, d.stderr);
  const before = fakes.y.requests.length;
  for (const n of gw.nodes) assert.equal((await ask('steer-pair', n)).status, 200);
  assert.equal(fakes.x.requests.length, 0);
  assert.equal(fakes.y.requests.length, before + 2);
  for (const verb of ['drain', 'disable']) {
    const last = await cli(['models', verb, 'steer-pair', 'y']);
    assert.equal(last.code, 1);
    assert.match(last.stderr, /^400 .*y is the last enabled deployment of model steer-pair/);
  }
  assert.deepEqual((await deploymentsOf('steer-pair')).map((x) => [x.id, x.state]), [['x', 'disabled'], ['y', 'enabled']]);
  // Disabled twice is still disabled; enabled again, x takes requests.
  assert.equal((await cli(['models', 'disable', 'steer-pair', 'x'])).code, 0);
  assert.equal((await cli(['models', 'enable', 'steer-pair', 'x'])).code, 0);
  assert.equal((await ask('steer-pair')).status, 200);
  assert.equal(fakes.x.requests.length, 1);
});

test('bad input: an unknown model or deployment is a 404 naming it (exit 1); missing arguments are a usage error (exit 2)', async () => {
  const model = await cli(['models', 'drain', 'no-such-model', 'a']);
  assert.equal(model.code, 1);
  assert.match(model.stderr, /^404 .*no-such-model/);
  const deployment = await cli(['models', 'disable', 'steer-drain', 'zz']);
  assert.equal(deployment.code, 1);
  assert.match(deployment.stderr, /^404 model steer-drain has no deployment "zz"/);
  const unpooled = await cli(['models', 'drain', 'demo-chat', 'a']);
  assert.equal(unpooled.code, 1);
  assert.match(unpooled.stderr, /^404 model demo-chat has no deployment "a"/);
  const status = await cli(['models', 'status', '--model', 'no-such-model']);
  assert.equal(status.code, 1);
  assert.match(status.stderr, /^404 .*no-such-model/);
  const missing = await cli(['models', 'drain', 'steer-drain']);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /^400 /);
});

test('the state survives a control-plane restart: status still shows it, and a node that joins after does not choose the drained deployment', async (t) => {
  assert.equal((await cli(['models', 'drain', 'steer-drain', 'a'])).code, 0);
  await gw.cp.proc.kill('SIGKILL');
  const cp = await startControlPlane({ dir: gw.cp.dir, secrets: gw.cp.secrets, configPath: gw.cp.configPath, listen: gw.cp.address, env: KEY_ENV });
  t.after(() => cp.proc.kill('SIGKILL'));
  assert.deepEqual((await deploymentsOf('steer-drain')).map((x) => [x.id, x.state]), [['a', 'drained'], ['b', 'enabled']]);
  const late = await gw.addNode({ nodeId: 'node-late', adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
  await setClock(late.adminUrl!, { now_ms: clock });
  await paidKey();
  await eventually(async () => (await ask('steer-drain', late)).status === 200, 'node-late serves');
  const held = fakes.held.requests.length;
  for (let i = 0; i < 3; i++) assert.equal((await ask('steer-drain', late)).status, 200);
  assert.equal(fakes.held.requests.length, held);
});
