// Preloaded into a node under fuzz (node --import). The first SIGUSR2 starts watching how late the
// event loop runs, the next prints one `loop-block {json}` line and stops. Two figures: `maxLateMs`,
// the longest the loop ran late (wall clock), and `maxBlockedMs`, the same lateness counted only as far
// as the process used CPU meanwhile (user + system): on a machine shared with other work the process
// may wait for a core, which is lateness it did not cause. Test only.
const TICK_MS = 5;
let timer = null;
let stats = null;

function start() {
  stats = { since: performance.now(), maxLateMs: 0, maxBlockedMs: 0, ticks: 0 };
  let last = performance.now();
  let cpu = process.cpuUsage();
  timer = setInterval(() => {
    const now = performance.now();
    const used = process.cpuUsage(cpu);
    cpu = process.cpuUsage();
    const late = Math.max(0, now - last - TICK_MS);
    const cpuMs = (used.user + used.system) / 1000;
    stats.ticks++;
    if (late > stats.maxLateMs) stats.maxLateMs = late;
    const blocked = Math.min(late, cpuMs);
    if (blocked > stats.maxBlockedMs) stats.maxBlockedMs = blocked;
    last = now;
  }, TICK_MS);
  timer.unref();
}

process.on('SIGUSR2', () => {
  if (!timer) return start();
  clearInterval(timer);
  timer = null;
  const r = (n) => Math.round(n * 100) / 100;
  console.log(`loop-block ${JSON.stringify({ seconds: r((performance.now() - stats.since) / 1000), ticks: stats.ticks, maxLateMs: r(stats.maxLateMs), maxBlockedMs: r(stats.maxBlockedMs) })}`);
});
