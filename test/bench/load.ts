// The benchmarks' load generator: `connections` workers posting one chat completion after another
// for `durationMs` over an undici Pool, each request from a different X-Forwarded-For address (the
// gateway under test trusts 127.0.0.1 as a proxy) so per-IP edge budgets do not cap the run.
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
