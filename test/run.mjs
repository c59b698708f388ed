// `npm test`: the committed generated code must be fresh, the code must type-check, then every
// test file under test/unit and test/e2e runs with node:test (Node 20's runner does not find .ts
// files by itself, so they are listed here).
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
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

const files = (only.length > 0 ? only : [...findTests(join(root, 'test', 'unit')), ...findTests(join(root, 'test', 'e2e'))])
  .map((f) => relative(root, f))
  .sort();
const result = spawnSync(
  process.execPath,
  [
    '--import',
    'tsx',
    '--test',
    '--test-concurrency=2',
    '--test-reporter=spec',
    '--test-reporter-destination=stdout',
    // At the end: the 10 files that took longest.
    `--test-reporter=${join(root, 'test', 'slowest-files-reporter.mjs')}`,
    '--test-reporter-destination=stdout',
    ...files,
  ],
  { stdio: 'inherit', cwd: root, env: { ...process.env, NODE_ENV: 'test' } },
);
process.exit(result.status ?? 1);
