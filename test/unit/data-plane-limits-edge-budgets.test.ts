// Edge budgets per client IP (spec, Limits → Edge) and body caps, driven by a ManualClock.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock } from '../../data-plane/limits/clock.js';
import {
  EdgeBudgets,
  bodyCapBytes,
  matchEdgeBudgets,
  presentsCredential,
  EDGE_BUDGET_LIMITS,
} from '../../data-plane/limits/edge-budgets.js';

const MIB = 1024 * 1024;

function takeN(edge: EdgeBudgets, n: number, ip: string, path: string, cred: boolean) {
  let last = edge.take(ip, path, cred);
  for (let i = 1; i < n; i++) last = edge.take(ip, path, cred);
  return last;
}

test('the 13th credential-less request in a window is refused, retry-after counts down, the window resets', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  for (let i = 0; i < 12; i++) {
    assert.deepEqual(edge.take('10.0.0.1', '/v1/chat/completions', false), { ok: true, retryAfterSec: 0 });
    clock.advance(100);
  }
  // Window started at t0; now t0 + 1.2 s → 58.8 s left → 59.
  assert.deepEqual(edge.take('10.0.0.1', '/v1/chat/completions', false), { ok: false, retryAfterSec: 59, budget: 'anonymous' });
  clock.advance(20_000 - 1_200);
  assert.equal(edge.take('10.0.0.1', '/v1/chat/completions', false).retryAfterSec, 40);
  clock.advance(39_500);
  assert.equal(edge.take('10.0.0.1', '/v1/chat/completions', false).retryAfterSec, 1);
  clock.advance(499);
  assert.deepEqual(edge.take('10.0.0.1', '/v1/chat/completions', false), { ok: false, retryAfterSec: 1, budget: 'anonymous' });
  clock.advance(1); // exactly 60 s after the first request: a new window
  for (let i = 0; i < 12; i++) assert.equal(edge.take('10.0.0.1', '/v1/chat/completions', false).ok, true);
  assert.equal(edge.take('10.0.0.1', '/v1/chat/completions', false).ok, false);
  // Another IP is untouched.
  assert.equal(edge.take('10.0.0.2', '/v1/chat/completions', false).ok, true);
});

test('the window starts at the first request counted in it, not at a clock minute', () => {
  const clock = new ManualClock(Date.UTC(2025, 0, 1, 0, 0, 50));
  const edge = new EdgeBudgets(clock);
  takeN(edge, 12, 'ip', '/v1/embeddings', false);
  clock.advance(15_000); // crosses a clock minute; the window still has 45 s
  assert.deepEqual(edge.take('ip', '/v1/embeddings', false), { ok: false, retryAfterSec: 45, budget: 'anonymous' });
});

test('a credential presented (valid or not) gets 600 per minute in its own budget', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  assert.equal(takeN(edge, 600, 'ip', '/v1/chat/completions', true).ok, true);
  assert.deepEqual(edge.take('ip', '/v1/chat/completions', true), { ok: false, retryAfterSec: 60, budget: 'credentialed' });
  // The anonymous budget of the same IP is separate.
  assert.equal(edge.take('ip', '/v1/chat/completions', false).ok, true);
});

test('presentsCredential: any non-empty Authorization, x-api-key or api-key', () => {
  const rows: Array<[string | undefined, string | undefined, string | undefined, boolean]> = [
    [undefined, undefined, undefined, false],
    ['', '', '', false],
    ['  ', undefined, undefined, false],
    ['Bearer sk-x', undefined, undefined, true],
    ['garbage', undefined, undefined, true],
    [undefined, 'sk-x', undefined, true],
    [undefined, undefined, 'sk-x', true],
  ];
  for (const [a, x, k, want] of rows) assert.equal(presentsCredential(a, x, k), want, JSON.stringify([a, x, k]));
});

