// Minute pools by id (docs/leases.md#minute-pools-by-id): the key-minute leases hold a pooled model's
// deployment's rpm under "deployment:MODEL/ID", with the deployment's limits from the current config.
// Before, the lease service knew only keys: a want for a deployment's minute was granted nothing, so
// the deployments' limits could only be counted per node.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { readGatewayConfig } from '../../control-plane/config.js';
import { ControlState } from '../../control-plane/state/control-state.js';
import { SqliteDb } from '../../control-plane/store/sqlite-db.js';
import { runMigrations } from '../../control-plane/store/migrate.js';
import { LeaseService } from '../../control-plane/leases/lease-service.js';
import type { NodeSession } from '../../control-plane/sync/node-session.js';
import { LeaseRequest, type ControlMessage, type KeyLease } from '../../proto/gen/tollgate/v1/sync.js';
import { deploymentOfPool, deploymentPoolId } from '../../proto/lib/leases.js';
import { configYaml } from '../helpers/config.js';

const NOW = Date.UTC(2026, 10, 26, 12, 0, 30);
const MINUTE = Math.floor(NOW / 60_000);
const POOL = deploymentPoolId('vendor/pooled', 'a');

async function setUp(t: { after(fn: () => unknown): void }) {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-minute-pools-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = await SqliteDb.open(join(dir, 'tollgate.db'));
  t.after(() => db.close());
  await runMigrations(db);
  process.env.TOLLGATE_TEST_UPSTREAM_KEY = 'sk-upstream-test';
  const configPath = join(dir, 'gateway.yaml');
  writeFileSync(configPath, configYaml((cfg) => {
    const dep = (id: string, extra: object) => ({ id, base_url: 'http://127.0.0.1:9/v1', api_key_env: 'TOLLGATE_TEST_UPSTREAM_KEY', ...extra });
    cfg.models.push({ id: 'vendor/pooled', provider: 'openai', kind: 'chat', input_usd_per_mtok: '0.50', output_usd_per_mtok: '1.50', deployments: [dep('a', { rpm: 4 }), dep('b', {})] });
  }));
  const state = await ControlState.open(db, readGatewayConfig(configPath), { configPath, now: () => NOW, log: () => {} });
  const sessions = new Set<NodeSession>();
  return { service: new LeaseService(state, sessions, () => {}), sessions };
}

/** A node's session: what it is sent is kept, in order. */
function fakeSession(sessions: Set<NodeSession>, connId: string): { s: NodeSession; sent: ControlMessage[] } {
  const sent: ControlMessage[] = [];
  const s = { connId, nodeId: `node-${connId}`, closed: false, leaving: false, leaseEpoch: 0, mayHoldWhole: false, reclaims: new Map(), enqueue: (m: ControlMessage) => sent.push(m) } as unknown as NodeSession;
  sessions.add(s);
  return { s, sent };
}

/** The key grants sent to a session so far (answers to wants, not announcements). */
async function grants(sent: ControlMessage[], n: number): Promise<KeyLease[]> {
  for (let i = 0; i < 200; i++) {
    const keys = sent.flatMap((m) => m.leaseGrant?.keys ?? []);
    if (keys.length >= n) return keys;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`fewer than ${n} grants: ${JSON.stringify(sent)}`);
}

const want = (keyId: string, requests: number, needRequests: number) =>
  LeaseRequest.fromPartial({ leaseEpoch: 1, keys: [{ keyId, minute: MINUTE, requests, tokens: 0, heldRequests: 0, heldTokens: 0, needRequests, needTokens: 0 }] });

test('a deployment minute pool id names its model and deployment (a model id may hold "/")', () => {
  assert.equal(POOL, 'deployment:vendor/pooled/a');
  assert.deepEqual(deploymentOfPool(POOL), { modelId: 'vendor/pooled', deploymentId: 'a' });
  assert.equal(deploymentOfPool('key_abc'), null);
});

test("a deployment's minute is leased by its rpm across nodes: never more than the limit, and spent only after the other node gave back what it holds unused", async (t) => {
  const { service, sessions } = await setUp(t);
  const a = fakeSession(sessions, 'inst-a#1');
  const b = fakeSession(sessions, 'inst-b#2');
  // Node a asks for 3 of the deployment's 4 requests; node b for 3 more: only 1 is left.
  service.onLeaseRequest(a.s, want(POOL, 3, 1));
  assert.deepEqual((await grants(a.sent, 1)).map((g) => [g.keyId, g.requests, g.finalRequests]), [[POOL, 3, false]]);
  service.onLeaseRequest(b.s, want(POOL, 3, 1));
  assert.deepEqual((await grants(b.sent, 1)).map((g) => [g.requests, g.finalRequests, g.freeRequests]), [[1, false, 0]]);
  // Node b needs one more: the control plane reclaims from node a, which used 2 of its 3.
  service.onLeaseRequest(b.s, want(POOL, 1, 1));
  for (let i = 0; i < 200 && !a.sent.some((m) => m.leaseReclaim); i++) await new Promise((r) => setTimeout(r, 5));
  const reclaim = a.sent.find((m) => m.leaseReclaim)!.leaseReclaim!;
  assert.deepEqual(reclaim.keys, [{ keyId: POOL, minute: MINUTE }]);
  service.onLeaseRequest(a.s, LeaseRequest.fromPartial({ leaseEpoch: 1, reclaimId: reclaim.id, keyReturns: [{ keyId: POOL, minute: MINUTE, requests: 1, tokens: 0, heldRequests: 2, heldTokens: 0 }] }));
  const second = (await grants(b.sent, 2))[1];
  assert.deepEqual([second.requests, second.finalRequests], [1, false], 'the one node a gave back');
  // All 4 held (2 by a, 2 by b): the deployment's minute is spent across the cluster.
  service.onLeaseRequest(b.s, want(POOL, 1, 1));
  for (let i = 0; i < 200 && a.sent.filter((m) => m.leaseReclaim).length < 2; i++) await new Promise((r) => setTimeout(r, 5));
  const again = a.sent.filter((m) => m.leaseReclaim)[1].leaseReclaim!;
  service.onLeaseRequest(a.s, LeaseRequest.fromPartial({ leaseEpoch: 1, reclaimId: again.id, keyReturns: [{ keyId: POOL, minute: MINUTE, requests: 0, tokens: 0, heldRequests: 2, heldTokens: 0 }] }));
  const third = (await grants(b.sent, 3))[2];
  assert.deepEqual([third.requests, third.finalRequests], [0, true]);
});

test('a deployment or model the config does not have is leased nothing', async (t) => {
  const { service, sessions } = await setUp(t);
  const a = fakeSession(sessions, 'inst-a#1');
  service.onLeaseRequest(a.s, want(deploymentPoolId('vendor/pooled', 'gone'), 3, 1));
  service.onLeaseRequest(a.s, want(deploymentPoolId('no-such-model', 'a'), 3, 1));
  const gs = await grants(a.sent, 2);
  assert.deepEqual(gs.map((g) => [g.requests, g.finalRequests]), [[0, false], [0, false]]);
});
