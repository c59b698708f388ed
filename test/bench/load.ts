// The benchmarks' load generator: `connections` workers posting one chat completion after another
// for `durationMs` over an undici Pool, each request from a different X-Forwarded-For address (the
// gateway under test trusts 127.0.0.1 as a proxy) so per-IP edge budgets do not cap the run.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from 'undici';

export interface LoadResult {
  ok: number;
  other: number;
  /** Successful (200) requests per second. */
  rps: number;
}

export async function load(url: string, headers: Record<string, string>, body: string, durationMs: number, connections: number): Promise<LoadResult> {
  const pool = new Pool(url, { connections, pipelining: 1 });
  let ok = 0;
  let other = 0;
  let ip = 0;
  const end = Date.now() + durationMs;
  const worker = async () => {
    while (Date.now() < end) {
      ip++;
      const res = await pool.request({
        path: '/v1/chat/completions',
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/json', 'x-forwarded-for': `10.${(ip >> 16) & 255}.${(ip >> 8) & 255}.${ip & 255}` },
        body,
      });
      await res.body.dump();
      if (res.statusCode === 200) ok++;
      else other++;
    }
  };
  const t0 = Date.now();
  await Promise.all(Array.from({ length: connections }, worker));
  const secs = (Date.now() - t0) / 1000;
  await pool.close();
  return { ok, other, rps: ok / secs };
}

export interface CountResult {
  ok: number;
  other: number;
  /** Status → count of the answers that were not 200. */
  statuses: Record<number, number>;
  /** retry-after values seen on 429s. */
  retryAfter: Record<string, number>;
}

/** Sends exactly `count` chat completions over `connections` workers (IP spread as in `load`). */
export async function sendCount(url: string, headers: Record<string, string>, body: string, count: number, connections: number, ipBase = 0): Promise<CountResult> {
  const pool = new Pool(url, { connections, pipelining: 1 });
  const r: CountResult = { ok: 0, other: 0, statuses: {}, retryAfter: {} };
  let sent = 0;
  const worker = async () => {
    while (sent < count) {
      const ip = ipBase + ++sent;
      const res = await pool.request({
        path: '/v1/chat/completions',
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/json', 'x-forwarded-for': `10.${(ip >> 16) & 255}.${(ip >> 8) & 255}.${ip & 255}` },
        body,
      });
      await res.body.dump();
      if (res.statusCode === 200) r.ok++;
      else {
        r.other++;
        r.statuses[res.statusCode] = (r.statuses[res.statusCode] ?? 0) + 1;
        const ra = String(res.headers['retry-after'] ?? '');
        r.retryAfter[ra] = (r.retryAfter[ra] ?? 0) + 1;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(connections, count) }, worker));
  await pool.close();
  return r;
}

/** Sends `count` chat completions one after another, one every `intervalMs` (a steady client). */
export async function sendPaced(url: string, headers: Record<string, string>, body: string, count: number, intervalMs: number, ipBase = 0): Promise<CountResult> {
  const pool = new Pool(url, { connections: 4, pipelining: 1 });
  const r: CountResult = { ok: 0, other: 0, statuses: {}, retryAfter: {} };
  const t0 = Date.now();
  const pending: Promise<void>[] = [];
  for (let i = 0; i < count; i++) {
    const wait = t0 + i * intervalMs - Date.now();
    if (wait > 0) await new Promise((res) => setTimeout(res, wait));
    const ip = ipBase + i + 1;
    pending.push(
      pool
        .request({
          path: '/v1/chat/completions',
          method: 'POST',
          headers: { ...headers, 'content-type': 'application/json', 'x-forwarded-for': `10.${(ip >> 16) & 255}.${(ip >> 8) & 255}.${ip & 255}` },
          body,
        })
        .then(async (res) => {
          await res.body.dump();
          if (res.statusCode === 200) r.ok++;
          else {
            r.other++;
            r.statuses[res.statusCode] = (r.statuses[res.statusCode] ?? 0) + 1;
          }
        }),
    );
  }
  await Promise.all(pending);
  await pool.close();
  return r;
}

// ---------------------------------------------------------------------------------------------------
// `npm run bench`'s generators: saturation with wrk (when on PATH) or autocannon, and a constant-rate
// loop with microsecond latencies. Every request carries its own X-Forwarded-For address, cycling
// over `IP_COUNT` addresses, so the gateway's per-IP edge budgets are in force but never tripped.

export const IP_COUNT = 16_384;
let ipSeq = 0;
/** The next client address, 10.x.y.z, cycling over IP_COUNT addresses. */
export function nextIp(): string {
  const ip = ipSeq++ % IP_COUNT;
  return `10.${64 + (ip >> 16)}.${(ip >> 8) & 255}.${ip & 255}`;
}

export interface Target {
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  body?: string | Buffer;
}

export interface SaturationResult {
  tool: 'wrk' | 'autocannon';
  requests: number;
  /** Answers that were not 2xx (and errors/timeouts). */
  errors: number;
  durationSec: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
}

const requireCjs = createRequire(import.meta.url);

export const hasWrk = spawnSync('wrk', ['--version']).error === undefined;

/** Closed-loop saturation: `connections` connections, one request after the other on each. */
export function saturate(baseUrl: string, t: Target, connections: number, durationSec: number): Promise<SaturationResult> {
  return hasWrk ? saturateWrk(baseUrl, t, connections, durationSec) : saturateAutocannon(baseUrl, t, connections, durationSec);
}

