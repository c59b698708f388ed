// The rate headers across nodes (issue 32, finding 7; docs/leases.md, "Rate headers"): a node's
// `x-ratelimit-remaining-*` say what the key has left across the cluster as far as the node knows,
// never more, and count down by one per request it admits.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { type DataPlane } from '../helpers/processes.js';
import { bearer, chatBody, minuteStart, request, setClock, type HttpResult } from '../helpers/http.js';
import { eventually } from '../helpers/data-plane.js';
import { startGateway, type Gateway } from '../helpers/gateway-fixture.js';

/** A control plane and `n` connected nodes, every one on the same injected minute (the clock read once). */
async function cluster(t: TestContext, n: number): Promise<{ gw: Gateway; minute: number }> {
  const clock = minuteStart() + 2_000;
  const gw = await startGateway(t, { nodes: 0 });
  for (let i = 0; i < n; i++) {
    const node = await gw.addNode({ nodeId: `node-${i}`, adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
    await setClock(node.adminUrl!, { now_ms: clock });
  }
  await eventually(async () => (await gw.console.listNodes()).nodes.filter((x) => x.connected).length === n, `${n} nodes connected`);
  return { gw, minute: Math.floor(clock / 60_000) };
}

const chat = (node: DataPlane, key: string, content = 'Hello'): Promise<HttpResult> =>
  request(`${node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(key), json: chatBody(content) });

const remaining = (r: HttpResult, what: 'requests' | 'tokens') => Number(r.headers.get(`x-ratelimit-remaining-${what}`));

/** Node `n` holds the minute's standing shares of every key (a request of another key asked for them). */
async function holdsShares(gw: Gateway, n: DataPlane, minute: number): Promise<void> {
  const warm = await gw.fundedKey({ tier: 'free' });
  assert.equal((await chat(n, warm.key)).status, 200);
  await eventually(async () => ((await request(`${n.adminUrl}/stats/leases`)).body as { standing: { minutes: number[] } }).standing.minutes.includes(minute), 'the minute\'s standing shares');
}

test('a new free key\'s first 20 requests to one node of two report 19, 18, …, 0 left; the 21st is refused with 0', async (t) => {
  // Before: 1, 0, 15, 14, …, 1, 0, 1, 0. The node counted only its standing share until the control
  // plane said what the pool had free, and the other node's unused standing share as spent.
  const { gw, minute } = await cluster(t, 2);
  const [a, b] = gw.nodes;
  // Node b holds its standing share of the new key's minute, and uses none of it.
  await holdsShares(gw, b, minute);
  const { key } = await gw.fundedKey({ tier: 'free' });
  const requests: number[] = [];
  const tokens: number[] = [];
  for (let i = 0; i < 20; i++) {
    const r = await chat(a, key);
    assert.equal(r.status, 200, `request ${i}: ${r.text}`);
    assert.equal(r.headers.get('x-ratelimit-limit-requests'), '20');
    requests.push(remaining(r, 'requests'));
    tokens.push(remaining(r, 'tokens'));
  }
  assert.deepEqual(requests, Array.from({ length: 20 }, (_, i) => 19 - i));
  // Tokens: every request reserves its estimate and settles at its usage (17 tokens, more than the
  // estimate): what is left only goes down, and never says more than the key's 60,000 minus that.
  assert.ok(tokens[0] < 60_000, `first: ${tokens[0]}`);
  for (let i = 1; i < 20; i++) assert.ok(tokens[i] < tokens[i - 1], `tokens left went ${tokens[i - 1]} -> ${tokens[i]} at request ${i}: ${tokens.join(', ')}`);
  assert.ok(tokens[19] <= 60_000 - 18 * 17, `last: ${tokens[19]}`);
  const over = await chat(a, key);
  assert.equal(over.status, 429, over.text);
  assert.equal(over.body.error.type, 'requests');
  assert.equal(remaining(over, 'requests'), 0);
  assert.match(over.body.error.message, /requests per minute \(rpm\): 20\/20 used/);
});

test('what another node used counts once the control plane has said it: then one down per request, to 0 at the last', async (t) => {
  const { gw, minute } = await cluster(t, 2);
  const [a, b] = gw.nodes;
  await holdsShares(gw, a, minute);
  const { key } = await gw.fundedKey({ tier: 'free' });
  for (let i = 0; i < 5; i++) assert.equal((await chat(b, key, `on b ${i}`)).status, 200);
  await eventually(async () => {
    const s = (await request(`${b.adminUrl}/stats/leases`)).body as { used: { pending: number; sent: number; acked: number } };
    return s.used.pending === 0 && s.used.sent > 0 && s.used.acked === s.used.sent;
  }, 'the control plane knows what node b used');
  const seen: number[] = [];
  let refusal: HttpResult | undefined;
  for (let i = 0; i < 16 && !refusal; i++) {
    const r = await chat(a, key, `on a ${i}`);
    if (r.status === 429) refusal = r;
    else {
      assert.equal(r.status, 200, r.text);
      seen.push(remaining(r, 'requests'));
    }
  }
  assert.equal(seen.length, 15, `node a admitted what b left: ${seen.join(', ')}`);
  // Node a's first request is admitted from its standing share before it heard anything of the key
  // (19: as far as it knows); its third cannot be admitted without a grant, which carried b's 5.
  assert.ok(seen[0] <= 19 && seen[1] <= 18, seen.join(', '));
  assert.deepEqual(seen.slice(2), Array.from({ length: 13 }, (_, i) => 12 - i), seen.join(', '));
  assert.equal(remaining(refusal!, 'requests'), 0);
  assert.match(refusal!.body.error.message, /requests per minute \(rpm\): 20\/20 used/);
});
