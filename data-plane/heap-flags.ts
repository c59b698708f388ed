// The V8 heap settings a data-plane node is started with (npm run data-plane, npm start, npm run
// cluster, and the tests). Measured with `npm run bench -- --baseline-flags=…` (test/bench/README.md):
// under full load they hold a node's RSS near 140 MB instead of ~210 MB, and keep it within ±13 MiB
// through a 5-minute control-plane outage instead of swinging by 120 MiB, for about 10% more CPU per
// request (more frequent, smaller collections).
// - A young generation of 2 × 8 MiB instead of 2 × 16 MiB.
// - An old-generation limit of 1.5 GiB: below 2 GiB V8 grows the heap by at most ~1.8× of what
//   survives a full collection instead of 4×. It also bounds the key table: a million keys take
//   ~900 MB; a node that nears the limit says so (main.ts) and needs a larger --max-old-space-size.
// package.json's `data-plane` script repeats these (a unit test keeps the two the same).
export const NODE_HEAP_FLAGS: readonly string[] = ['--max-semi-space-size=8', '--max-old-space-size=1536'];