function saturateAutocannon(baseUrl: string, t: Target, connections: number, durationSec: number): Promise<SaturationResult> {
  const autocannon = requireCjs('autocannon') as (opts: Record<string, unknown>, cb: (err: Error | null, r: any) => void) => unknown;
  let firstBad: string | null = null;
  return new Promise((resolve, reject) => {
    autocannon(
      {
        url: baseUrl,
        connections,
        pipelining: 1,
        duration: durationSec,
        requests: [
          {
            method: t.method,
            path: t.path,
            headers: t.headers,
            body: t.body,
            setupRequest: (req: { headers: Record<string, string> }) => ({ ...req, headers: { ...req.headers, 'x-forwarded-for': nextIp() } }),
            onResponse: (status: number, body: string) => {
              if ((status < 200 || status > 299) && firstBad === null) firstBad = `${status} ${String(body).slice(0, 300)}`;
            },
          },
        ],
      },
      (err, r) => {
        if (err) return reject(err);
        if (firstBad !== null) console.log(`  first non-2xx answer: ${firstBad}`);
        const ok = r['2xx'] as number;
        const seconds = (r.duration as number) || durationSec;
        resolve({
          tool: 'autocannon',
          requests: ok,
          errors: (r.non2xx as number) + (r.errors as number) + (r.timeouts as number),
          durationSec: seconds,
          rps: ok / seconds,
          p50Ms: r.latency.p50 as number,
          p99Ms: r.latency.p99 as number,
        });
      },
    );
  });
}

/** wrk with a Lua script that gives every request its own X-Forwarded-For and counts non-2xx answers. */
function saturateWrk(baseUrl: string, t: Target, connections: number, durationSec: number): Promise<SaturationResult> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-wrk-'));
  const script = join(dir, 'req.lua');
  let body = 'nil';
  if (t.body !== undefined) {
    const file = join(dir, 'body');
    writeFileSync(file, t.body);
    body = `io.open(${JSON.stringify(file)}, "rb"):read("*a")`;
  }
  const headers = Object.entries(t.headers)
    .map(([k, v]) => `[${JSON.stringify(k)}] = ${JSON.stringify(v)}`)
    .join(', ');
  writeFileSync(
    script,
    `local body = ${body}
local n = 0
local h = { ${headers} }
request = function()
  local ip = n % ${IP_COUNT}
  n = n + 1
  h["x-forwarded-for"] = string.format("10.%d.%d.%d", 64 + math.floor(ip / 65536), math.floor(ip / 256) % 256, ip % 256)
  return wrk.format(${JSON.stringify(t.method)}, ${JSON.stringify(t.path)}, h, body)
end
local bad = 0
response = function(status) if status < 200 or status > 299 then bad = bad + 1 end end
done = function(summary, latency, requests)
  io.write(string.format("TOLLGATE %d %d %d %d %d %d\\n", summary.requests, summary.duration, bad + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout, latency:percentile(50), latency:percentile(99), 0))
end
`,
  );
  return new Promise((resolve, reject) => {
    const child = spawn('wrk', ['-t1', `-c${connections}`, `-d${durationSec}s`, '-s', script, baseUrl], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c) => (out += c));
    child.stderr.on('data', (c) => (out += c));
    child.on('exit', () => {
      const m = out.match(/TOLLGATE (\d+) (\d+) (\d+) (\d+) (\d+)/);
      if (!m) return reject(new Error(`wrk printed no summary:\n${out}`));
      const [requests, durUs, errors, p50Us, p99Us] = m.slice(1).map(Number);
      const seconds = durUs / 1e6;
      // wrk's errors.status counts non-2xx/3xx as well; `bad` may count some twice: an upper bound.
      const ok = Math.max(0, requests - errors);
      resolve({ tool: 'wrk', requests: ok, errors, durationSec: seconds, rps: ok / seconds, p50Ms: p50Us / 1000, p99Ms: p99Us / 1000 });
    });
  });
}

export interface PacedResult {
  sent: number;
  ok: number;
  errors: number;
  rate: number;
  p50Us: number;
  p99Us: number;
  maxUs: number;
}

/**
 * Open-loop constant rate: `rate` requests per second for `durationSec`, whatever the answers'
 * latency (a request that is due goes out even while others are in flight, up to 1,024 at once).
 * Latency is measured per request from the moment it is handed to the client, in microseconds.
 */
export async function paced(baseUrl: string, t: Target, rate: number, durationSec: number): Promise<PacedResult> {
  const pool = new Pool(baseUrl, { connections: 256, pipelining: 1 });
  const latencies: number[] = [];
  let ok = 0;
  let errors = 0;
  let sent = 0;
  const total = Math.round(rate * durationSec);
  const t0 = performance.now();
  const inFlight = new Set<Promise<void>>();
  const one = async () => {
    const start = performance.now();
    try {
      const res = await pool.request({ method: t.method, path: t.path, headers: { ...t.headers, 'x-forwarded-for': nextIp() }, body: t.body });
      await res.body.dump();
      if (res.statusCode >= 200 && res.statusCode < 300) {
        ok++;
        latencies.push((performance.now() - start) * 1000);
      } else errors++;
    } catch {
      errors++;
    }
  };
  while (sent < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * rate) + 1);
    while (sent < due && inFlight.size < 1024) {
      sent++;
      const p = one().finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
    // Sleep until the next request is due (timers have ~1 ms resolution; the loop catches up).
    const nextAt = t0 + (sent / rate) * 1000;
    await new Promise((r) => setTimeout(r, Math.max(0, nextAt - performance.now())));
  }
  await Promise.all(inFlight);
  await pool.close();
  latencies.sort((a, b) => a - b);
  const at = (q: number) => (latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]);
  return { sent, ok, errors, rate: sent / ((performance.now() - t0) / 1000), p50Us: at(0.5), p99Us: at(0.99), maxUs: latencies[latencies.length - 1] ?? 0 };
}
