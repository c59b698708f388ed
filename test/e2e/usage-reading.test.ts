// Reading usage: GET /v1/usage on a node answers an API key about its own project only (never another
// project's, even in the same organisation, whatever the query says), and the console's `usage`,
// `key show` and `key find` answer members of the organisation and nobody else. Real processes: a
// control plane, a node with an injected clock, the official openai client for the model calls, and the
// CLI as a process (key find reads the value on standard input).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { credentials, Metadata, status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';
import OpenAI from 'openai';
import { QueryUsageRequest, SyncServiceClient, type QueryUsageResponse } from '../../proto/gen/tollgate/v1/sync.js';
import { tokenCostMicros } from '../../proto/lib/money.js';
import { assertFails, assertNoStackTrace, assertUsageError } from '../helpers/console-cli.js';
import { consoleClient, createKey, type Console, type DemoKey } from '../helpers/console.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { bearer, rawRequest, request, setClock } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, runProcessAsync, scriptArgs, type CliResult, type ControlPlane, type DataPlane } from '../helpers/processes.js';
import { waitForUsageTotals } from '../helpers/usage-db.js';
import { waitUntilKnown } from '../helpers/data-plane.js';

// 2026-03-10T23:58:00Z: two minutes before a UTC day ends, so usage falls on two days.
const T0 = Date.UTC(2026, 2, 10, 23, 58, 0);
const DAY1 = '2026-03-10';
const DAY2 = '2026-03-11';
const RANGE_START = Math.floor(T0 / 1000) - 3600;
const RANGE_END = Math.floor(T0 / 1000) + 3600;
const CHAT_IN = 500_000; // demo-chat: 0.50 USD per million input tokens
const CHAT_OUT = 1_500_000;
const EMBED_IN = 20_000;

let cp: ControlPlane;
let node: DataPlane;
let op: Console;
let a: DemoKey; // project A
let a2: DemoKey; // project A, second key (revoked later in the console test)
let b: DemoKey; // project B, same organisation
let memberToken: string;
let outsiderToken: string;

interface Tally {
  requests: number;
  input: number;
  output: number;
  cost: number;
}
const tally = (): Tally => ({ requests: 0, input: 0, output: 0, cost: 0 });
/** What the clients saw, by project, then by model, day and key. */
const seen = new Map<string, { model: Map<string, Tally>; day: Map<string, Tally>; key: Map<string, Tally>; all: Tally }>();

function note(projectId: string, keyId: string, model: string, day: string, input: number, output: number, cost: number): void {
  let p = seen.get(projectId);
  if (!p) seen.set(projectId, (p = { model: new Map(), day: new Map(), key: new Map(), all: tally() }));
  for (const [m, k] of [
    [p.model, model],
    [p.day, day],
    [p.key, keyId],
  ] as const) {
    if (!m.has(k)) m.set(k, tally());
  }
  for (const t of [p.model.get(model)!, p.day.get(day)!, p.key.get(keyId)!, p.all]) {
    t.requests++;
    t.input += input;
    t.output += output;
    t.cost += cost;
  }
}

async function chat(k: DemoKey, day: string, content: string): Promise<void> {
  const client = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const r = await client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content }] });
  const u = r.usage!;
  note(k.projectId, k.keyId, 'demo-chat', day, u.prompt_tokens, u.completion_tokens, tokenCostMicros(u.prompt_tokens, u.completion_tokens, CHAT_IN, CHAT_OUT));
}

