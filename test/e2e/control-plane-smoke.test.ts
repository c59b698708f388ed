// The control plane over real gRPC: console calls with the generated client, and a raw SyncService
// client playing a node (Hello → Snapshot → Ack, deltas, reports, pepper and token checks).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { credentials, Metadata, status, type ClientDuplexStream, type ServiceError } from '@grpc/grpc-js';
import { ConsoleServiceClient } from '../../proto/gen/tollgate/v1/console.js';
import { SyncServiceClient, type ControlMessage, type NodeMessage } from '../../proto/gen/tollgate/v1/sync.js';
import { hashKey, pepperCheck } from '../../proto/lib/keys.js';
import { DEMO_CONFIG_PATH } from '../../control-plane/gateway-config/gateway-config.js';
import { startControlPlane, stopAll, type ControlPlane } from '../helpers/processes.js';

function call<Res>(client: ConsoleServiceClient, method: string, token: string, req: unknown): Promise<Res> {
  const md = new Metadata();
  md.set('authorization', `Bearer ${token}`);
  return new Promise((resolve, reject) =>
    (client as any)[method](req, md, (err: ServiceError | null, res: Res) => (err ? reject(err) : resolve(res))),
  );
}

/** A raw node: every control message lands in `inbox`; `next` waits for the next one matching. */
function rawNode(cp: ControlPlane, opts: { token?: string; pepper?: string; haveVersion?: number; nodeId?: string; instanceId?: string } = {}) {
  const client = new SyncServiceClient(cp.address, credentials.createInsecure());
  const md = new Metadata();
  md.set('authorization', `Bearer ${opts.token ?? cp.secrets.nodeToken}`);
  const stream: ClientDuplexStream<NodeMessage, ControlMessage> = client.connect(md);
  const inbox: ControlMessage[] = [];
  const waiters = new Set<() => void>();
  let error: ServiceError | undefined;
  stream.on('data', (m: ControlMessage) => {
    inbox.push(m);
    for (const w of [...waiters]) w();
  });
  stream.on('error', (e: ServiceError) => {
    error = e;
    for (const w of [...waiters]) w();
  });
  stream.write({
    hello: {
      nodeId: opts.nodeId ?? 'smoke-node',
      instanceId: opts.instanceId ?? 'inst-1',
      pepperCheck: pepperCheck(Buffer.from(opts.pepper ?? cp.secrets.pepper)),
      haveVersion: opts.haveVersion ?? 0,
      listenAddress: '127.0.0.1:9999',
      ownerProjects: [],
      heldSlots: [],
      heldKeyMinutes: [],
    },
  });
  let cursor = 0;
  return {
    stream,
    inbox,
    send: (m: NodeMessage) => stream.write(m),
    error: () => error,
    next(match: (m: ControlMessage) => boolean = () => true, timeoutMs = 10_000): Promise<ControlMessage> {
      return new Promise((resolve, reject) => {
        const check = () => {
          while (cursor < inbox.length) {
            const m = inbox[cursor++];
            if (match(m)) {
              waiters.delete(check);
              clearTimeout(timer);
              resolve(m);
              return;
            }
          }
          if (error) {
            waiters.delete(check);
            clearTimeout(timer);
            reject(error);
          }
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error('timed out waiting for a control message'));
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
    ended: () =>
      new Promise<ServiceError>((resolve) => {
        if (error) return resolve(error);
        stream.on('error', resolve);
      }),
    close: () => {
      stream.cancel();
      client.close();
    },
  };
}

/**
 * SIGKILL for the real control plane: the helper's child is tsx's launcher, whose own child runs
 * main.ts and would survive the launcher being killed.
 */
async function killHard(cp: ControlPlane): Promise<void> {
  const pid = cp.proc.child.pid!;
  let kids: string[] = [];
  try {
    kids = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
  } catch {
    // Not Linux: the launcher alone is killed.
  }
  for (const k of kids) process.kill(Number(k), 'SIGKILL');
  await cp.proc.kill('SIGKILL');
}

test('console and sync over gRPC: hierarchy, snapshot, revoke with acks, reports, refusals', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane({ extraArgs: ['--revoke-ack-timeout-ms', '3000'] });
  const client = new ConsoleServiceClient(cp.address, credentials.createInsecure());
  t.after(() => client.close());
  const op = cp.secrets.operatorToken;

  await assert.rejects(call(client, 'whoAmI', 'nope', {}), (e: ServiceError) => e.code === status.UNAUTHENTICATED);
  const acct = await call<any>(client, 'createAccount', op, { name: 'alice' });
  assert.match(acct.token, /^acct_/);
  const org = await call<any>(client, 'createOrg', op, { name: 'Acme', ownerAccountId: acct.account.id, tier: '' });
  assert.equal(org.tier, 'free');
  assert.equal(org.balanceMicros, 5_000_000);
  assert.equal(org.effectiveCapMicros, 5_000_000);
  assert.equal(org.blocked, false);
  const project = await call<any>(client, 'createProject', acct.token, { orgId: org.id, name: 'web' });
  const created = await call<any>(client, 'createKey', acct.token, { projectId: project.id, name: 'k1', allowedModels: ['demo-chat'] });
  assert.match(created.key, /^sk-tollgate-[0-9A-Za-z]{43}$/);
  assert.equal(created.apiKey.keyPrefix, `${created.key.slice(0, 12)}...${created.key.slice(-4)}`);
  assert.deepEqual([created.apiKey.rpmLimit, created.apiKey.tpmLimit, created.apiKey.maxParallelRequests], [20, 60000, 100]);
  const listed = await call<any>(client, 'listKeys', acct.token, { projectId: project.id });
  assert.ok(!JSON.stringify(listed).includes(created.key));
  await assert.rejects(call(client, 'createKey', acct.token, { projectId: project.id, allowedModels: ['nope'] }), (e: ServiceError) => e.code === status.INVALID_ARGUMENT);

  // Another account sees nothing of Acme.
  const bob = await call<any>(client, 'createAccount', op, { name: 'bob' });
  await assert.rejects(call(client, 'getOrg', bob.token, { orgId: org.id }), (e: ServiceError) => e.code === status.NOT_FOUND);
  await assert.rejects(call(client, 'listKeys', bob.token, { projectId: project.id }), (e: ServiceError) => e.code === status.NOT_FOUND);
  await assert.rejects(call(client, 'creditOrg', acct.token, { orgId: org.id, amountMicros: 1, note: '' }), (e: ServiceError) => e.code === status.PERMISSION_DENIED);

  // Refusals at the sync door.
  const badToken = rawNode(cp, { token: 'wrong' });
  assert.equal((await badToken.ended()).code, status.UNAUTHENTICATED);
  badToken.close();
  const badPepper = rawNode(cp, { pepper: 'x'.repeat(64) });
  const refused = await badPepper.ended();
  assert.equal(refused.code, status.FAILED_PRECONDITION);
  assert.equal(refused.details, "pepper mismatch: the node's key pepper differs from the control plane's");
  badPepper.close();

  // A node gets a snapshot with the key's hash, acks it.
  const node = rawNode(cp);
  t.after(() => node.close());
  const first = await node.next();
  assert.ok(first.snapshot);
  const keyHash = hashKey(Buffer.from(cp.secrets.pepper), created.key);
  const entry = first.snapshot.keys.find((k) => k.keyHash === keyHash);
  assert.equal(entry?.keyId, created.apiKey.id);
  assert.deepEqual(entry?.allowedModels, ['demo-chat']);
  assert.equal(first.snapshot.orgs.find((o) => o.orgId === org.id)?.blocked, false);
  assert.equal(first.snapshot.config?.serviceName, 'tollgate');
  node.send({ ack: { version: first.snapshot.version } });

  // Usage: the free grant is spent → the org is blocked, pushed as a delta. A replayed report counts once.
  const usage = {
    requestId: 'req-1',
    keyId: created.apiKey.id,
    orgId: org.id,
    projectId: project.id,
    model: 'demo-chat',
    path: '/v1/chat/completions',
    status: 200,
    promptTokens: 10,
    completionTokens: 5,
    costMicros: 5_000_000,
    atMs: Date.now(),
    minute: Math.floor(Date.now() / 60000),
    leaseEpoch: 0,
  };
  node.send({ report: { seq: 1, usage: [usage], lastUsed: [], logs: undefined, instanceId: '', usageTotals: [], logBlocks: [] } });
  const blocked = await node.next((m) => !!m.delta?.changes.some((c) => c.orgUpsert?.orgId === org.id));
  assert.equal(blocked.delta!.changes[0].orgUpsert!.blockedReason, 'balance_exhausted');
  node.send({ ack: { version: blocked.delta!.toVersion } });
  assert.equal((await node.next((m) => !!m.reportAck)).reportAck!.seq, 1);
  // A replay of report 1 changes nothing; report 2 (usage summed, as nodes send it now) adds one free call.
  node.send({ report: { seq: 1, usage: [usage], lastUsed: [], logs: undefined, instanceId: '', usageTotals: [], logBlocks: [] } });
  const freeCall = { keyId: usage.keyId, orgId: org.id, projectId: project.id, model: 'demo-chat', minute: usage.minute, leaseEpoch: 0, requests: 1, promptTokens: 3, completionTokens: 4, costMicros: 0 };
  node.send({ report: { seq: 2, usage: [], lastUsed: [], logs: undefined, instanceId: '', usageTotals: [freeCall], logBlocks: [] } });
  assert.equal((await node.next((m) => !!m.reportAck)).reportAck!.seq, 1);
  assert.equal((await node.next((m) => !!m.reportAck)).reportAck!.seq, 2);
  const spent = await call<any>(client, 'getOrg', op, { orgId: org.id });
  assert.equal(spent.spendTotalMicros, 5_000_000);
  assert.equal(spent.blockedReason, 'balance_exhausted');
  // Several reports in one message, the first a replay: each is acknowledged, only the new one counts.
  const report = (seq: number) => ({ seq, usage: [], lastUsed: [], logs: undefined, instanceId: '', usageTotals: [freeCall], logBlocks: [] });
  node.send({ reports: { reports: [report(2), report(3), report(4)] } });
  // (Since issue 19 the acknowledgements of reports written together come in one ReportAcks.)
  assert.deepEqual((await node.next((m) => !!m.reportAcks)).reportAcks!.acks.map((a) => a.seq), [2, 3, 4]);
  const usageRes = await call<any>(client, 'getUsage', acct.token, { projectId: project.id, orgId: '', month: '', since: '', until: '', groupBy: '' });
  assert.equal(usageRes.totalRequests, 4);
  const keyAfter = (await call<any>(client, 'listKeys', acct.token, { projectId: project.id })).keys[0];
  assert.notEqual(keyAfter.lastUsedAt, '');

  // A credit unblocks (balance > 0) but the tier's monthly cap still holds; raising the own cap unblocks.
  const credited = await call<any>(client, 'creditOrg', op, { orgId: org.id, amountMicros: 10_000_000, note: '' });
  assert.equal(credited.blockedReason, 'monthly_cap_reached');
  const capped = await call<any>(client, 'setOrgCap', acct.token, { orgId: org.id, capMicros: 20_000_000 });
  assert.equal(capped.blocked, false);
  const unblocked = await node.next((m) => !!m.delta?.changes.some((c) => c.orgUpsert?.orgId === org.id && !c.orgUpsert?.blocked));
  node.send({ ack: { version: unblocked.delta!.toVersion } });

  // Revoke: the node sees the credential removed; the reply counts its ack.
  const revoking = call<any>(client, 'revokeKey', acct.token, { keyId: created.apiKey.id });
  const removed = await node.next((m) => !!m.delta?.changes.some((c) => c.keyRemoved === keyHash));
  const midway = (await call<any>(client, 'listKeys', acct.token, { projectId: project.id })).keys[0];
  assert.equal(midway.status, 'active');
  node.send({ ack: { version: removed.delta!.toVersion } });
  const revoked = await revoking;
  assert.equal(revoked.apiKey.status, 'revoked');
  assert.equal(revoked.nodesTotal, 1);
  assert.equal(revoked.nodesConfirmed, 1);
  const again = await call<any>(client, 'revokeKey', acct.token, { keyId: created.apiKey.id });
  assert.deepEqual([again.apiKey.status, again.nodesTotal, again.nodesConfirmed], ['revoked', 0, 0]);

  // A node that reconnects with the version it holds gets only what it missed.
  const nodes = await call<any>(client, 'listNodes', op, {});
  assert.equal(nodes.nodes.find((n: any) => n.id === 'smoke-node')?.connected, true);
  const held = removed.delta!.toVersion;
  const second = rawNode(cp, { nodeId: 'smoke-2', haveVersion: held - 1 });
  t.after(() => second.close());
  const catchUp = await second.next();
  assert.deepEqual([catchUp.delta?.fromVersion, catchUp.delta?.toVersion], [held - 1, nodes.currentVersion]);

  // The key's value is in no file of the control plane.
  for (const name of readdirSync(cp.dir)) {
    const bytes = readFileSync(join(cp.dir, name));
    assert.ok(!bytes.includes(created.key), `${name} holds the key`);
    assert.ok(!bytes.includes(cp.secrets.pepper), `${name} holds the pepper`);
  }
});

test('a revocation cut short by a crash is repaired to revoked at start', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane({ extraArgs: ['--revoke-ack-timeout-ms', '60000'] });
  const client = new ConsoleServiceClient(cp.address, credentials.createInsecure());
  t.after(() => client.close());
  const op = cp.secrets.operatorToken;
  const acct = await call<any>(client, 'createAccount', op, { name: 'crashy-owner' });
  const org = await call<any>(client, 'createOrg', op, { name: 'Crashy', ownerAccountId: acct.account.id, tier: 'paid' });
  assert.equal(org.blockedReason, 'balance_exhausted');
  const project = await call<any>(client, 'createProject', op, { orgId: org.id, name: 'p' });
  const created = await call<any>(client, 'createKey', op, { projectId: project.id, name: '', allowedModels: [] });
  assert.deepEqual([created.apiKey.rpmLimit, created.apiKey.tpmLimit], [300, 1_000_000]);

  const node = rawNode(cp, { nodeId: 'never-acks' });
  t.after(() => node.close());
  await node.next((m) => !!m.snapshot);
  const pending = call<any>(client, 'revokeKey', op, { keyId: created.apiKey.id }).catch(() => null);
  await node.next((m) => !!m.delta?.changes.some((c) => c.keyRemoved !== undefined));
  await killHard(cp);
  await pending;

  const again = await startControlPlane({ dir: cp.dir, secrets: cp.secrets });
  assert.match(again.proc.output(), /repaired 1 keys to revoked/);
  const client2 = new ConsoleServiceClient(again.address, credentials.createInsecure());
  t.after(() => client2.close());
  const keys = await call<any>(client2, 'listKeys', op, { projectId: project.id });
  assert.equal(keys.keys[0].status, 'revoked');
  assert.notEqual(keys.keys[0].revokedAt, '');
});

test('config reload: a lower cap blocks at once, a bad file is refused and the old config kept', async (t) => {
  t.after(stopAll);
  const demo = readFileSync(DEMO_CONFIG_PATH, 'utf8');
  const cp = await startControlPlane({ configYaml: demo });
  const client = new ConsoleServiceClient(cp.address, credentials.createInsecure());
  t.after(() => client.close());
  const op = cp.secrets.operatorToken;
  const acct = await call<any>(client, 'createAccount', op, { name: 'capped-owner' });
  const org = await call<any>(client, 'createOrg', op, { name: 'Capped', ownerAccountId: acct.account.id, tier: 'free' });
  const project = await call<any>(client, 'createProject', op, { orgId: org.id, name: 'p' });
  const created = await call<any>(client, 'createKey', op, { projectId: project.id, name: 'k', allowedModels: [] });
  const node = rawNode(cp, { nodeId: 'reload-node' });
  t.after(() => node.close());
  await node.next((m) => !!m.snapshot);
  node.send({
    report: {
      seq: 1,
      lastUsed: [],
      logs: undefined,
      usageTotals: [],
      logBlocks: [],
      instanceId: '',
      usage: [
        {
          requestId: 'r1', keyId: created.apiKey.id, orgId: org.id, projectId: project.id, model: 'demo-chat', path: '/v1/chat/completions',
          status: 200, promptTokens: 1, completionTokens: 1, costMicros: 1_000_000, atMs: Date.now(), minute: 0, leaseEpoch: 0,
        },
      ],
    },
  });
  await node.next((m) => !!m.reportAck);

  writeFileSync(cp.configPath!, demo.replace('monthly_cap_usd: "5.00"', 'monthly_cap_usd: "0.50"'));
  const reloaded = await call<any>(client, 'reloadConfig', op, {});
  assert.equal(reloaded.nodesTotal, 1);
  const cfgDelta = await node.next((m) => !!m.delta?.changes.some((c) => c.config));
  assert.equal(cfgDelta.delta!.changes[0].config!.tiers.find((x) => x.name === 'free')!.monthlyCapMicros, 500_000);
  await node.next((m) => !!m.delta?.changes.some((c) => c.orgUpsert?.orgId === org.id && c.orgUpsert?.blockedReason === 'monthly_cap_reached'));
  const blocked = await call<any>(client, 'getOrg', op, { orgId: org.id });
  assert.deepEqual([blocked.effectiveCapMicros, blocked.blockedReason], [500_000, 'monthly_cap_reached']);

  writeFileSync(cp.configPath!, demo.replace('models: [demo-chat, demo-embed', 'models: [no-such-model, demo-embed'));
  await assert.rejects(call(client, 'reloadConfig', op, {}), (e: ServiceError) => {
    assert.equal(e.code, status.INVALID_ARGUMENT);
    assert.match(e.details, /old config kept: .*tier free\.models: names unknown model "no-such-model"/);
    return true;
  });
  const still = await call<any>(client, 'getOrg', op, { orgId: org.id });
  assert.equal(still.effectiveCapMicros, 500_000);

  // SIGHUP to the control plane process itself re-reads the file.
  writeFileSync(cp.configPath!, demo);
  const pid = Number(cp.proc.output().match(/control plane pid (\d+)/)![1]);
  process.kill(pid, 'SIGHUP');
  await cp.proc.waitFor(/config reloaded from .*: version \d+/);
  await node.next((m) => !!m.delta?.changes.some((c) => c.orgUpsert?.orgId === org.id && !c.orgUpsert?.blocked));

  // SIGTERM with a node still connected: the stream is ended and the process exits 0.
  assert.equal(await cp.proc.kill('SIGTERM'), 0);
});
