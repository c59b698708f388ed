// A node:test reporter that prints nothing while the tests run and, at the end, the 10 test files
// that took longest (wall time of each file's process, from the runner's per-file `test:complete`
// event). `npm test` runs it beside the spec reporter (test/run-files.mjs). It also records every file's
// time in test/.durations.json (not committed), which run.mjs reads to start the longest files first.
import { readFileSync, writeFileSync } from 'node:fs';
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
  try {
    let known = {};
    try {
      known = JSON.parse(readFileSync('test/.durations.json', 'utf8'));
    } catch {
      // first run
    }
    for (const f of files) known[f.file] = Math.round(f.ms);
    writeFileSync('test/.durations.json', `${JSON.stringify(known, null, 1)}\n`);
  } catch {
    // a read-only checkout: the order falls back to run.mjs's list
  }
  files.sort((a, b) => b.ms - a.ms);
  const top = files.slice(0, SHOWN);
  yield `\nslowest ${top.length} of ${files.length} test files:\n`;
  for (const f of top) yield `${(f.ms / 1000).toFixed(1).padStart(8)} s  ${f.file}${f.passed ? '' : '  (failed)'}\n`;
}