test('matchEdgeBudgets: every budget a path counts in', () => {
  const rows: Array<[string, boolean, string[]]> = [
    ['/v1/chat/completions', false, ['anonymous']],
    ['/v1/chat/completions', true, ['credentialed']],
    ['/v1/chat/completions?x=1', true, ['credentialed']],
    ['/v1/audio/voices', true, ['credentialed', 'voices']],
    ['/v1/audio/voices?lang=en', true, ['credentialed', 'voices']],
    ['/v1/audio/voices/alloy', true, ['credentialed', 'voices']],
    ['/v1/audio/voicesx', true, ['credentialed', 'audio']],
    ['/v1/audio/speech', true, ['credentialed', 'audio']],
    ['/v1/audio/transcriptions', false, ['anonymous', 'audio']],
    ['/v1/audio', true, ['credentialed']],
    ['/v1/files', true, ['credentialed', 'files']],
    ['/v1/files/file-1/content', true, ['credentialed', 'files']],
    ['/v1/filesystem', true, ['credentialed', 'files']],
    ['/v1/models', true, ['credentialed', 'group120']],
    ['/v1/models/demo', true, ['credentialed', 'group120']],
    ['/v1/pdf', true, ['credentialed', 'group120']],
    ['/v1/pdf/render', true, ['credentialed', 'group120']],
    ['/v1/skills', true, ['credentialed', 'group120']],
    ['/v1/skills/x', true, ['credentialed', 'group120']],
    ['/v1/mcp', true, ['credentialed', 'group120']],
    ['/v1/mcp/server/x', true, ['credentialed', 'group120']],
    ['/v1/vector_stores', true, ['credentialed', 'group120']],
    ['/v1/vector_stores/vs_1/files', true, ['credentialed', 'group120']],
    ['/v1/sandbox/run', true, ['credentialed', 'group120']],
    ['/v1/sandbox', true, ['credentialed']],
    ['/v1/route', true, ['credentialed', 'group120']],
    ['/v1/route/x', true, ['credentialed', 'group120']],
    ['/v1/router', true, ['credentialed']],
    ['/v1/realtime', true, ['credentialed', 'realtime']],
    ['/v1/realtime?model=x', false, ['anonymous', 'realtime']],
    ['/v1/realtime/sessions', true, ['credentialed', 'realtime']],
    ['/v1', false, ['anonymous']],
    ['/v1x', false, []],
    ['/healthz', false, []],
    ['/', true, []],
  ];
  for (const [path, cred, want] of rows) assert.deepEqual(matchEdgeBudgets(path, cred), want, path);
});

test('each path budget has its own limit', () => {
  const rows: Array<[string, string, number]> = [
    ['/v1/audio/voices', 'voices', 120],
    ['/v1/audio/speech', 'audio', 60],
    ['/v1/files', 'files', 60],
    ['/v1/models', 'group120', 120],
    ['/v1/pdf/render', 'group120', 120],
    ['/v1/route', 'group120', 120],
    ['/v1/realtime', 'realtime', 60],
  ];
  for (const [path, budget, limit] of rows) {
    assert.equal(EDGE_BUDGET_LIMITS[budget as keyof typeof EDGE_BUDGET_LIMITS], limit);
    const clock = new ManualClock();
    const edge = new EdgeBudgets(clock);
    // Credentialed, so the 600 general budget is not the one that trips.
    assert.equal(takeN(edge, limit, 'ip', path, true).ok, true, `${path} request ${limit}`);
    clock.advance(30_000);
    assert.deepEqual(edge.take('ip', path, true), { ok: false, retryAfterSec: 30, budget }, path);
  }
});

test('path budgets are shared by every path of the group', () => {
  const edge = new EdgeBudgets(new ManualClock());
  const paths = ['/v1/models', '/v1/pdf', '/v1/skills/a', '/v1/mcp/b', '/v1/vector_stores', '/v1/sandbox/c', '/v1/route'];
  for (let i = 0; i < 120; i++) assert.equal(edge.take('ip', paths[i % paths.length], true).ok, true);
  assert.equal(edge.take('ip', '/v1/models', true).budget, 'group120');
  assert.equal(edge.take('ip', '/v1/route', true).budget, 'group120');
  // A path outside the group still passes.
  assert.equal(edge.take('ip', '/v1/chat/completions', true).ok, true);
});

test('every matching budget applies: the general budget trips a path request too', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  // 12 anonymous requests to /v1/models spend the anonymous budget long before group120's 120.
  assert.equal(takeN(edge, 12, 'ip', '/v1/models', false).ok, true);
  assert.deepEqual(edge.take('ip', '/v1/models', false), { ok: false, retryAfterSec: 60, budget: 'anonymous' });
  assert.equal(edge.take('ip', '/v1/chat/completions', false).budget, 'anonymous');
});

