// `npm test`: the committed generated code must be fresh, the code must type-check, then every
// test file under test/unit and test/e2e runs with node:test (Node 20's runner does not find .ts
// files by itself, so they are listed here).
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const only = process.argv.slice(2);

function findTests(dir) {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) return findTests(p);
    return name.endsWith('.test.ts') ? [p] : [];
  });
}

if (only.length === 0) {
  execFileSync(process.execPath, [join(root, 'proto', 'gen.mjs'), '--check'], { stdio: 'inherit', cwd: root });
  execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '--noEmit', '-p', root], {
    stdio: 'inherit',
    cwd: root,
  });
  console.log('typecheck passed');
}

// Longest first, so that a parallel run does not end on one long file started last: by the time each
// file took in this checkout's last run (test/.durations.json, written by the slowest-files reporter,
// not committed), else by the list below (the slowest files of a full run, slowest first), then every
// other end-to-end file, then the unit files.
const SLOWEST = [
  'test/e2e/readme.test.ts',
  'test/e2e/usage-leak-procedure.test.ts',
  'test/e2e/operator-view.test.ts',
  'test/e2e/usage-reading.test.ts',
  'test/e2e/console-roles.test.ts',
  'test/e2e/limits-exact.test.ts',
  'test/e2e/console-free-grants.test.ts',
  'test/e2e/console-bad-input.test.ts',
  'test/e2e/tls.test.ts',
  'test/e2e/limits-exact-money.test.ts',
  'test/e2e/usage-durability.test.ts',
  'test/e2e/console-hierarchy.test.ts',
  'test/e2e/npm-start.test.ts',
  'test/e2e/webhooks.test.ts',
];
let recorded = {};
try {
  recorded = JSON.parse(readFileSync(join(root, 'test', '.durations.json'), 'utf8'));
} catch {
  // none yet: the list above
}
// In milliseconds, as recorded: a listed file as a minute, another end-to-end file as 20 s, a unit file as 1 s.
const guess = (f) => recorded[f] ?? (SLOWEST.includes(f) ? 60_000 - SLOWEST.indexOf(f) : f.startsWith('test/e2e/') ? 20_000 : 1_000);
const files = (only.length > 0 ? only : [...findTests(join(root, 'test', 'unit')), ...findTests(join(root, 'test', 'e2e'))])
  .map((f) => relative(root, f))
  .sort()
  .sort((a, b) => guess(b) - guess(a));
// Two files at a time (a few tests assert timings that a busier machine misses);
// TOLLGATE_TEST_CONCURRENCY=N runs N.
const concurrency = Number(process.env.TOLLGATE_TEST_CONCURRENCY) || 2;
const run = (list, env = {}) =>
  spawnSync(
    process.execPath,
    [
      '--import',
      'tsx',
      '--test',
      `--test-concurrency=${concurrency}`,
      '--test-reporter=spec',
      '--test-reporter-destination=stdout',
      // At the end: the 10 files that took longest.
      `--test-reporter=${join(root, 'test', 'slowest-files-reporter.mjs')}`,
      '--test-reporter-destination=stdout',
      ...list,
    ],
    { stdio: 'inherit', cwd: root, env: { ...process.env, NODE_ENV: 'test', ...env } },
  ).status ?? 1;
// The end-to-end suites of keys, limits, money and logs run a second time with every control plane on
// PostgreSQL (issue 35; test/helpers/postgres-server.ts testDatabaseFor). Any file runs so by hand
// with TOLLGATE_TEST_STORE=postgres.
const ON_POSTGRES = [
  'test/e2e/audit.test.ts',
  'test/e2e/console-revoke.test.ts',
  'test/e2e/limits-exact-money.test.ts',
  'test/e2e/limits-restart-rejoin.test.ts',
  'test/e2e/money-limits.test.ts',
  'test/e2e/webhooks.test.ts',
];
let status = run(files);
if (only.length === 0) {
  console.log('again with the control plane on PostgreSQL:');
  status = run(ON_POSTGRES, { TOLLGATE_TEST_STORE: 'postgres' }) || status;
}
process.exit(status);
