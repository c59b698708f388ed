// Bad input gets one clear line starting with an HTTP-style status: unknown ids 404, invalid values
// 400 from the control plane (exit 1), malformed arguments 400 plus usage from the CLI (exit 2),
// and never a stack trace.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';
import { assertFails, assertNoStackTrace, assertUsageError, createOrgWithProjectAsync, runMany } from '../helpers/console-cli.js';
import { cliJsonAsync, ROOT, runCliAsync, runProcessAsync, startControlPlane, stopAll, type CliResult } from '../helpers/processes.js';

const COMMAND_NAMES = [
  'account create', 'whoami', 'org create', 'org list', 'org show', 'org set-tier', 'org credit', 'org set-cap',
  'member add', 'member list', 'project create', 'project list', 'key create', 'key list', 'key revoke',
  'usage', 'models list', 'nodes list', 'config reload',
];

test('help lists every command, and the package bin forwards arguments and exit codes', async () => {
  const npm = await runProcessAsync('npm', ['run', '-s', 'cli', '--', '--help'], { env: { ...process.env, TOLLGATE_TOKEN: '' } });
  assert.equal(npm.code, 0, npm.stderr);
  for (const name of COMMAND_NAMES) assert.match(npm.stdout, new RegExp(`^  ${name}\\b`, 'm'), `--help lists ${name}`);
  const bin = join(ROOT, 'cli', 'bin.mjs');
  const viaBin = await runProcessAsync(process.execPath, [bin, 'help']);
  assert.equal(viaBin.code, 0, viaBin.stderr);
  assert.equal(viaBin.stdout, npm.stdout);
  const usage = await runProcessAsync(process.execPath, [bin, 'key', 'create', '--help']);
  assert.equal(usage.code, 0);
  assert.match(usage.stdout, /^Usage: tollgate .*key create --project PROJECT/m);
  assert.match(usage.stdout, /--models/);
  const bad = await runProcessAsync(process.execPath, [bin, 'frobnicate']);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /^400 unknown command "frobnicate"/);
});