test('retry-after is the largest among the spent budgets', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  // The anonymous window starts at t=0 on another path, the audio window at t=10 s.
  takeN(edge, 11, 'ip', '/v1/chat/completions', false); // anonymous window from t=0
  clock.advance(10_000);
  edge.take('ip', '/v1/audio/speech', false); // anonymous 12/12; audio window from t=10 s, 1/60
  clock.advance(10_000);
  // anonymous: 40 s left; audio not spent → only anonymous counts.
  assert.deepEqual(edge.take('ip', '/v1/audio/speech', false), { ok: false, retryAfterSec: 40, budget: 'anonymous' });
  // Spend audio with credentials (credentialed 600 is far away): audio 60/60 with 50 s left.
  takeN(edge, 59, 'ip', '/v1/audio/speech', true);
  assert.deepEqual(edge.take('ip', '/v1/audio/speech', true), { ok: false, retryAfterSec: 50, budget: 'audio' });
  // Both anonymous (40 s) and audio (50 s) spent: the largest wins.
  assert.deepEqual(edge.take('ip', '/v1/audio/speech', false), { ok: false, retryAfterSec: 50, budget: 'audio' });
});

test('a refused request consumes no other budget', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  // Spend the files budget with credentials.
  takeN(edge, 60, 'ip', '/v1/files', true);
  // 540 more refused files requests must not eat the credentialed budget.
  for (let i = 0; i < 540; i++) assert.equal(edge.take('ip', '/v1/files', true).ok, false);
  // Credentialed has 600 - 60 = 540 left, all still usable.
  assert.equal(takeN(edge, 540, 'ip', '/v1/chat/completions', true).ok, true);
  assert.equal(edge.take('ip', '/v1/chat/completions', true).budget, 'credentialed');

  // And the other way round: a spent general budget does not start or count a path window.
  const edge2 = new EdgeBudgets(new ManualClock());
  takeN(edge2, 12, 'ip', '/v1/chat/completions', false);
  for (let i = 0; i < 100; i++) edge2.take('ip', '/v1/audio/speech', false);
  assert.equal(edge2.trackedWindows('audio'), 0);
});

test('non-/v1 paths are not budgeted', () => {
  const edge = new EdgeBudgets(new ManualClock());
  for (let i = 0; i < 100; i++) assert.equal(edge.take('ip', '/healthz', false).ok, true);
  assert.equal(edge.trackedWindows(), 0);
});

test('expired windows are dropped lazily', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  for (let i = 0; i < 1000; i++) edge.take(`10.0.${i >> 8}.${i & 255}`, '/v1/models', true);
  assert.equal(edge.trackedWindows('credentialed'), 1000);
  assert.equal(edge.trackedWindows('group120'), 1000);
  clock.advance(60_000);
  for (let i = 0; i < 200; i++) edge.take('192.168.0.1', '/v1/models', true);
  assert.equal(edge.trackedWindows('credentialed'), 1);
  assert.equal(edge.trackedWindows('group120'), 1);
});

test('churn over many windows keeps maps and queues small', () => {
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  for (let minute = 0; minute < 20; minute++) {
    for (let i = 0; i < 2000; i++) {
      edge.take(`m${minute}-${i}`, '/v1/chat/completions', false);
      edge.take('steady', '/v1/chat/completions', true);
      clock.advance(30);
    }
    assert.ok(edge.trackedWindows('anonymous') <= 4000, `minute ${minute}`);
    assert.ok(edge.queuedWindows('anonymous') <= 4000, `minute ${minute}`);
    assert.ok(edge.queuedWindows('credentialed') <= 600, `minute ${minute}`);
  }
});

test('a clock stepping back never yields retry-after above 60 or below 1', () => {
  const clock = new ManualClock(1_000_000);
  const edge = new EdgeBudgets(clock);
  takeN(edge, 12, 'ip', '/v1/chat/completions', false);
  clock.set(900_000);
  assert.deepEqual(edge.take('ip', '/v1/chat/completions', false), { ok: false, retryAfterSec: 60, budget: 'anonymous' });
});

