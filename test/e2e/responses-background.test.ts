// Background responses (`POST /v1/responses` with `background: true`) through real processes: a
// control plane, two nodes and a fake upstream that answers background creates `queued` with no
// usage and reports the usage on a later GET once the test lets the response finish.
//
// Before the fix the create was billed from its `queued` answer, which has no usage: the input
// estimate (a few tokens, 3 µ$ here), and reading the finished response back (GET, GET ?stream=true,
// a resumed stream, cancel) billed nothing, so a response the upstream charged 1,500 tokens for cost
// the customer almost nothing. Now the creating node follows each one to its terminal status and bills
// the upstream's final usage exactly once; reads bill nothing on any node.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { tokenCostMicros } from '../../proto/lib/money.js';
import { estimateTokens } from '../../data-plane/proxy/tokens.js';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import type { DemoKey } from '../helpers/console.js';
import { eventually } from '../helpers/data-plane.js';
import { CANCEL_USAGE } from '../helpers/fake-background-responses.js';
import { startFakeResponsesUpstream, USAGE, type FakeResponsesUpstream } from '../helpers/fake-responses-upstream.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { bearer, request } from '../helpers/http.js';
import { runCliAsync, type DataPlane } from '../helpers/processes.js';
import { usageRowsOfKey, waitForUsageRows, waitForUsageTotals } from '../helpers/usage-db.js';

const IN_PRICE = 500_000; // up-chat: 0.50 USD per million input tokens
const OUT_PRICE = 1_500_000;
const CACHED_PRICE = 50_000;
/** The fake's terminal usage at up-chat's prices (cached input at the cached price). */
const USAGE_COST = Math.ceil(
  ((USAGE.input_tokens - USAGE.input_tokens_details.cached_tokens) * IN_PRICE + USAGE.input_tokens_details.cached_tokens * CACHED_PRICE + USAGE.output_tokens * OUT_PRICE) / 1_000_000,
);
/** What a response cancelled while running reports, at the same prices. */
const CANCEL_COST = tokenCostMicros(CANCEL_USAGE.input_tokens, CANCEL_USAGE.output_tokens, IN_PRICE, OUT_PRICE);

let upstream: FakeResponsesUpstream;
let n1: DataPlane;
let n2: DataPlane;

const gw = gatewayFixture(
  async () => {
    upstream = await startFakeResponsesUpstream();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          // A tier of one parallel request: a running background response holds it.
          cfg.tiers.single = { rpm: 100, tpm: 100_000, max_parallel_requests: 1, monthly_cap_usd: null, free_grant_usd: '5.00', models: [] };
          addUpstreamModel(cfg, 'up-chat', upstream.baseUrl, ['free', 'paid', 'single'], { cached_input_usd_per_mtok: '0.05' });
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-test' },
      },
      // Each report is sent as soon as it is journaled: a test waits for its row, not for the once-a-second send.
      nodes: [{ nodeId: 'bg-1', extraArgs: ['--report-every-ms', '0'] }, { nodeId: 'bg-2', extraArgs: ['--report-every-ms', '0'] }],
    };
  },
  (g) => {
    [n1, n2] = g.nodes;
  },
);

after(async () => {
  await upstream?.close();
});

function create(node: DataPlane, k: DemoKey, extra: Record<string, unknown> = {}) {
  return request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: 'Think about otters, slowly.', background: true, ...extra } });
}

function read(node: DataPlane, k: DemoKey, id: string, query = '') {
  return request(`${node.url}/v1/responses/${id}${query}`, { headers: bearer(k.key) });
}

/** The key's model calls once the create's is recorded (reads record none): [path, in, out, µ$]. */
async function billed(k: DemoKey): Promise<Array<[string, number, number, number]>> {
  const rows = await waitForUsageRows(gw.cp.dbPath, k.keyId, 1, 20_000);
  return rows.map((r) => [r.path, r.prompt_tokens, r.completion_tokens, r.cost_micros]);
}

/**
 * The key's summed usage in the state database: [model, requests, µ$]. Waited for: a report's usage
 * and its log rows are written in two transactions, so the log row may be read first.
 */
async function totals(k: DemoKey): Promise<Array<[string, number, number]>> {
  return (await waitForUsageTotals(gw.cp.dbPath, k.keyId, 1, 20_000)).map((r) => [r.model, r.requests, r.cost_micros]);
}

/** Reads an SSE answer until `until` is in it (or it ends); returns the text so far and the reader. */
async function readUntil(res: Response, until: string | null): Promise<string> {
  const reader = res.body!.getReader();
  let text = '';
  for (;;) {
    if (until !== null && text.includes(until)) break;
    const r = await reader.read();
    if (r.done) break;
    text += Buffer.from(r.value).toString();
  }
  reader.releaseLock();
  return text;
}

function sequenceNumbers(sse: string): number[] {
  return [...sse.matchAll(/"sequence_number":(\d+)/g)].map((m) => Number(m[1]));
}

