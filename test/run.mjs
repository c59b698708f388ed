// `npm test`: the committed generated code must be fresh, the code must type-check (checked while the
// tests run), and every test file under test/unit and test/e2e runs with node:test (Node 20's runner does not find .ts
// files by itself, so they are listed here).
import { execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildBundles, buildTestBundles } from './process-bundles.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const only = process.argv.slice(2);

function findTests(dir) {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) return findTests(p);
    return name.endsWith('.test.ts') ? [p] : [];
  });
}

// The type check runs beside the tests (about 20 s of one core, which the first test files, busy
// starting processes, leave free); its verdict is printed and counted at the end.
let typecheck = null;
if (only.length === 0) {
  execFileSync(process.execPath, [join(root, 'proto', 'gen.mjs'), '--check'], { stdio: 'inherit', cwd: root });
  typecheck = new Promise((resolve) => {
    const tsc = spawn(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '--noEmit', '-p', root], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    tsc.stdout.on('data', (c) => (out += c));
    tsc.stderr.on('data', (c) => (out += c));
    tsc.on('close', (code) => resolve({ code, out }));
  });
}

// Longest first, so that a parallel run does not end on one long file started last: by the time each
// file took in this checkout's last run (test/.durations.json, written by the slowest-files reporter,
// not committed), else by the list below (the slowest files of a full run, slowest first), then every
// other end-to-end file, then the unit files.
const SLOWEST = [
  'test/e2e/control-plane-failover.test.ts',
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
// The control plane, the node and the CLI, bundled for the processes the tests start (see
// test/process-bundles.mjs); without them (TOLLGATE_TEST_TSX=1, or esbuild failed) those processes
// run through tsx, as before: slower, with stack traces that name the .ts files.
// The test files are bundled too, into a folder of this run's (removed at the end); without them
// they run through tsx.
let bundles = {};
let testBundles = null;
let testBundleDir = null;
if (process.env.TOLLGATE_TEST_TSX !== '1') {
  // One folder per checkout: git worktrees that share one node_modules (a symlink) must not run each
  // other's code (a run in one rebuilt the bundles another's tests were starting).
  const checkout = createHash('sha256').update(realpathSync(root)).digest('hex').slice(0, 12);
  const cache = join(root, 'node_modules', '.cache', 'tollgate-test-bundles', checkout);
  try {
    bundles = await buildBundles(root, cache);
    testBundleDir = mkdtempSync(join(cache, 'tests-'));
    testBundles = await buildTestBundles(root, testBundleDir, files.map((f) => join(root, f)));
  } catch (err) {
    console.warn(`tests and their processes run through tsx: their bundles were not built (${err.message})`);
    testBundles = null;
  }
}
// Three files at a time: with the processes started from bundles, two files left the two cores idle
// while files waited on their processes (22 files on a busy machine: 169 s at two, 116 s at three,
// the same CPU). Not more: a few tests assert timings that a busier machine misses.
// TOLLGATE_TEST_CONCURRENCY=N runs N.
const concurrency = Number(process.env.TOLLGATE_TEST_CONCURRENCY) || 3;
// In that order: test/run-files.mjs runs them through node:test's run(), as `node --test` would
// but without sorting them by path. At the end: the 10 files that took longest.
// Bundled test files run without tsx, with their source maps (stack traces name the .ts files);
// run() gives each file's process the flags of this one.
const runFiles = testBundles
  ? { files: Object.keys(testBundles), sources: testBundles, concurrency }
  : { files: files.map((f) => join(root, f)), sources: {}, concurrency };
const tests = spawn(process.execPath, [...(testBundles ? ['--enable-source-maps'] : ['--import', 'tsx']), join(root, 'test', 'run-files.mjs')], {
  stdio: 'inherit',
  cwd: root,
  env: {
    ...process.env,
    NODE_ENV: 'test',
    TOLLGATE_TEST_BUNDLES: JSON.stringify(bundles),
    TOLLGATE_TEST_RUN: JSON.stringify(runFiles),
  },
});
const status = await new Promise((resolve) => tests.on('close', (code) => resolve(code ?? 1)));
if (testBundleDir) rmSync(testBundleDir, { recursive: true, force: true });
if (typecheck) {
  const { code, out } = await typecheck;
  if (code === 0) console.log('typecheck passed');
  else console.log(`typecheck failed (tsc exit ${code}):\n${out}`);
  process.exit(code === 0 ? status : 1);
}
process.exit(status);
