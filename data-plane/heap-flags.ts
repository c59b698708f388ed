// The V8 heap settings a data-plane node is started with (npm run data-plane, npm start, npm run
// cluster, and the tests). Measured with `npm run bench -- --baseline-flags=…` (test/bench/README.md):
// under full load they hold a node's RSS near 140 MB instead of ~210 MB, and keep it within ±13 MiB
// through a 5-minute control-plane outage instead of swinging by 120 MiB, for about 10% more CPU per
// request (more frequent, smaller collections).
// - A young generation of 2 × 8 MiB instead of 2 × 16 MiB.
// - An old-generation limit of 1.5 GiB: below 2 GiB V8 grows the heap by at most ~1.8× of what
//   survives a full collection instead of 4×. It also bounds the key table: a million keys take
//   ~900 MB; a node that nears the limit says so (main.ts) and needs a larger --max-old-space-size.
// package.json's `data-plane` script, compose.yaml and kubernetes.yaml repeat these (unit tests keep
// them the same: data-plane-heap and deploy-manifests).
export const NODE_HEAP_FLAGS: readonly string[] = ['--max-semi-space-size=8', '--max-old-space-size=1536'];

/**
 * Environment a node starts with unless the operator set it: glibc's malloc keeps at most two arenas
 * instead of eight per core, so buffers freed by uWS, undici and Buffer backing stores go back to a
 * few arenas instead of staying spread over many. Measured in the same run
 * (`npm run bench -- --baseline-env=MALLOC_ARENA_MAX=2`): 12–15 MB less peak RSS, no more CPU.
 */
export const NODE_MEMORY_ENV: Readonly<Record<string, string>> = { MALLOC_ARENA_MAX: '2' };