async function embed(k: DemoKey, day: string, input: string): Promise<void> {
  const client = new OpenAI({ apiKey: k.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const r = await client.embeddings.create({ model: 'demo-embed', input });
  note(k.projectId, k.keyId, 'demo-embed', day, r.usage.prompt_tokens, 0, tokenCostMicros(r.usage.prompt_tokens, 0, EMBED_IN, 0));
}

function expectedBuckets(projectId: string, by: 'model' | 'day' | 'key'): Record<string, unknown>[] {
  const field = by === 'key' ? 'key_id' : by;
  return [...seen.get(projectId)![by].entries()]
    .sort(([x], [y]) => (x < y ? -1 : 1))
    .map(([group, t]) => ({ object: 'usage.bucket', [field]: group, requests: t.requests, input_tokens: t.input, output_tokens: t.output, cost_micros: t.cost, cost_usd: usd(t.cost) }));
}

function expectedTotals(projectId: string): Record<string, unknown> {
  const t = seen.get(projectId)!.all;
  return { requests: t.requests, input_tokens: t.input, output_tokens: t.output, cost_micros: t.cost, cost_usd: usd(t.cost) };
}

function usd(micros: number): string {
  const whole = Math.floor(micros / 1_000_000);
  let frac = String(micros % 1_000_000).padStart(6, '0').replace(/0+$/, '');
  if (frac.length < 2) frac = frac.padEnd(2, '0');
  return `${whole}.${frac}`;
}

function usageUrl(query: string): string {
  return `${node.url}/v1/usage${query ? `?${query}` : ''}`;
}

const range = `start_time=${RANGE_START}&end_time=${RANGE_END}`;

/** A Shape A error body with the given status, param and type. */
function assertShapeA(r: { status: number; body: any }, status: number, param: string | null, what: string): void {
  assert.equal(r.status, status, `${what}: ${JSON.stringify(r.body)}`);
  assert.equal(typeof r.body?.error?.message, 'string', what);
  assert.equal(r.body.error.code, String(status), what);
  assert.equal(r.body.error.param, param, what);
  assert.equal('data' in r.body, false, `${what}: no usage in an error`);
}

/** The CLI as a process with `input` on its standard input. */
function cliWithStdin(token: string, args: string[], input: string): Promise<CliResult> {
  return runProcessAsync(process.execPath, [...scriptArgs('cli/main.ts'), '--control-plane', cp.address, '--token', token, ...args], {
    env: { ...process.env, TOLLGATE_TOKEN: '', TOLLGATE_CONTROL_PLANE: '' },
    input,
  });
}

gatewayFixture({ node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } } }, async (g) => {
  ({ cp, node, console: op } = g);
  await setClock(node.adminUrl!, { now_ms: T0 });
  a = await g.fundedKey({ name: 'a' });
  a2 = await g.fundedKey({ orgId: a.orgId, projectId: a.projectId, name: 'a2' });
  b = await g.fundedKey({ orgId: a.orgId, name: 'b' });
  assert.notEqual(a.projectId, b.projectId);
  const member = await op.createAccount({ name: 'member' });
  await op.addMember({ orgId: a.orgId, accountId: member.account!.id, role: 'member' });
  memberToken = member.token;
  // The owner of another organisation: a console user, but no member of A's.
  const outsider = await g.fundedKey({ name: 'outsider-key', knownOn: [] });
  const outsiderAcct = await op.createAccount({ name: 'outsider' });
  await op.addMember({ orgId: outsider.orgId, accountId: outsiderAcct.account!.id, role: 'owner' });
  outsiderToken = outsiderAcct.token;

  await chat(a, DAY1, 'Hello from project A');
  await chat(a, DAY1, 'A second question from project A, a little longer');
  await embed(a, DAY1, 'embed this text for project A');
  await chat(a2, DAY1, 'The other key of project A');
  await chat(b, DAY1, 'Hello from project B');
  await chat(b, DAY1, 'Project B asks again');
  await embed(b, DAY1, 'project B embeds');
  await chat(b, DAY1, 'Project B, third time');
  // Past midnight UTC: the next day.
  await setClock(node.adminUrl!, { advance_ms: 3 * 60_000 });
  await chat(a, DAY2, 'Project A after midnight');
  await waitForUsageTotals(cp.dbPath, a.keyId, 4);
  await waitForUsageTotals(cp.dbPath, a2.keyId, 1);
  await waitForUsageTotals(cp.dbPath, b.keyId, 4);
});


