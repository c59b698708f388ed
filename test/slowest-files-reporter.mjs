// A node:test reporter that prints nothing while the tests run and, at the end, the 10 test files
// that took longest (wall time of each file's process, from the runner's per-file `test:complete`
// event). `npm test` runs it beside the spec reporter (test/run.mjs).
import { relative } from 'node:path';

const SHOWN = 10;

export default async function* slowestFiles(source) {
  const files = [];
  for await (const event of source) {
    // The runner reports each file it ran as a test named by the file's path.
    if (event.type === 'test:complete' && event.data.file && event.data.name === event.data.file) {
      files.push({ file: relative(process.cwd(), event.data.file), ms: event.data.details.duration_ms, passed: event.data.details.passed });
    }
  }
  if (files.length === 0) return;
  files.sort((a, b) => b.ms - a.ms);
  const top = files.slice(0, SHOWN);
  yield `\nslowest ${top.length} of ${files.length} test files:\n`;
  for (const f of top) yield `${(f.ms / 1000).toFixed(1).padStart(8)} s  ${f.file}${f.passed ? '' : '  (failed)'}\n`;
}
