// Preloaded into the node by `npm run bench` (node --import). The first SIGUSR2 starts watching how
// late the event loop runs and the garbage collector's pauses; the next one prints what was seen as
// one `loop-delay {json}` line and stops watching (so nothing is measured during saturation runs).
// What the p99 a node adds at a constant rate is made of (bench.ts prints it). Bench only.
import { monitorEventLoopDelay, PerformanceObserver, constants } from 'node:perf_hooks';

const KINDS = { [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor', [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major', [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental', [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb' };
let watch = null;

function start() {
  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  const gc = {};
  const observer = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const g = (gc[KINDS[e.detail?.kind] ?? 'other'] ??= { count: 0, totalMs: 0, maxMs: 0 });
      g.count++;
      g.totalMs += e.duration;
      g.maxMs = Math.max(g.maxMs, e.duration);
    }
  });
  observer.observe({ entryTypes: ['gc'] });
  return { delay, gc, observer, since: performance.now() };
}

process.on('SIGUSR2', () => {
  if (!watch) {
    watch = start();
    return;
  }
  const { delay, gc, observer, since } = watch;
  watch = null;
  delay.disable();
  observer.disconnect();
  const ms = (ns) => Math.round(ns / 1e4) / 100;
  console.log(`loop-delay ${JSON.stringify({ seconds: (performance.now() - since) / 1000, p50Ms: ms(delay.percentile(50)), p99Ms: ms(delay.percentile(99)), maxMs: ms(delay.max), gc })}`);
});