test('GET /v1/usage answers each key with its own project only, grouped by model, day or key', async () => {
  for (const k of [a, b]) {
    for (const by of ['model', 'day', 'key'] as const) {
      const r = await request(usageUrl(`${range}&group_by=${by}`), { headers: bearer(k.key) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.headers.get('content-type'), 'application/json');
      assert.deepEqual(r.body, {
        object: 'list',
        project_id: k.projectId,
        group_by: by,
        start_time: RANGE_START,
        end_time: RANGE_END,
        data: expectedBuckets(k.projectId, by),
        totals: expectedTotals(k.projectId),
      });
    }
  }
  // Spot checks that the expectations themselves mean something.
  const byDay = (await request(usageUrl(`${range}&group_by=day`), { headers: bearer(a.key) })).body;
  assert.deepEqual(byDay.data.map((d: any) => [d.day, d.requests]), [[DAY1, 4], [DAY2, 1]]);
  const byKey = (await request(usageUrl(`${range}&group_by=key`), { headers: bearer(a.key) })).body;
  assert.deepEqual(byKey.data.map((d: any) => d.key_id).sort(), [a.keyId, a2.keyId].sort(), "both keys of project A, never project B's");
  const bTotals = (await request(usageUrl(range), { headers: bearer(b.key) })).body.totals;
  assert.equal(bTotals.requests, 4);
});

test('the defaults: grouped by day, from the start of the current UTC month, no upper bound; the official client reads it too', async () => {
  const client = new OpenAI({ apiKey: a.key, baseURL: `${node.url}/v1`, maxRetries: 0 });
  const body = (await client.get('/usage')) as any;
  assert.equal(body.object, 'list');
  assert.equal(body.project_id, a.projectId);
  assert.equal(body.group_by, 'day');
  assert.equal(body.start_time, Date.UTC(2026, 2, 1) / 1000);
  assert.equal(body.end_time, null);
  assert.deepEqual(body.data, expectedBuckets(a.projectId, 'day'));
  // A window that ends before the first request holds nothing.
  const empty = await request(usageUrl(`start_time=${RANGE_START}&end_time=${Math.floor(T0 / 1000)}`), { headers: bearer(a.key) });
  assert.equal(empty.status, 200);
  assert.deepEqual(empty.body.data, []);
  assert.deepEqual(empty.body.totals, { requests: 0, input_tokens: 0, output_tokens: 0, cost_micros: 0, cost_usd: '0.00' });
});

test('a key cannot read another project, whatever the query, path or headers say', async () => {
  // A key of project A of its own: each refused query keeps its one request of rpm (a 400, the one
  // rule of docs/design.md#what-counts-as-a-request), and these are 17 of its 20.
  const probe = await createKey(op, { orgId: a.orgId, projectId: a.projectId, name: 'probe' });
  await waitUntilKnown(node.url, probe.key);
  const own = (await request(usageUrl(`${range}&group_by=model`), { headers: bearer(probe.key) })).body;
  const refused: Array<[string, string | null]> = [
    [`project_id=${b.projectId}`, 'project_id'],
    [`${range}&project_id=${b.projectId}`, 'project_id'],
    [`project=${b.projectId}`, 'project'],
    [`key_id=${b.keyId}`, 'key_id'],
    [`org_id=${b.orgId}`, 'org_id'],
    [`group_by=project`, 'group_by'],
    [`group_by=model&group_by=key`, 'group_by'],
    [`start_time=1&start_time=2`, 'start_time'],
    [`start_time=abc`, 'start_time'],
    [`start_time=-5`, 'start_time'],
    [`start_time=1.5`, 'start_time'],
    [`start_time=99999999999999`, 'start_time'],
    [`start_time=${RANGE_END}&end_time=${RANGE_START}`, 'end_time'],
    [`end_time=`, 'end_time'],
    [`limit=5`, 'limit'],
  ];
  for (const [query, param] of refused) {
    const r = await request(usageUrl(query), { headers: bearer(probe.key) });
    assertShapeA(r, 400, param, query);
    assert.equal(r.body.error.type, 'invalid_request_error', query);
    assert.ok(!r.body.error.message.includes(b.projectId), `${query}: the message names no other project`);
  }
  // Another project's id in the path is no route.
  const pathTrick = await request(`${node.url}/v1/usage/${b.projectId}`, { headers: bearer(a.key) });
  assert.equal(pathTrick.status, 404);
  assert.ok(!JSON.stringify(pathTrick.body).includes('"data"'));
  // Headers that name a project elsewhere change nothing here.
  const headerTrick = await request(usageUrl(`${range}&group_by=model`), {
    headers: { ...bearer(probe.key), 'openai-project': b.projectId, 'x-project-id': b.projectId, 'openai-organization': b.orgId },
  });
  assert.equal(headerTrick.status, 200);
  assert.deepEqual(headerTrick.body, own);
  // Only GET.
  const post = await request(usageUrl(''), { method: 'POST', headers: bearer(a.key), json: { project_id: b.projectId } });
  assertShapeA(post, 405, null, 'POST /v1/usage');
  assert.equal(post.headers.get('allow'), 'GET');
  // No key, or a key that is no key: 401 in Shape A.
  assertShapeA(await request(usageUrl(range)), 401, null, 'no key');
  assertShapeA(await request(usageUrl(range), { headers: bearer(`${a.key.slice(0, -4)}zzzz`) }), 401, null, 'unknown key');
});

test('a usage read counts one request against the key; a query refused for what it holds (400) keeps its one, as every 400 after admission does', async () => {
  const remaining = (r: { headers: Headers }) => Number(r.headers.get('x-ratelimit-remaining-requests'));
  const first = await request(usageUrl(range), { headers: bearer(b.key) });
  assert.equal(first.status, 200);
  assert.equal(first.headers.get('x-ratelimit-limit-requests'), '20');
  const bad = await request(usageUrl('group_by=nope'), { headers: bearer(b.key) });
  assert.equal(bad.status, 400);
  assert.equal(remaining(bad), remaining(first) - 1, 'a 400 keeps its request');
  const second = await request(usageUrl(range), { headers: bearer(b.key) });
  assert.equal(remaining(second), remaining(bad) - 1, 'a served read costs one request');
});

test('console: members of the organisation read usage, key show and key find; non-members get not found', async () => {
  const since = new Date(RANGE_START * 1000).toISOString();
  const until = new Date(RANGE_END * 1000).toISOString();
  // A member (the lowest role) reads any project of the organisation.
  for (const k of [a, b]) {
    const u = await cliJsonAsync(cp, memberToken, ['usage', '--project', k.projectId, '--since', since, '--until', until, '--by', 'model']);
    const t = seen.get(k.projectId)!.all;
    assert.deepEqual(u.totals, { requests: t.requests, input_tokens: t.input, output_tokens: t.output, cost_usd: usd(t.cost) });
    assert.deepEqual(
      u.rows.map((r: any) => [r.model, r.requests, r.input_tokens, r.output_tokens, r.cost_usd]),
      expectedBuckets(k.projectId, 'model').map((x: any) => [x.model, x.requests, x.input_tokens, x.output_tokens, x.cost_usd]),
    );
    assert.equal(u.since, since);
    assert.equal(u.until, until);
  }
  const byDay = await cliJsonAsync(cp, memberToken, ['usage', '--project', a.projectId, '--since', DAY1, '--by', 'day']);
  assert.deepEqual(byDay.rows.map((r: any) => [r.day, r.requests]), [[DAY1, 4], [DAY2, 1]]);
  const byKey = await cliJsonAsync(cp, memberToken, ['usage', '--org', a.orgId, '--since', since, '--until', until, '--by', 'key']);
  assert.deepEqual(byKey.rows.map((r: any) => r.key_id).sort(), [a.keyId, a2.keyId, b.keyId].sort());
  const table = await runCliAsync(cp, memberToken, ['usage', '--project', a.projectId, '--since', since, '--until', until, '--by', 'model']);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /^MODEL\s+REQUESTS\s+INPUT_TOKENS\s+OUTPUT_TOKENS\s+COST_USD$/m);
  assert.match(table.stdout, /^total: 5 requests, \d+ input tokens, \d+ output tokens, [\d.]+ USD$/m);

  // key show: the record with revoked_at and limits, the prefix only.
  const shown = await cliJsonAsync(cp, memberToken, ['key', 'show', a.keyId]);
  assert.equal(shown.id, a.keyId);
  assert.equal(shown.project_id, a.projectId);
  assert.equal(shown.org_id, a.orgId);
  assert.equal(shown.status, 'active');
  assert.equal(shown.revoked_at, null);
  assert.equal(shown.rpm_limit, 20);
  assert.deepEqual(shown.allowed_models, []);
  assert.equal(shown.key_prefix, `${a.key.slice(0, 12)}...${a.key.slice(-4)}`);

  // key find: the value on standard input, for an active key and for a revoked one.
  const foundActive = await cliWithStdin(memberToken, ['--json', 'key', 'find'], `${a.key}\n`);
  assert.equal(foundActive.code, 0, foundActive.stderr);
  const fa = JSON.parse(foundActive.stdout);
  assert.deepEqual([fa.id, fa.project_id, fa.org_id, fa.status, fa.revoked_at], [a.keyId, a.projectId, a.orgId, 'active', null]);
  const revoked = await runCliAsync(cp, cp.secrets.operatorToken, ['key', 'revoke', a2.keyId]);
  assert.equal(revoked.code, 0, revoked.stderr);
  const foundRevoked = await cliWithStdin(memberToken, ['--json', 'key', 'find'], `  ${a2.key}  \r\n`);
  assert.equal(foundRevoked.code, 0, foundRevoked.stderr);
  const fr = JSON.parse(foundRevoked.stdout);
  assert.deepEqual([fr.id, fr.project_id, fr.org_id, fr.status], [a2.keyId, a2.projectId, a2.orgId, 'revoked']);
  assert.match(fr.revoked_at, /^\d{4}-\d{2}-\d{2}T/);
  const text = await cliWithStdin(cp.secrets.operatorToken, ['key', 'find'], a.key);
  assert.equal(text.code, 0, text.stderr);
  assert.match(text.stdout, new RegExp(`^id:\\s+${a.keyId}$`, 'm'));
  assert.match(text.stdout, /^status:\s+active$/m);
  assert.match(text.stdout, new RegExp(`tollgate key revoke ${a.keyId}`));
  // The revoked key's usage still counts for its project, and the key reads nothing any more.
  // (A fresh connection: the CLI runs above blocked this process's event loop, so a pooled socket the
  // node closed as idle meanwhile would look alive to fetch.)
  const afterRevoke = await rawRequest(node.address, `GET /v1/usage?${range} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ${a2.key}\r\nConnection: close\r\n\r\n`);
  assert.equal(afterRevoke.status, 401);

  // Non-members: the same "not found" as for something that does not exist.
  assertFails(await runCliAsync(cp, outsiderToken, ['usage', '--project', a.projectId]), 404, 'usage of another organisation');
  assertFails(await runCliAsync(cp, outsiderToken, ['usage', '--org', a.orgId]), 404, 'usage of another organisation');
  assertFails(await runCliAsync(cp, outsiderToken, ['key', 'show', a.keyId]), 404, 'key show of another organisation');
  const outsiderFind = await cliWithStdin(outsiderToken, ['key', 'find'], a.key);
  const unknownFind = await cliWithStdin(outsiderToken, ['key', 'find'], `${a.key.slice(0, -4)}zzzz`);
  assertFails(outsiderFind, 404, 'key find of another organisation');
  assertFails(unknownFind, 404, 'key find of no key');
  assert.equal(outsiderFind.stderr, unknownFind.stderr, 'a non-member cannot tell a key of another organisation from no key');
  assertFails(await runCliAsync(cp, outsiderToken, ['key', 'show', 'key_doesnotexist']), 404, 'key show of no key');
  // No token at all.
  assertFails(await cliWithStdin('', ['key', 'find'], a.key), 401, 'key find without a token');

  // Never an argument, and the refusal does not echo it.
  const asArg = await runCliAsync(cp, memberToken, ['key', 'find', a.key]);
  assertUsageError(asArg, 'key find with the value as an argument', /standard input/);
  assert.ok(!`${asArg.stdout}${asArg.stderr}`.includes(a.key.slice(13)), 'the value is not echoed');
  assertUsageError(await cliWithStdin(memberToken, ['key', 'find'], '\n\n'), 'key find with nothing on stdin', /no key value/);
  // A terminal on standard input (util-linux `script` gives the CLI a pseudo-terminal): refused at once,
  // rather than waiting for a value that would echo on screen.
  const command = [process.execPath, ...scriptArgs('cli/main.ts'), '--control-plane', cp.address, '--token', memberToken, 'key', 'find'].join(' ');
  const tty = await runProcessAsync('script', ['-qec', command, '/dev/null']);
  assert.equal(tty.code, 2, `${tty.stdout}${tty.stderr}`);
  assert.match(tty.stdout, /^400 key find reads the key value from standard input, and standard input is a terminal/);
  assertUsageError(await cliWithStdin(memberToken, ['key', 'find'], 'x'.repeat(5000)), 'key find with a huge stdin', /not one key value/);
  // Bad flags of usage.
  assertUsageError(await runCliAsync(cp, memberToken, ['usage', '--project', a.projectId, '--by', 'project']), 'usage --by project', /--by/);
  assertUsageError(await runCliAsync(cp, memberToken, ['usage', '--project', a.projectId, '--since', 'yesterday']), 'usage --since yesterday', /--since/);
  assertUsageError(await runCliAsync(cp, memberToken, ['usage', '--project', a.projectId, '--month', '2026-03', '--since', DAY1]), 'usage --month with --since', /either/);
  const backwards = await runCliAsync(cp, memberToken, ['usage', '--project', a.projectId, '--since', DAY2, '--until', DAY1]);
  assertFails(backwards, 400, 'until before since', { message: /later than since/ });
});

