// Many customers over three nodes (issue 19): keys in many organisations, a load that crosses a
// minute boundary (the nodes' injected clocks), and while it runs an organisation is credited, another
// one's cap is lowered and a key is revoked. Every admitted request is billed exactly once, in the
// minute it was served; the capped organisation is blocked within its in-flight bound; the credited
// one is served; the revoked key is refused on every node.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startControlPlane, startDataPlane, stopAll, type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, minuteStart, request, setClock, type HttpResult } from '../helpers/http.js';
import { consoleClient, createKey, type DemoKey } from '../helpers/console.js';
import { configYaml } from '../helpers/config.js';
import { eventually, waitUntilKnown } from '../helpers/data-plane.js';
import { queryDb } from '../helpers/usage-db.js';

after(stopAll);

const ORGS = 8;
const KEYS_PER_ORG = 5;
const REQUESTS = 360;
const CONCURRENCY = 6;
// demo-chat: 0.50 USD per million input tokens, 1.50 per million output tokens.
const costOf = (r: HttpResult) => Math.round(r.body.usage.prompt_tokens * 0.5 + r.body.usage.completion_tokens * 1.5);

test('many keys in many organisations over three nodes: billed exactly once across a minute boundary, with a credit, a lowered cap and a revocation during the load', async () => {
  const cp = await startControlPlane({ configYaml: configYaml(() => {}) });
  const t0 = minuteStart();
  const nodes: DataPlane[] = [];
  for (let i = 0; i < 3; i++) {
    const node = await startDataPlane(cp, { nodeId: `tenant-node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    await setClock(node.adminUrl!, { now_ms: t0 + 1000 });
    nodes.push(node);
  }
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  after(() => admin.close());

  // Organisations on the paid tier (no grant, no cap): all funded except org 1, which gets its credit
  // during the load. Org 2's cap is lowered during the load; key 0 of org 3 is revoked.
  const keys: DemoKey[] = [];
  for (let o = 0; o < ORGS; o++) {
    const first = await createKey(admin, { tier: 'paid' });
    keys.push(first);
    for (let k = 1; k < KEYS_PER_ORG; k++) keys.push(await createKey(admin, { orgId: first.orgId, projectId: first.projectId }));
    if (o !== 1) await admin.creditOrg({ orgId: first.orgId, amountMicros: 1_000_000_000, note: 'funds' });
  }
  const orgOf = (i: number) => Math.floor(i / KEYS_PER_ORG);
  const credited = keys[1 * KEYS_PER_ORG].orgId;
  const capped = keys[2 * KEYS_PER_ORG].orgId;
  const revoked = keys[3 * KEYS_PER_ORG];
  for (const n of nodes) for (const k of keys) await waitUntilKnown(n.url, k.key);

  const admitted = new Map<string, { requests: number; tokensIn: number; tokensOut: number; cost: number; byMinute: Map<number, number> }>();
  const statuses = new Map<string, number>();
  let creditedAt = -1;
  let revokedAt = -1;
  let cappedSpendLimit = -1;
  let maxCost = 0;
  const events: Promise<void>[] = [];
  // Events fire when the load reaches a point, while the other requests keep going.
  const onSent = (n: number) => {
    if (n === 90) {
      events.push(
        admin.creditOrg({ orgId: credited, amountMicros: 1_000_000_000, note: 'credit during the load' }).then(() => {
          creditedAt = sent;
        }),
      );
    } else if (n === 150) {
      events.push(
        (async () => {
          for (const node of nodes) await setClock(node.adminUrl!, { now_ms: t0 + 61_000 });
        })(),
      );
    } else if (n === 200) {
      events.push(
        (async () => {
          // A cap a few requests above what the organisation was served so far (what the control
          // plane knows may lag behind by a report).
          cappedSpendLimit = servedCost(capped) + 100;
          await admin.setOrgCap({ orgId: capped, capMicros: cappedSpendLimit });
        })(),
      );
    } else if (n === 250) {
      events.push(
        admin.revokeKey({ keyId: revoked.keyId }).then((r) => {
          assert.equal(r.nodesConfirmed, 3);
          revokedAt = sent;
        }),
      );
    }
  };

  const servedCost = (orgId: string) => keys.filter((k) => k.orgId === orgId).reduce((s, k) => s + (admitted.get(k.keyId)?.cost ?? 0), 0);
  let sent = 0;
  const worker = async () => {
    while (sent < REQUESTS) {
      const i = sent++;
      onSent(i);
      const k = (i * 7) % keys.length;
      const key = keys[k];
      const node = nodes[i % 3];
      const revokeDone = revokedAt >= 0;
      const r = await request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key.key), json: chatBody(`request ${i}`) });
      const label = `${r.status} ${r.body?.error?.type ?? ''}`.trim();
      statuses.set(label, (statuses.get(label) ?? 0) + 1);
      if (key === revoked && revokeDone) assert.equal(r.status, 401, `the revoked key was served after its revocation returned: ${r.text}`);
      if (r.status === 200) {
        const a = admitted.get(key.keyId) ?? { requests: 0, tokensIn: 0, tokensOut: 0, cost: 0, byMinute: new Map() };
        a.requests++;
        a.tokensIn += r.body.usage.prompt_tokens;
        a.tokensOut += r.body.usage.completion_tokens;
        a.cost += costOf(r);
        maxCost = Math.max(maxCost, costOf(r));
        admitted.set(key.keyId, a);
      } else {
        assert.equal(r.status, 401, r.text);
        const type = r.body.error.type;
        if (key === revoked) assert.equal(type, 'authentication_error');
        else {
          assert.equal(type, 'insufficient_quota', `key of org ${orgOf(k)}: ${r.text}`);
          assert.ok(key.orgId === credited || key.orgId === capped, `org ${orgOf(k)} refused: ${r.text}`);
        }
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  await Promise.all(events);
  assert.ok(creditedAt >= 0 && revokedAt >= 0 && cappedSpendLimit >= 0);

  // The revoked key is refused on every node; the credited organisation is served on every node.
  for (const [i, n] of nodes.entries()) {
    const r = await request(`${n.url}/v1/chat/completions`, { method: 'POST', headers: bearer(revoked.key), json: chatBody() });
    assert.equal(r.status, 401, `node ${i}: ${r.text}`);
    assert.equal(r.body.error.type, 'authentication_error');
  }
  const creditedKey = keys[1 * KEYS_PER_ORG + 1];
  for (const [i, n] of nodes.entries()) {
    const r = await request(`${n.url}/v1/chat/completions`, { method: 'POST', headers: bearer(creditedKey.key), json: chatBody('after the load') });
    assert.equal(r.status, 200, `node ${i}: ${r.text}`);
    const a = admitted.get(creditedKey.keyId) ?? { requests: 0, tokensIn: 0, tokensOut: 0, cost: 0, byMinute: new Map() };
    a.requests++;
    a.tokensIn += r.body.usage.prompt_tokens;
    a.tokensOut += r.body.usage.completion_tokens;
    a.cost += costOf(r);
    admitted.set(creditedKey.keyId, a);
  }
  assert.ok((admitted.get(keys[1 * KEYS_PER_ORG].keyId)?.requests ?? 0) + (admitted.get(creditedKey.keyId)?.requests ?? 0) > 0);

  // Every admitted request billed exactly once: the usage database's totals per key equal what the
  // clients were served, in both minutes of the run.
  type Row = { key_id: string; minute: number; requests: number; prompt_tokens: number; completion_tokens: number; cost_micros: number };
  const expectedRequests = [...admitted.values()].reduce((s, a) => s + a.requests, 0);
  let rows: Row[] = [];
  await eventually(async () => {
    rows = await queryDb<Row>(cp.dbPath, 'SELECT key_id, minute, SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens, SUM(cost_micros) AS cost_micros FROM usage_minutes GROUP BY key_id, minute');
    return rows.reduce((s, r) => s + r.requests, 0) >= expectedRequests;
  }, 'every admitted request reported');
  const billed = new Map<string, { requests: number; tokensIn: number; tokensOut: number; cost: number }>();
  const minutes = new Set<number>();
  for (const r of rows) {
    const b = billed.get(r.key_id) ?? { requests: 0, tokensIn: 0, tokensOut: 0, cost: 0 };
    b.requests += r.requests;
    b.tokensIn += r.prompt_tokens;
    b.tokensOut += r.completion_tokens;
    b.cost += r.cost_micros;
    billed.set(r.key_id, b);
    minutes.add(r.minute);
  }
  assert.deepEqual([...minutes].sort(), [Math.floor((t0 + 1000) / 60_000), Math.floor((t0 + 61_000) / 60_000)], 'usage in both minutes of the run');
  for (const k of keys) {
    const a = admitted.get(k.keyId);
    const b = billed.get(k.keyId);
    assert.deepEqual(
      b ? { requests: b.requests, tokensIn: b.tokensIn, tokensOut: b.tokensOut } : undefined,
      a ? { requests: a.requests, tokensIn: a.tokensIn, tokensOut: a.tokensOut } : undefined,
      `key ${k.keyId}: billed what was served, once`,
    );
  }
  // Money per organisation: its month's spend is the cost of what its keys were served.
  for (let o = 0; o < ORGS; o++) {
    const orgId = keys[o * KEYS_PER_ORG].orgId;
    const cost = keys.filter((k) => k.orgId === orgId).reduce((s, k) => s + (billed.get(k.keyId)?.cost ?? 0), 0);
    await eventually(async () => (await admin.getOrg({ orgId })).monthSpendMicros === cost, `org ${o}'s spend equal to its usage`);
  }

  // The capped organisation: refused on every node, past its cap by at most the requests in flight.
  const org = await admin.getOrg({ orgId: capped });
  assert.ok(org.monthSpendMicros <= cappedSpendLimit + CONCURRENCY * maxCost, `spent ${org.monthSpendMicros}, cap ${cappedSpendLimit}, at most ${CONCURRENCY} requests of ${maxCost} in flight`);
  if (org.blocked) assert.equal(org.blockedReason, 'monthly_cap_reached');
  for (const [i, n] of nodes.entries()) {
    const r = await request(`${n.url}/v1/chat/completions`, { method: 'POST', headers: bearer(keys[2 * KEYS_PER_ORG + 1].key), json: chatBody() });
    assert.equal(r.status, 401, `node ${i}: ${r.text}`);
    assert.equal(r.body.error.type, 'insufficient_quota');
  }
  // The load did meet the refusals it was built to meet.
  assert.ok((statuses.get('401 insufficient_quota') ?? 0) > 0, `statuses ${JSON.stringify([...statuses])}`);
  assert.ok((statuses.get('401 authentication_error') ?? 0) > 0, `statuses ${JSON.stringify([...statuses])}`);
  assert.ok((statuses.get('200') ?? 0) > REQUESTS / 2, `statuses ${JSON.stringify([...statuses])}`);
});
