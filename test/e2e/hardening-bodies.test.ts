// Request bodies cannot stall, fill or fool a node (issue 21): multipart part heads are parsed in
// linear time, bodies refused for their content still count, early refusals reach the client whole
// (lingering close), the body budget follows the bytes, slow bodies get 408, and upload spills are
// bounded node-wide.
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { consoleClient, createKey, type Console } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer } from '../helpers/http.js';
import { scrapeMetrics } from '../helpers/prometheus.js';
import { startControlPlane, startDataPlane, stopAll, type ControlPlane, type DataPlane } from '../helpers/processes.js';

const KIB = 1024;
const MIB = 1024 * KIB;
const TRANSCRIBE = '/v1/audio/transcriptions';
const BOUNDARY = 'hostile-boundary';

let up: FakeUpstream;
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;

before(async () => {
  up = await startFakeUpstream();
  cp = await startControlPlane({
    configYaml: configYaml((cfg) => addUpstreamModel(cfg, 'up-transcribe', up.baseUrl, ['free', 'paid'], { kind: 'transcription', audio_usd_per_unit: '0.0001' })),
    env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
  });
  // The injected clock stands still: a run never crosses a minute of rpm.
  node = await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
  admin = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  admin?.close();
  await stopAll();
  await up?.close();
});

async function keyOf(tier: 'free' | 'paid', on: DataPlane = node): Promise<{ key: string; orgId: string }> {
  const k = await createKey(admin, { tier });
  if (tier === 'paid') await admin.creditOrg({ orgId: k.orgId, amountMicros: 10_000_000, note: 'test' });
  await waitUntilKnown(on.url, k.key);
  return { key: k.key, orgId: k.orgId };
}

/**
 * A multipart body of about `bytes` whose parts have no model field and heads made to backtrack a
 * regular expression: 15 KiB of `content-disposition:` on one header line.
 */
function hostileMultipart(bytes: number): Buffer {
  const part = Buffer.from(`--${BOUNDARY}\r\nX-Pad: ${'content-disposition:'.repeat(750)}\r\n\r\nv\r\n`);
  const parts: Buffer[] = [];
  for (let n = 0; n < bytes; n += part.length) parts.push(part);
  parts.push(Buffer.from(`--${BOUNDARY}--\r\n`));
  return Buffer.concat(parts);
}

function upload(key: string, body: Buffer, on: DataPlane = node) {
  return fetch(`${on.url}${TRANSCRIBE}`, { method: 'POST', headers: { ...bearer(key), 'content-type': `multipart/form-data; boundary=${BOUNDARY}` }, body: new Uint8Array(body) });
}

async function loopDelayMaxSec(on: DataPlane): Promise<number> {
  return (await scrapeMetrics(`${on.adminUrl}/metrics`)).value('tollgate_node_event_loop_delay_max_seconds')!;
}

test('a multi-MiB upload of hostile part heads does not stall the event loop', async () => {
  // Before the fix a regular expression backtracked quadratically on each part head: about 2 s of event
  // loop per MiB of such heads, during which the node answered nobody.
  const { key } = await keyOf('paid');
  await loopDelayMaxSec(node);
  const r = await upload(key, hostileMultipart(3 * MIB));
  assert.equal(r.status, 400, await r.clone().text());
  assert.equal((await r.json()).error.param, 'model');
  const delay = await loopDelayMaxSec(node);
  assert.ok(delay < 0.25, `event-loop delay ${delay.toFixed(3)} s while scanning 3 MiB of hostile part heads`);
});

test('uploads refused for their content after they were read count against rpm', async () => {
  // Before the fix a 400 after the body was read gave its request back: 25 such uploads from a free
  // 20 rpm key left it 19 requests.
  const { key } = await keyOf('free');
  const body = hostileMultipart(64 * KIB);
  for (let i = 1; i <= 20; i++) {
    const r = await upload(key, body);
    assert.equal(r.status, 400, `upload ${i}`);
    assert.equal(r.headers.get('x-ratelimit-remaining-requests'), String(20 - i), `upload ${i}`);
    await r.arrayBuffer();
  }
  for (let i = 21; i <= 25; i++) {
    const r = await upload(key, body);
    assert.equal(r.status, 429, `upload ${i}`);
    assert.equal((await r.json()).error.type, 'requests');
  }
});