test('key find is rate-limited per caller; guessing is hopeless anyway', async () => {
  const acct = await op.createAccount({ name: 'guesser' });
  const guesser = consoleClient(cp.address, acct.token);
  try {
    const outcomes: string[] = [];
    // 61 lookups cannot all fall in windows of 30 unless they span three clock minutes.
    for (let i = 0; i < 61; i++) {
      const code = await guesser.findKey({ key: `sk-tollgate-${String(i).padStart(43, '0')}` }).then(
        () => 'found',
        (e: ServiceError) => GrpcStatus[e.code],
      );
      outcomes.push(code);
    }
    assert.ok(outcomes.includes('RESOURCE_EXHAUSTED'), `some lookups refused: ${outcomes.join(',')}`);
    assert.ok(outcomes.every((o) => o === 'NOT_FOUND' || o === 'RESOURCE_EXHAUSTED'), outcomes.join(','));
  } finally {
    guesser.close();
  }
});

test('no key value appears in the output of the control plane or the node', () => {
  for (const k of [a, a2, b]) {
    const secret = k.key.slice(12);
    assert.ok(!cp.proc.output().includes(secret), 'control plane output');
    assert.ok(!node.proc.output().includes(secret), 'node output');
  }
  assertNoStackTrace({ code: 0, stdout: node.proc.output(), stderr: '' }, 'node output');
});

