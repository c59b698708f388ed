// `npm run fuzz -- [--runs N] [--seed S] [--mode requests|sse-upstream|multipart]`: fuzzes a freshly started node
// with as many cases as asked: hostile requests (default), a hostile upstream's SSE framing, or random uploads.
import { parseArgs } from 'node:util';
import { stopAll } from '../helpers/processes.js';
import { fuzzMultipart } from './multipart-fuzz.js';
import { fuzzNode, startFuzzStack } from './node-fuzz.js';
import { fuzzSseUpstream, startSseFuzzStack } from './sse-upstream-fuzz.js';

const { values } = parseArgs({ options: { runs: { type: 'string', default: '5000' }, seed: { type: 'string' }, mode: { type: 'string', default: 'requests' } } });
if (values.mode !== 'requests' && values.mode !== 'sse-upstream' && values.mode !== 'multipart') {
  console.error(`--mode must be requests, sse-upstream or multipart, got ${JSON.stringify(values.mode)}`);
  process.exit(2);
}
if (values.mode === 'sse-upstream') {
  const runs = Number(values.runs);
  const stack = await startSseFuzzStack();
  const t0 = Date.now();
  try {
    const r = await fuzzSseUpstream(stack, runs, values.seed === undefined ? undefined : Number(values.seed));
    console.log(`fuzz: ${runs} hostile SSE streams passed in ${((Date.now() - t0) / 1000).toFixed(1)} s (${r.exact} compared byte for byte, ${r.resets} upstream resets, event loop held at most ${r.loop.maxBlockedMs} ms by the node's own work, ${r.loop.maxLateMs} ms late on the wall clock); the node is still serving`);
  } catch (err) {
    console.error(err instanceof Error ? err.message : err);
    process.exitCode = 1;
  } finally {
    await stack.close();
    await stopAll();
  }
  process.exit();
}
// `--mode multipart`: random transcription uploads (multipart-fuzz.ts).
const fuzz = values.mode === 'multipart' ? fuzzMultipart : fuzzNode;
const runs = Number(values.runs);
if (!Number.isSafeInteger(runs) || runs < 1) {
  console.error(`--runs must be a positive whole number, got ${JSON.stringify(values.runs)}`);
  process.exit(2);
}
const stack = await startFuzzStack();
const t0 = Date.now();
try {
  await fuzz(stack, runs, values.seed === undefined ? undefined : Number(values.seed));
  console.log(`fuzz: ${runs} cases passed in ${((Date.now() - t0) / 1000).toFixed(1)} s; the node is still serving`);
} catch (err) {
  console.error(err instanceof Error ? err.message : err);
  process.exitCode = 1;
} finally {
  await stack.close();
  await stopAll();
}