test('memory stays bounded under a flood of 1e6 distinct IPs', () => {
  const clock = new ManualClock();
  const cap = 10_000;
  const edge = new EdgeBudgets(clock, { maxTrackedIps: cap });
  let max = 0;
  for (let i = 0; i < 1_000_000; i++) {
    const ip = `${(i >>> 16) & 255}.${(i >>> 8) & 255}.${i & 255}.9`;
    assert.equal(edge.take(ip, i % 2 === 0 ? '/v1/files' : '/v1/chat/completions', i % 3 === 0).ok, true);
    if (i % 1000 === 0) clock.advance(1); // all within one window
    if (i % 50_000 === 0) max = Math.max(max, edge.trackedWindows('anonymous'), edge.trackedWindows('credentialed'), edge.trackedWindows('files'));
  }
  for (const b of ['anonymous', 'credentialed', 'files', 'audio'] as const) assert.ok(edge.trackedWindows(b) <= cap, b);
  assert.ok(max <= cap);
  assert.equal(edge.trackedWindows('anonymous'), cap);
  for (const b of ['anonymous', 'credentialed', 'files'] as const) assert.ok(edge.queuedWindows(b) <= 2 * cap, b);
  // The most recent IPs are still counted: the last credential-less one has 1 request in its window.
  const last = 999_997;
  const ip = `${(last >>> 16) & 255}.${(last >>> 8) & 255}.${last & 255}.9`;
  assert.equal(takeN(edge, 11, ip, '/v1/chat/completions', false).ok, true);
  assert.equal(edge.take(ip, '/v1/chat/completions', false).ok, false);
});

test('the default cap bounds each budget too', () => {
  const edge = new EdgeBudgets(new ManualClock());
  for (let i = 0; i < 150_000; i++) edge.take(`ip-${i}`, '/v1/chat/completions', false);
  assert.equal(edge.trackedWindows('anonymous'), 100_000);
});

test('body caps per path (MiB)', () => {
  const rows: Array<[string, number]> = [
    ['/v1/chat/completions', 32 * MIB],
    ['/v1/embeddings', 32 * MIB],
    ['/v1/audio/voices', 32 * MIB],
    ['/v1/audio/speech', 200 * MIB],
    ['/v1/audio/transcriptions', 200 * MIB],
    ['/v1/audio/transcriptions?x=1', 200 * MIB],
    ['/v1/files', 256 * MIB],
    ['/v1/files/file-1', 256 * MIB],
    ['/v1/models', 64 * MIB],
    ['/v1/pdf', 64 * MIB],
    ['/v1/skills/x', 64 * MIB],
    ['/v1/mcp', 64 * MIB],
    ['/v1/vector_stores/x', 64 * MIB],
    ['/v1/sandbox/exec', 64 * MIB],
    ['/v1/route', 64 * MIB],
    ['/v1/realtime', 32 * MIB],
    ['/elsewhere', 32 * MIB],
  ];
  for (const [path, want] of rows) assert.equal(bodyCapBytes(path), want, path);
});

test('IPv6 clients are counted by their /64; IPv4 clients by their address', () => {
  // Before the fix every IPv6 address had its own window: a host with a /64 (2^64 addresses of its
  // own) could send 12 anonymous requests from each address it chose, without limit.
  const clock = new ManualClock();
  const edge = new EdgeBudgets(clock);
  for (let i = 0; i < 12; i++) assert.equal(edge.take(`2001:db8:1:2::${(i + 1).toString(16)}`, '/v1/models', false).ok, true);
  const refused = edge.take('2001:db8:1:2:ffff:ffff:ffff:ffff', '/v1/models', false);
  assert.deepEqual(refused, { ok: false, retryAfterSec: 60, budget: 'anonymous' });
  // The next /64 is another client; every IPv4 address is a client of its own.
  assert.equal(edge.take('2001:db8:1:3::1', '/v1/models', false).ok, true);
  for (let i = 0; i < 12; i++) assert.equal(edge.take('10.0.0.1', '/v1/models', false).ok, true);
  assert.equal(edge.take('10.0.0.1', '/v1/models', false).ok, false);
  assert.equal(edge.take('10.0.0.2', '/v1/models', false).ok, true);
  assert.equal(edge.trackedWindows('anonymous'), 4);
});