test('SyncService.QueryUsage: node token required, project from the key record, revoked key not found, bad bounds refused', async () => {
  const client = new SyncServiceClient(cp.address, credentials.createInsecure());
  const ask = (token: string, req: Partial<QueryUsageRequest>) =>
    new Promise<{ code: string; res?: QueryUsageResponse }>((resolve) => {
      const md = new Metadata();
      md.set('authorization', `Bearer ${token}`);
      const full = QueryUsageRequest.fromPartial({ sinceMs: RANGE_START * 1000, untilMs: RANGE_END * 1000, groupBy: 'model', ...req });
      client.queryUsage(full, md, { deadline: Date.now() + 10_000 }, (err, res) => resolve(err ? { code: GrpcStatus[err.code] } : { code: 'OK', res }));
    });
  try {
    const okB = await ask(cp.secrets.nodeToken, { keyId: b.keyId });
    assert.equal(okB.code, 'OK');
    assert.equal(okB.res!.projectId, b.projectId);
    assert.deepEqual(okB.res!.buckets.map((x) => [x.group, x.requests]), expectedBuckets(b.projectId, 'model').map((x: any) => [x.model, x.requests]));
    assert.equal((await ask(cp.secrets.operatorToken, { keyId: b.keyId })).code, 'UNAUTHENTICATED', 'the operator token is not a node token');
    assert.equal((await ask('', { keyId: b.keyId })).code, 'UNAUTHENTICATED');
    // a2 was revoked in the console test: a node that has not applied the revocation yet still gets nothing.
    assert.equal((await ask(cp.secrets.nodeToken, { keyId: a2.keyId })).code, 'NOT_FOUND');
    assert.equal((await ask(cp.secrets.nodeToken, { keyId: 'key_nope' })).code, 'NOT_FOUND');
    assert.equal((await ask(cp.secrets.nodeToken, { keyId: b.keyId, groupBy: 'project' })).code, 'INVALID_ARGUMENT');
    assert.equal((await ask(cp.secrets.nodeToken, { keyId: b.keyId, sinceMs: 5000, untilMs: 5000 })).code, 'INVALID_ARGUMENT');
    assert.equal((await ask(cp.secrets.nodeToken, { keyId: b.keyId, sinceMs: -1 })).code, 'INVALID_ARGUMENT');
  } finally {
    client.close();
  }
});

test('with the control plane unreachable, a usage read answers 503 in Shape A with retry-after and costs nothing', async () => {
  await cp.proc.kill('SIGKILL');
  await node.proc.waitFor(/control plane connection lost/);
  let r = await request(usageUrl(range), { headers: bearer(b.key) });
  assertShapeA(r, 503, null, 'usage with the control plane down');
  assert.equal(r.body.error.type, 'api_error');
  assert.match(r.headers.get('retry-after') ?? '', /^\d+$/);
  const before = Number(r.headers.get('x-ratelimit-remaining-requests'));
  r = await request(usageUrl(range), { headers: bearer(b.key) });
  assert.equal(r.status, 503);
  assert.equal(Number(r.headers.get('x-ratelimit-remaining-requests')), before, 'a 503 costs no request');
});
