// Helpers for data-plane tests: wait until a node has learnt a key (keys reach nodes by a sync delta).
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Polls a node until `key` authenticates there (any answer but a 401 authentication_error).
 * Uses GET /v1/chat/completions: after authentication that is a 405, which costs the key no rpm.
 */
export async function waitUntilKnown(nodeUrl: string, key: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await fetch(`${nodeUrl}/v1/chat/completions`, { headers: { authorization: `Bearer ${key}` } });
    const body = (await r.json().catch(() => null)) as { error?: { type?: string } } | null;
    if (!(r.status === 401 && body?.error?.type === 'authentication_error')) return;
    if (Date.now() > deadline) throw new Error(`node ${nodeUrl} did not learn the key within ${timeoutMs} ms`);
    await sleep(25);
  }
}

/** Polls until `check` resolves true (for state that arrives asynchronously by sync). */
export async function eventually(check: () => Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  if (!(await within(timeoutMs, check))) throw new Error(`timed out waiting for ${what}`);
}

/** Polls `probe` every 25 ms until it holds (true) or `ms` passed (false): for an assertion with its own message. */
export async function within(ms: number, probe: () => Promise<boolean>): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await probe()) return true;
    if (Date.now() > deadline) return false;
    await sleep(25);
  }
}