test('a background response never read back is billed its terminal usage once, at the model prices', async () => {
  const k = await gw.fundedKey();
  const r = await create(n1, k);
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.status, 'queued');
  assert.equal(r.body.usage, null);
  upstream.background.finish(r.body.id);
  assert.deepEqual(await billed(k), [['/v1/responses', USAGE.input_tokens, USAGE.output_tokens, USAGE_COST]]);
  assert.deepEqual(await totals(k), [['up-chat', 1, USAGE_COST]]);
  const cli = await runCliAsync(gw.cp, gw.cp.secrets.operatorToken, ['--json', 'usage', '--project', k.projectId, '--by', 'model']);
  assert.equal(cli.code, 0, cli.stderr);
  assert.deepEqual(
    JSON.parse(cli.stdout).rows.map((x: any) => [x.model, x.requests, x.input_tokens, x.output_tokens]),
    [['up-chat', 1, USAGE.input_tokens, USAGE.output_tokens]],
  );
});

test('read many times on two nodes (GET, GET ?stream=true, resumed with starting_after): billed exactly once', async () => {
  const k = await gw.fundedKey();
  const r = await create(n1, k);
  assert.equal(r.status, 200, r.text);
  const id = r.body.id as string;
  await eventually(async () => (await read(n2, k, id)).status === 200, `${id} known on node 2`);
  for (const node of [n1, n2, n1, n2]) {
    const got = await read(node, k, id);
    assert.equal(got.status, 200, got.text);
    assert.equal(got.body.status, 'in_progress');
  }
  // A stream read while it runs, on node 2: it follows the response to its end.
  const live = await fetch(`${n2.url}/v1/responses/${id}?stream=true`, { headers: bearer(k.key) });
  assert.equal(live.status, 200);
  const liveHead = await readUntil(live, 'response.output_text.delta');
  upstream.background.finish(id);
  const liveText = liveHead + (await readUntil(live, null));
  assert.match(liveText, /response\.completed/);
  // Resumed after the first three events, on node 1.
  const resumed = await read(n1, k, id, '?stream=true&starting_after=2');
  assert.equal(resumed.status, 200);
  assert.deepEqual(sequenceNumbers(resumed.text), [3, 4]);
  assert.match(resumed.text, / hello\./);
  const done = await read(n2, k, id);
  assert.equal(done.body.status, 'completed');
  assert.deepEqual(await billed(k), [['/v1/responses', USAGE.input_tokens, USAGE.output_tokens, USAGE_COST]]);
  // Read again after it was billed: still one bill.
  assert.equal((await read(n1, k, id)).status, 200);
  assert.equal((await read(n2, k, id, '?stream=true&starting_after=0')).status, 200);
  assert.equal((await usageRowsOfKey(gw.cp.dbPath, k.keyId)).length, 1);
  assert.deepEqual(await totals(k), [['up-chat', 1, USAGE_COST]]);
});

test('cancelled by its client (on another node): billed the usage the cancelled response reports', async () => {
  const k = await gw.fundedKey();
  const r = await create(n1, k);
  const id = r.body.id as string;
  await eventually(async () => (await read(n2, k, id)).status === 200, `${id} known on node 2`);
  const c = await request(`${n2.url}/v1/responses/${id}/cancel`, { method: 'POST', headers: bearer(k.key) });
  assert.equal(c.status, 200, c.text);
  assert.equal(c.body.status, 'cancelled');
  assert.deepEqual(c.body.usage, CANCEL_USAGE);
  assert.deepEqual(await billed(k), [['/v1/responses', CANCEL_USAGE.input_tokens, CANCEL_USAGE.output_tokens, CANCEL_COST]]);
  assert.deepEqual(await totals(k), [['up-chat', 1, CANCEL_COST]]);
});

test('its key revoked while it runs: cancelled upstream and billed what it used', async () => {
  const k = await gw.fundedKey();
  const r = await create(n1, k);
  const id = r.body.id as string;
  assert.equal((await read(n1, k, id)).body.status, 'in_progress');
  const revoked = await gw.console.revokeKey({ keyId: k.keyId });
  assert.equal(revoked.apiKey?.status, 'revoked');
  const cancels = () => upstream.requests.filter((x) => x.method === 'POST' && x.url === `/v1/responses/${id}/cancel`);
  await eventually(async () => cancels().length === 1, 'the node cancelled the response upstream');
  assert.equal(cancels()[0].headers.authorization, 'Bearer sk-upstream-test');
  assert.deepEqual(await billed(k), [['/v1/responses', CANCEL_USAGE.input_tokens, CANCEL_USAGE.output_tokens, CANCEL_COST]]);
  assert.equal(cancels().length, 1);
});

