// What a process costs, read from /proc (Linux): CPU time (of all its threads, from schedstat; of a
// process tree, such as a database server) and memory (VmRSS now, VmHWM the peak). Elsewhere every
// figure is null. Also pinning with taskset.
import { readdirSync, readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

const CLK_TCK = (() => {
  const r = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
  const n = Number(r.stdout?.trim());
  return Number.isFinite(n) && n > 0 ? n : 100;
})();

/**
 * Time a thread has run on a CPU, in microseconds, from /proc/PID/task/TID/schedstat: the scheduler's
 * own count in nanoseconds. utime and stime (stat) are counted in clock ticks and charged to whatever
 * runs when the tick fires, so a process that runs in bursts of a millisecond (a control plane at
 * 400 req/s uses a few ms of CPU a second) reads 0 or 10 ms per burst; schedstat does not sample.
 * Null where the kernel does not provide it.
 */
function schedMicros(pid: number, tid: number): number | null {
  try {
    const ns = Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    return Number.isFinite(ns) ? ns / 1000 : null;
  } catch {
    return null;
  }
}

/** utime and stime of one thread, in microseconds (resolution 1/CLK_TCK s), or null. */
function tickMicros(pid: number, tid: number): { total: number; sys: number } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { total: ((Number(rest[11]) + Number(rest[12])) * 1e6) / CLK_TCK, sys: (Number(rest[12]) * 1e6) / CLK_TCK };
  } catch {
    return null;
  }
}

/**
 * CPU time the process has used so far, in microseconds, or null: the sum over its threads of
 * schedstat (see schedMicros), or of utime + stime where schedstat is missing. A thread that ended
 * is no longer counted (the process's own stat keeps it): Node's threads, the libuv pool and V8's
 * workers, live as long as the process, and Tollgate starts no worker threads.
 */
export function cpuMicros(pid: number): number | null {
  const threads = threadCpuMicros(pid);
  if (threads.size === 0) return null;
  let sum = 0;
  for (const t of threads.values()) sum += t.total;
  return sum;
}

/** CPU time of the process's main thread alone (the event loop: JavaScript), in microseconds, or null. */
export function mainThreadCpuMicros(pid: number): number | null {
  return schedMicros(pid, pid) ?? tickMicros(pid, pid)?.total ?? null;
}

/**
 * CPU time of each thread of the process (tid → microseconds, from schedstat where it exists; of
 * which in the kernel, from stime: clock ticks); empty without /proc.
 */
export function threadCpuMicros(pid: number): Map<number, { total: number; sys: number }> {
  const out = new Map<number, { total: number; sys: number }>();
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tids) {
    const ticks = tickMicros(pid, Number(tid));
    // (null: the thread ended meanwhile)
    if (ticks) out.set(Number(tid), { total: schedMicros(pid, Number(tid)) ?? ticks.total, sys: ticks.sys });
  }
  return out;
}

/** stat fields after the command name (which may hold spaces), from field 3 (state) on; null if gone. */
function statFields(pid: number): string[] | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return null;
  }
}

/**
 * CPU time of a process and all its descendants (a PostgreSQL server: the postmaster and its
 * backends and workers), in microseconds, or null without /proc. Live processes by schedstat (as
 * cpuMicros), plus the children each has already reaped (cutime + cstime, clock ticks): a backend
 * that ends between two readings leaves the tree, and its whole time shows in its parent's cutime.
 */
export function treeCpuMicros(root: number): number | null {
  if (statFields(root) === null) return null;
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    const f = statFields(pid);
    if (!f) continue;
    const ppid = Number(f[1]);
    children.set(ppid, [...(children.get(ppid) ?? []), pid]);
  }
  let sum = 0;
  const todo = [root];
  while (todo.length > 0) {
    const pid = todo.pop()!;
    const f = statFields(pid);
    // (null: it ended meanwhile; its time is in its parent's cutime at the next reading)
    if (!f) continue;
    sum += (cpuMicros(pid) ?? 0) + ((Number(f[13]) + Number(f[14])) * 1e6) / CLK_TCK;
    todo.push(...(children.get(pid) ?? []));
  }
  return sum;
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
