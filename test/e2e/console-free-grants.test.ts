// One free grant per owning account, and a limit on the organisations an account may own. Before the
// fix any account could create organisations without end, each with the free tier's $5.00 grant.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { assertFails, createAccountAsync } from '../helpers/console-cli.js';
import { configYaml } from '../helpers/config.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer } from '../helpers/http.js';
import { cliJsonAsync, runCliAsync, startControlPlane, startDataPlane, stopAll, type ControlPlane } from '../helpers/processes.js';

let cp: ControlPlane;

before(async () => {
  cp = await startControlPlane();
});
after(stopAll);

test('an account gets one free grant, whatever the number of organisations it owns', async () => {
  const op = cp.secrets.operatorToken;
  const alice = await createAccountAsync(cp, op, 'alice');
  const first = await cliJsonAsync(cp, alice.token, ['org', 'create', '--name', 'first']);
  assert.deepEqual([first.free_grant_usd, first.balance_usd, first.blocked], ['5.00', '5.00', false]);
  const second = await cliJsonAsync(cp, alice.token, ['org', 'create', '--name', 'second']);
  assert.deepEqual([second.free_grant_usd, second.balance_usd, second.blocked, second.blocked_reason], ['0.00', '0.00', true, 'balance_exhausted']);
  // An organisation the operator creates for the same owner has no grant either.
  const third = await cliJsonAsync(cp, op, ['org', 'create', '--name', 'third', '--owner', alice.id, '--tier', 'free']);
  assert.equal(third.free_grant_usd, '0.00');
  // The first keeps its grant; the operator's credit funds the second.
  assert.equal((await cliJsonAsync(cp, alice.token, ['org', 'show', first.id])).free_grant_usd, '5.00');
  const credited = await cliJsonAsync(cp, op, ['org', 'credit', second.id, '--usd', '2.00']);
  assert.deepEqual([credited.balance_usd, credited.blocked], ['2.00', false]);

  // A key of an organisation without a grant or credit is refused at the gateway as out of money.
  const dp = await startDataPlane(cp);
  const project = await cliJsonAsync(cp, alice.token, ['project', 'create', '--org', third.id, '--name', 'p']);
  const key = await cliJsonAsync(cp, alice.token, ['key', 'create', '--project', project.id, '--name', 'k']);
  await waitUntilKnown(dp.url, key.key);
  const res = await fetch(`${dp.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(key.key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(res.status, 401);
  const body = (await res.json()) as any;
  assert.equal(body.error.type, 'insufficient_quota');

  // Another account still gets its own grant, also after a paid organisation (no grant to take).
  const bob = await createAccountAsync(cp, op, 'bob');
  assert.equal((await cliJsonAsync(cp, op, ['org', 'create', '--name', 'bobs-paid', '--owner', bob.id, '--tier', 'paid'])).free_grant_usd, '0.00');
  assert.equal((await cliJsonAsync(cp, op, ['org', 'create', '--name', 'bobs', '--owner', bob.id, '--tier', 'free'])).free_grant_usd, '5.00');
});

test('an account owns at most max_orgs_per_account organisations (default 3); the operator is exempt', async () => {
  const op = cp.secrets.operatorToken;
  const carol = await createAccountAsync(cp, op, 'carol');
  for (const name of ['c1', 'c2', 'c3']) assert.equal((await cliJsonAsync(cp, carol.token, ['org', 'create', '--name', name])).role, 'owner');
  const refused = assertFails(await runCliAsync(cp, carol.token, ['org', 'create', '--name', 'c4']), 400, 'a fourth organisation', {
    message: /already owns 3 organisations.*max_orgs_per_account 3/,
  });
  assert.match(refused, /ask the operator/);
  // The refused call created nothing.
  assert.equal((await cliJsonAsync(cp, carol.token, ['org', 'list'])).orgs.length, 3);
  // Being made the owner of someone else's organisation counts too.
  const dave = await createAccountAsync(cp, op, 'dave');
  const daves = await cliJsonAsync(cp, dave.token, ['org', 'create', '--name', 'daves']);
  assertFails(await runCliAsync(cp, dave.token, ['member', 'add', daves.id, '--account', carol.id, '--role', 'owner']), 400, 'a fourth owned organisation by promotion', {
    message: /max_orgs_per_account/,
  });
  assert.equal((await cliJsonAsync(cp, dave.token, ['member', 'add', daves.id, '--account', carol.id, '--role', 'admin'])).role, 'admin');
  // The operator may make an account own more.
  const fourth = await cliJsonAsync(cp, op, ['org', 'create', '--name', 'c4', '--owner', carol.id, '--tier', 'free']);
  assert.equal(fourth.free_grant_usd, '0.00');
  assert.equal((await cliJsonAsync(cp, carol.token, ['org', 'list'])).orgs.length, 5);
});

test('max_orgs_per_account comes from the gateway config', async () => {
  const own = await startControlPlane({ configYaml: configYaml((cfg) => Object.assign(cfg, { max_orgs_per_account: 1 })) });
  const op = own.secrets.operatorToken;
  const erin = await createAccountAsync(own, op, 'erin');
  await cliJsonAsync(own, erin.token, ['org', 'create', '--name', 'e1']);
  assertFails(await runCliAsync(own, erin.token, ['org', 'create', '--name', 'e2']), 400, 'a second organisation', { message: /max_orgs_per_account 1/ });
});
