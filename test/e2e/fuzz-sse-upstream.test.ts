// A hostile upstream's random SSE framing through a running node, a bounded number of cases (`npm run
// fuzz -- --mode sse-upstream --runs N` runs as many as asked), with the node's event-loop delay
// asserted under 250 ms over the whole run.
import { after, before, test } from 'node:test';
import { stopAll } from '../helpers/processes.js';
import { fuzzSseUpstream, startSseFuzzStack, type SseFuzzStack } from '../fuzz/sse-upstream-fuzz.js';

let stack: SseFuzzStack;
before(async () => {
  stack = await startSseFuzzStack();
});
after(async () => {
  await stack?.close();
  await stopAll();
});

test('random SSE framing from a hostile upstream: every request answered, clean streams byte for byte, the event loop never 250 ms late', async () => {
  // A fixed seed in the suite (the same cases every run); `npm run fuzz` explores new ones.
  await fuzzSseUpstream(stack, Number(process.env.TOLLGATE_FUZZ_SSE_RUNS ?? 150), Number(process.env.TOLLGATE_FUZZ_SEED ?? 20261126));
});
