// What a process uses, read from /proc (Linux): CPU seconds, resident memory now and its peak while
// sampled, and a wait until the process is idle. For tests that bound a node's CPU or memory.
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { Worker } from 'node:worker_threads';

const KIB = 1024;

/** User plus system CPU seconds the process has used (/proc/PID/stat fields 14 and 15, in 1/100 s). */
export function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** The process's resident memory now (VmRSS), in bytes. */
export function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) * KIB;
}

/**
 * Samples a process's RSS every few milliseconds until stopped, from a worker thread: the test's own
 * event loop may be busy (uploading, say) and would skip timer turns.
 */
export function sampleRss(pid: number): { stop(): Promise<number> } {
  const peak = new Float64Array(new SharedArrayBuffer(8));
  const worker = new Worker(
    `const { workerData } = require('node:worker_threads');
     const { readFileSync } = require('node:fs');
     const peak = new Float64Array(workerData.peak);
     const sample = () => {
       const m = /VmRSS:\\s+(\\d+) kB/.exec(readFileSync('/proc/' + workerData.pid + '/status', 'utf8'));
       if (m) peak[0] = Math.max(peak[0], Number(m[1]) * 1024);
     };
     sample();
     setInterval(sample, 2);`,
    { eval: true, workerData: { pid, peak: peak.buffer } },
  );
  return {
    async stop() {
      await worker.terminate();
      return Math.max(peak[0], rssBytes(pid));
    },
  };
}

/**
 * Waits until the node is idle (its CPU time stops growing): work a warm-up set off in the background
 * (V8 compiling undici's WASM HTTP parser with TurboFan takes ~30 MB for a moment) would otherwise
 * land in the measurement.
 */
export async function quiesce(pid: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  let last = cpuSeconds(pid);
  for (;;) {
    await sleep(100);
    const now = cpuSeconds(pid);
    if (now - last <= 0.02) return;
    if (Date.now() > deadline) throw new Error(`the node kept using CPU after the warm-up (${(now - last).toFixed(2)} s in 100 ms)`);
    last = now;
  }
}
