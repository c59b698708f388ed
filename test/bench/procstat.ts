// What a process costs, read from /proc (Linux): CPU time (utime + stime of all its threads) and
// memory (VmRSS now, VmHWM the peak). Elsewhere every figure is null. Also pinning with taskset.
import { readdirSync, readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

const CLK_TCK = (() => {
  const r = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
  const n = Number(r.stdout?.trim());
  return Number.isFinite(n) && n > 0 ? n : 100;
})();

/** CPU time the process has used so far, in microseconds (resolution 1/CLK_TCK s), or null. */
export function cpuMicros(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(rest[11]) + Number(rest[12]);
    return (ticks * 1e6) / CLK_TCK;
  } catch {
    return null;
  }
}

/** CPU time of the process's main thread alone (the event loop: JavaScript), in microseconds, or null. */
export function mainThreadCpuMicros(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/task/${pid}/stat`, 'utf8');
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(rest[11]) + Number(rest[12])) * 1e6) / CLK_TCK;
  } catch {
    return null;
  }
}

/** CPU time of each thread of the process (tid → microseconds, of which in the kernel); empty without /proc. */
export function threadCpuMicros(pid: number): Map<number, { total: number; sys: number }> {
  const out = new Map<number, { total: number; sys: number }>();
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      try {
        const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
        const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        out.set(Number(tid), { total: ((Number(rest[11]) + Number(rest[12])) * 1e6) / CLK_TCK, sys: (Number(rest[12]) * 1e6) / CLK_TCK });
      } catch {
        // (the thread ended)
      }
    }
  } catch {
    // (no /proc)
  }
  return out;
}

function statusField(pid: number, field: string): number | null {
  try {
    const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}

export const rssBytes = (pid: number) => statusField(pid, 'VmRSS');
export const peakRssBytes = (pid: number) => statusField(pid, 'VmHWM');

/** Samples a process's RSS every `everyMs` until stopped; returns the highest seen. */
export function watchRss(pid: number, everyMs = 100): () => number | null {
  let max: number | null = rssBytes(pid);
  const t = setInterval(() => {
    const r = rssBytes(pid);
    if (r !== null && (max === null || r > max)) max = r;
  }, everyMs);
  return () => {
    clearInterval(t);
    const r = rssBytes(pid);
    if (r !== null && (max === null || r > max)) max = r;
    return max;
  };
}

const hasTaskset = spawnSync('taskset', ['-V']).status === 0;
const cores = (() => {
  try {
    return readFileSync('/proc/cpuinfo', 'utf8').match(/^processor\s*:/gm)?.length ?? 1;
  } catch {
    return 1;
  }
})();

/** Whether processes can be pinned: taskset on PATH and at least two cores. */
export const canPin = hasTaskset && cores >= 2;

/** Pins every thread of a process (and the threads it starts later) to one core. */
export function pin(pid: number, core: number): boolean {
  if (!canPin) return false;
  return spawnSync('taskset', ['-a', '-cp', String(core), String(pid)], { stdio: 'ignore' }).status === 0;
}