test('stream and background: a client that leaves and resumes with starting_after on another node is billed once', async () => {
  const k = await gw.fundedKey();
  const ac = new AbortController();
  const res = await fetch(`${n1.url}/v1/responses`, {
    method: 'POST',
    headers: { ...bearer(k.key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'up-chat', input: 'Stream and stay.', background: true, stream: true }),
    signal: ac.signal,
  });
  assert.equal(res.status, 200);
  const head = await readUntil(res, 'response.output_text.delta');
  const id = /"id":"(resp_[0-9a-f]+)"/.exec(head)![1];
  const last = Math.max(...sequenceNumbers(head));
  ac.abort();
  // The node reads the upstream on for a few seconds after its client left, then lets go: from then on
  // only following the response can see its end.
  await eventually(async () => upstream.background.streamsOpen(id) === 0, 'the node let go of the create stream');
  await eventually(async () => (await read(n2, k, id)).status === 200, `${id} known on node 2`);
  // The node sends the head with the first event (reply.ts), so the resumed answer is awaited once the
  // upstream has the resume and the response finished.
  const resuming = fetch(`${n2.url}/v1/responses/${id}?stream=true&starting_after=${last}`, { headers: bearer(k.key) });
  await eventually(async () => upstream.requests.some((x) => x.url === `/v1/responses/${id}?stream=true&starting_after=${last}`), 'the resume reached the upstream');
  upstream.background.finish(id);
  const resumed = await resuming;
  assert.equal(resumed.status, 200);
  const rest = await readUntil(resumed, null);
  assert.deepEqual(sequenceNumbers(rest), [3, 4]);
  assert.match(rest, /response\.completed/);
  assert.deepEqual(await billed(k), [['/v1/responses', USAGE.input_tokens, USAGE.output_tokens, USAGE_COST]]);
  assert.deepEqual(await totals(k), [['up-chat', 1, USAGE_COST]]);
});

test('a background response the upstream no longer has is billed safely above what it could have used', async () => {
  const k = await gw.fundedKey();
  const body = { model: 'up-chat', input: 'Think about otters, slowly.', background: true, max_output_tokens: 500 };
  const r = await create(n1, k, { max_output_tokens: 500 });
  assert.equal(r.status, 200, r.text);
  // Its retention passed before its end was seen: the input estimate plus all the output it allowed.
  upstream.background.forget(r.body.id);
  const input = estimateTokens(body);
  assert.deepEqual(await billed(k), [['/v1/responses', input, 500, tokenCostMicros(input, 500, IN_PRICE, OUT_PRICE)]]);
});

test('the demo provider answers a background create queued, then completes it; billed once from its usage', async () => {
  const k = await gw.fundedKey();
  const r = await request(`${n1.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'demo-chat', input: 'Hello in the background', background: true } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.status, 'queued');
  assert.equal(r.body.usage, null);
  let final: any;
  await eventually(async () => (final = (await read(n1, k, r.body.id)).body).status === 'completed', 'the demo response completed');
  assert.match(final.output[0].content[0].text, /Hello in the background/);
  const cost = tokenCostMicros(final.usage.input_tokens, final.usage.output_tokens, 500_000, 1_500_000);
  assert.deepEqual(await billed(k), [['/v1/responses', final.usage.input_tokens, final.usage.output_tokens, cost]]);
});

test('a running background response holds its parallel request until it is billed', async () => {
  // Before the fix the slot was given back with the `queued` answer: a key of one parallel request
  // could run any number of background responses at once.
  const k = await gw.fundedKey({ tier: 'single' });
  const first = await create(n1, k);
  assert.equal(first.status, 200, first.text);
  const second = await create(n1, k);
  assert.equal(second.status, 429, second.text);
  assert.equal(second.body.error.type, 'max_parallel_requests');
  upstream.background.finish(first.body.id);
  await billed(k);
  const third = await create(n1, k);
  assert.equal(third.status, 200, third.text);
  upstream.background.finish(third.body.id);
});

test("a background response's output items are the project's once it completes: an item_reference to one passes, on both nodes", async () => {
  // Before the fix only a create's own answer recorded its output items, and a background create's
  // answer (`queued`) has none: an item_reference to its output was refused 404 as another's.
  const k = await gw.fundedKey();
  const r = await create(n1, k);
  assert.equal(r.status, 200, r.text);
  const id = r.body.id as string;
  upstream.background.finish(id);
  await billed(k);
  const item = `msg_${id.slice(5)}`;
  const refer = (node: DataPlane) =>
    request(`${node.url}/v1/responses`, { method: 'POST', headers: bearer(k.key), json: { model: 'up-chat', input: [{ type: 'item_reference', id: item }, { role: 'user', content: 'Go on.' }] } });
  const mine = await refer(n1);
  assert.equal(mine.status, 200, mine.text);
  assert.deepEqual(upstream.requests.at(-1)!.body.input[0], { type: 'item_reference', id: item });
  // The record travels with the others: the other node lets the project name it too.
  await eventually(async () => (await refer(n2)).status === 200, `${item} known on node 2`);
  // Another project still may not.
  const other = await gw.fundedKey();
  const theirs = await request(`${n1.url}/v1/responses`, { method: 'POST', headers: bearer(other.key), json: { model: 'up-chat', input: [{ type: 'item_reference', id: item }] } });
  assert.equal(theirs.status, 404, theirs.text);
});