test('bad input gets clear errors: 404 for unknown ids, 400 for bad values, usage for malformed flags', async (t) => {
  t.after(stopAll);
  const cp = await startControlPlane();
  const op = cp.secrets.operatorToken;
  const { owner, orgId, projectId } = await createOrgWithProjectAsync(cp, op, 'careful');
  type Check = [token: string | undefined, args: string[], assertOn: (r: CliResult) => void];
  const fails = (token: string | undefined, args: string[], status: number, what: string, opts: { exitCode?: number; message?: RegExp } = {}): Check => [
    token,
    args,
    (r) => void assertFails(r, status, what, opts),
  ];
  const usage = (args: string[], what: string, message?: RegExp): Check => [op, args, (r) => assertUsageError(r, what, message)];
  const checks: Check[] = [
    // Unknown ids.
    fails(op, ['org', 'show', 'org_doesnotexist'], 404, 'org show'),
    fails(op, ['org', 'set-tier', 'org_doesnotexist', '--tier', 'paid'], 404, 'org set-tier'),
    fails(op, ['org', 'credit', 'org_doesnotexist', '--usd', '5'], 404, 'org credit'),
    fails(op, ['project', 'list', '--org', 'org_doesnotexist'], 404, 'project list'),
    fails(op, ['project', 'create', '--org', 'org_doesnotexist', '--name', 'x'], 404, 'project create'),
    fails(op, ['key', 'list', '--project', 'proj_doesnotexist'], 404, 'key list'),
    fails(op, ['key', 'create', '--project', 'proj_doesnotexist'], 404, 'key create'),
    fails(op, ['key', 'revoke', 'key_doesnotexist'], 404, 'key revoke'),
    fails(owner.token, ['key', 'revoke', 'key_doesnotexist'], 404, 'key revoke by an account'),
    fails(op, ['member', 'add', orgId, '--account', 'acct_doesnotexist', '--role', 'member'], 404, 'member add of unknown account'),
    fails(op, ['org', 'create', '--name', 'x', '--owner', 'acct_doesnotexist'], 404, 'org create with unknown owner'),

    // Values the control plane refuses (exit 1: the call was made and refused).
    fails(op, ['org', 'set-tier', orgId, '--tier', 'gold'], 400, 'bad tier', { exitCode: 1 }),
    fails(op, ['org', 'create', '--name', 'x', '--owner', owner.id, '--tier', 'gold'], 400, 'org create with bad tier'),
    fails(op, ['org', 'credit', orgId, '--usd', '-5'], 400, 'negative credit', { exitCode: 1 }),
    fails(op, ['org', 'credit', orgId, '--usd=-0.01'], 400, 'negative credit with ='),
    fails(op, ['org', 'credit', orgId, '--usd', '0'], 400, 'zero credit'),
    fails(op, ['org', 'set-cap', orgId, '--usd', '-1'], 400, 'negative cap'),
    fails(op, ['member', 'add', orgId, '--account', owner.id, '--role', 'superuser'], 400, 'bad role'),
    fails(op, ['account', 'create', '--name', ''], 400, 'empty account name'),
    fails(op, ['account', 'create', '--name', '   '], 400, 'blank account name'),
    fails(op, ['org', 'create', '--name', '', '--owner', owner.id], 400, 'empty org name'),
    fails(owner.token, ['project', 'create', '--org', orgId, '--name', ''], 400, 'empty project name'),

    // Malformed arguments: the CLI answers by itself, exit 2 with the usage.
    usage(['org', 'credit', orgId, '--usd', 'abc'], 'usd abc', /--usd/),
    usage(['org', 'credit', orgId, '--usd', '1.2345678'], 'usd with 7 decimals', /--usd/),
    usage(['org', 'set-cap', orgId, '--usd', 'lots'], 'set-cap usd lots', /--usd/),
    usage(['org', 'set-cap', orgId], 'set-cap with neither'),
    usage(['org', 'set-cap', orgId, '--usd', '1', '--clear'], 'set-cap with both'),
    usage(['frobnicate'], 'unknown command', /unknown command/),
    usage(['org', 'frobnicate'], 'unknown subcommand', /unknown command/),
    usage(['org', 'list', '--colour'], 'unknown flag', /unknown flag --colour/),
    usage(['--verbose', 'org', 'list'], 'unknown global flag', /unknown flag --verbose/),
    usage(['project', 'create', '--org', orgId], 'missing --name', /missing required flag --name/),
    usage(['key', 'create'], 'missing --project', /--project/),
    usage(['key', 'create', '--project'], 'flag without value', /--project/),
    usage(['org', 'show'], 'missing ORG', /ORG/),
    usage(['org', 'show', orgId, 'extra'], 'extra argument', /extra/),
    usage(['usage'], 'usage with neither --project nor --org'),
    usage(['usage', '--project', projectId, '--month', 'May'], 'bad month', /--month/),
    usage(['org', 'set-cap', orgId, '--clear=yes'], 'value on a boolean flag', /--clear/),
  ];
  const results = await runMany(cp, checks.map(([token, args]) => [token, args]));
  checks.forEach(([, , assertOn], i) => assertOn(results[i]));

  // Nothing was changed by any of the refused calls.
  const org = await cliJsonAsync(cp, op, ['org', 'show', orgId]);
  assert.equal(org.tier, 'free');
  assert.equal(org.credits_usd, '0.00');
  assert.equal(org.own_cap_usd, null);
  assert.deepEqual((await cliJsonAsync(cp, op, ['project', 'list', '--org', orgId])).projects.map((p: any) => p.id), [projectId]);
  assert.deepEqual(
    (await cliJsonAsync(cp, op, ['member', 'list', orgId])).members.map((m: any) => [m.account_id, m.role]),
    [[owner.id, 'owner']],
  );

  // The control plane is not there.
  const down = await runCliAsync({ address: '127.0.0.1:1' }, op, ['org', 'list']);
  assertFails(down, 503, 'unreachable control plane', { exitCode: 1 });
  assert.equal(down.stderr, '503 control plane unreachable at 127.0.0.1:1\n');
  assertNoStackTrace(down, 'unreachable');
});
