// Runs the test files test/run.mjs hands over (TOLLGATE_TEST_RUN: { files, sources, concurrency }) in the order
// given, through node:test's run(): Node 20's `--test FILE…` sorts the files by path whatever their
// order on the command line, so the longest files, put first by run.mjs, started wherever their names
// fell. The files are bundles (sources: bundle → source file) or, without bundles, the sources, and
// this is started with `--import tsx`, which run() passes on to each file's process. Prints the spec
// reporter's output as the tests end, then the slowest files (slowest-files-reporter.mjs), and exits 1
// if any test failed.
import { readFileSync } from 'node:fs';
import { SourceMap } from 'node:module';
import { PassThrough } from 'node:stream';
import { run } from 'node:test';
import { spec } from 'node:test/reporters';
import slowestFiles from './slowest-files-reporter.mjs';

const { files, sources, concurrency } = JSON.parse(process.env.TOLLGATE_TEST_RUN);
const toSpec = new PassThrough({ objectMode: true });
const toSlowest = new PassThrough({ objectMode: true });
let failed = false;

// A bundled test file (test/process-bundles.mjs buildTestBundles) is reported as its source file, at
// the source line its source map gives.
const maps = new Map();
function sourceMapOf(bundle) {
  if (!maps.has(bundle)) {
    try {
      maps.set(bundle, new SourceMap(JSON.parse(readFileSync(`${bundle}.map`, 'utf8'))));
    } catch {
      maps.set(bundle, null);
    }
  }
  return maps.get(bundle);
}
function asSource(data) {
  const source = data?.file && sources[data.file];
  if (!source) return;
  const bundle = data.file;
  if (data.name === bundle) data.name = source;
  data.file = source;
  if (typeof data.line === 'number' && typeof data.column === 'number') {
    const entry = sourceMapOf(bundle)?.findEntry(data.line - 1, data.column - 1);
    if (entry?.originalSource) {
      data.line = entry.originalLine + 1;
      data.column = entry.originalColumn + 1;
    }
  }
}

const events = run({ files, concurrency });
events.on('data', (event) => {
  asSource(event.data);
  if (event.type === 'test:fail') failed = true;
  toSpec.write(event);
  toSlowest.write(event);
});
events.on('end', () => {
  toSpec.end();
  toSlowest.end();
});
const slowest = (async () => {
  let text = '';
  for await (const chunk of slowestFiles(toSlowest)) text += chunk;
  return text;
})();
for await (const chunk of toSpec.pipe(new spec())) process.stdout.write(chunk);
process.stdout.write(await slowest);
process.exitCode = failed ? 1 : 0;
