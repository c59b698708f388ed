// `npm run fuzz -- [--runs N] [--seed S] [--mode requests|sse-upstream|multipart]`: fuzzes a freshly started node
// with as many cases as asked: hostile requests (default), a hostile upstream's SSE framing, or random uploads.
import { parseArgs } from 'node:util';
import { stopAll } from '../helpers/processes.js';
import { fuzzMultipart } from './multipart-fuzz.js';
import { fuzzNode, startFuzzStack } from './node-fuzz.js';
import { fuzzSseUpstream, startSseFuzzStack } from './sse-upstream-fuzz.js';

const { values } = parseArgs({ options: { runs: { type: 'string', default: '5000' }, seed: { type: 'string' }, mode: { type: 'string', default: 'requests' } } });
const runs = Number(values.runs);
if (!Number.isSafeInteger(runs) || runs < 1) {
  console.error(`--runs must be a positive whole number, got ${JSON.stringify(values.runs)}`);
  process.exit(2);
}
const seed = values.seed === undefined ? undefined : Number(values.seed);

/** Starts a mode's stack, runs its cases (which return what the summary line says), and stops it. */
function mode<S extends { close(): Promise<void> }>(start: () => Promise<S>, run: (stack: S) => Promise<string>): () => Promise<void> {
  return async () => {
    const stack = await start();
    const t0 = Date.now();
    try {
      const what = await run(stack);
      console.log(`fuzz: ${what} passed in ${((Date.now() - t0) / 1000).toFixed(1)} s; the node is still serving`);
    } catch (err) {
      console.error(err instanceof Error ? err.message : err);
      process.exitCode = 1;
    } finally {
      await stack.close();
      await stopAll();
    }
  };
}

const MODES: Record<string, () => Promise<void>> = {
  requests: mode(startFuzzStack, async (stack) => (await fuzzNode(stack, runs, seed), `${runs} cases`)),
  // Random transcription uploads (multipart-fuzz.ts).
  multipart: mode(startFuzzStack, async (stack) => (await fuzzMultipart(stack, runs, seed), `${runs} cases`)),
  'sse-upstream': mode(startSseFuzzStack, async (stack) => {
    const r = await fuzzSseUpstream(stack, runs, seed);
    return `${runs} hostile SSE streams (${r.exact} compared byte for byte, ${r.resets} upstream resets, event loop held at most ${r.loop.maxBlockedMs} ms by the node's own work, ${r.loop.maxLateMs} ms late on the wall clock)`;
  }),
};
const run = MODES[values.mode];
if (!run) {
  console.error(`--mode must be ${Object.keys(MODES).join(', ')}; got ${JSON.stringify(values.mode)}`);
  process.exit(2);
}
await run();
process.exit();
