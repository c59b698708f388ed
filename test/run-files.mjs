// Runs the test files test/run.mjs hands over (TOLLGATE_TEST_RUN: { files, concurrency }) in the order
// given, through node:test's run(): Node 20's `--test FILE…` sorts the files by path whatever their
// order on the command line, so the longest files, put first by run.mjs, started wherever their names
// fell. Started with `--import tsx`, which run() passes on to each file's process. Prints the spec
// reporter's output as the tests end, then the slowest files (slowest-files-reporter.mjs), and exits 1
// if any test failed.
import { PassThrough } from 'node:stream';
import { run } from 'node:test';
import { spec } from 'node:test/reporters';
import slowestFiles from './slowest-files-reporter.mjs';

const { files, concurrency } = JSON.parse(process.env.TOLLGATE_TEST_RUN);
const toSpec = new PassThrough({ objectMode: true });
const toSlowest = new PassThrough({ objectMode: true });
let failed = false;
const events = run({ files, concurrency });
events.on('data', (event) => {
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
