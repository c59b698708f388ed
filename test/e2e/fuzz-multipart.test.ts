// The multipart fuzz, bounded (`npm run fuzz -- --mode multipart --runs N` runs as many as asked):
// random boundaries and part heads never crash or stall the node; its event loop stays under 250 ms.
import { after, before, test } from 'node:test';
import { stopAll } from '../helpers/processes.js';
import { fuzzMultipart } from '../fuzz/multipart-fuzz.js';
import { startFuzzStack, type FuzzStack } from '../fuzz/node-fuzz.js';

let stack: FuzzStack;
before(async () => {
  stack = await startFuzzStack();
});
after(async () => {
  await stack?.close();
  await stopAll();
});

test('random multipart uploads: permitted statuses in Shape A, the node alive, its event loop under 250 ms throughout', async () => {
  // A fixed seed in the suite (the same cases every run); `npm run fuzz -- --mode multipart` explores new ones.
  await fuzzMultipart(stack, Number(process.env.TOLLGATE_FUZZ_MULTIPART_RUNS ?? 300), Number(process.env.TOLLGATE_FUZZ_SEED ?? 20261126));
});
