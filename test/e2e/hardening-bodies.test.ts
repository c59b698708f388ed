// Request bodies cannot stall, fill or fool a node (issue 21): multipart part heads are parsed in
// linear time, bodies refused for their content still count, early refusals reach the client whole
// (lingering close), the body budget follows the bytes, slow bodies get 408, and upload spills are
// bounded node-wide.
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { after, test } from 'node:test';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { type Console } from '../helpers/console.js';
import { eventually } from '../helpers/data-plane.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/fake-upstream.js';
import { bearer } from '../helpers/http.js';
import { scrapeMetrics } from '../helpers/prometheus.js';
import { mainThreadCpuMicros } from '../bench/procstat.js';
import { startRecordingBackend, type RecordingBackend } from '../helpers/recording-backend.js';
import { startDataPlane, type ControlPlane, type DataPlane } from '../helpers/processes.js';

const KIB = 1024;
const MIB = 1024 * KIB;
const TRANSCRIBE = '/v1/audio/transcriptions';
const BOUNDARY = 'hostile-boundary';

let up: FakeUpstream;
let cp: ControlPlane;
let node: DataPlane;
let admin: Console;
let backend: RecordingBackend;

const gw = gatewayFixture(
  async () => {
    up = await startFakeUpstream();
    backend = await startRecordingBackend();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          addUpstreamModel(cfg, 'up-transcribe', up.baseUrl, ['free', 'paid'], { kind: 'transcription', audio_usd_per_unit: '0.0001' });
          addUpstreamModel(cfg, 'up-chat', up.baseUrl);
          cfg.tool_backends = [{ prefix: '/v1/files', base_url: backend.baseUrl, timeout_ms: 5000 }];
        }),
        env: { TOLLGATE_TEST_UPSTREAM_KEY: 'upstream-secret' },
      },
      // The injected clock stands still: a run never crosses a minute of rpm.
      node: { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } },
    };
  },
  (g) => {
    ({ cp, node, console: admin } = g);
  },
);
after(async () => {
  await up?.close();
  await backend?.close();
});

async function keyOf(tier: 'free' | 'paid', on: DataPlane = node): Promise<{ key: string; orgId: string }> {
  const k = await gw.fundedKey({ tier, creditMicros: tier === 'paid' ? 10_000_000 : undefined, knownOn: [on] });
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

/** CPU seconds the node's main thread (its event loop) has used so far. */
function loopCpuSec(on: DataPlane): number {
  const micros = mainThreadCpuMicros(on.proc.child.pid!);
  assert.ok(micros !== null, "the node's CPU time is readable (/proc)");
  return micros / 1e6;
}

test('a multi-MiB upload of hostile part heads does not stall the event loop', async () => {
  // Before the fix a regular expression backtracked quadratically on each part head: about 2 s of event
  // loop per MiB of such heads, during which the node answered nobody. Bounded by the CPU time of the
  // node's main thread (the event loop's, /proc), not by its event-loop gauge, which is wall time and
  // counts what a loaded machine gives other processes.
  const { key } = await keyOf('paid');
  const before = loopCpuSec(node);
  const r = await upload(key, hostileMultipart(3 * MIB));
  assert.equal(r.status, 400, await r.clone().text());
  assert.equal((await r.json()).error.param, 'model');
  const busy = loopCpuSec(node) - before;
  assert.ok(busy < 0.25, `the node's event loop ran ${busy.toFixed(3)} s of CPU while reading 3 MiB of hostile part heads`);
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

/** One keep-alive connection: writes with backpressure, reads content-length answers in order. */
class KeepAlive {
  private readonly sock: Socket;
  private data = Buffer.alloc(0);
  private wake: (() => void) | null = null;
  closed = false;

  constructor(on: DataPlane) {
    this.sock = connect(Number(on.address.split(':')[1]), '127.0.0.1');
    this.sock.on('data', (c: Buffer) => {
      this.data = Buffer.concat([this.data, c]);
      this.wake?.();
    });
    this.sock.on('error', () => {});
    this.sock.on('close', () => {
      this.closed = true;
      this.wake?.();
    });
  }

  /** Writes everything, waiting for 'drain'; false if the connection closed meanwhile. */
  async write(bytes: Buffer | string): Promise<boolean> {
    const buf = typeof bytes === 'string' ? Buffer.from(bytes) : bytes;
    for (let at = 0; at < buf.length; at += 256 * KIB) {
      if (this.closed) return false;
      if (!this.sock.write(buf.subarray(at, at + 256 * KIB))) {
        await new Promise<void>((resolve) => {
          const done = () => {
            this.sock.off('drain', done);
            this.sock.off('close', done);
            resolve();
          };
          this.sock.on('drain', done);
          this.sock.on('close', done);
        });
      }
    }
    return !this.closed;
  }

  /** The next whole answer: its status, headers (lower-cased names) and body text. */
  async next(): Promise<{ status: number; headers: Map<string, string>; text: string }> {
    for (;;) {
      const end = this.data.indexOf('\r\n\r\n');
      if (end !== -1) {
        const head = this.data.subarray(0, end).toString('latin1').split('\r\n');
        const headers = new Map(head.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()] as [string, string]));
        const len = Number(headers.get('content-length') ?? 0);
        if (this.data.length >= end + 4 + len) {
          const text = this.data.subarray(end + 4, end + 4 + len).toString('utf8');
          this.data = this.data.subarray(end + 4 + len);
          return { status: Number(head[0].split(' ')[1]), headers, text };
        }
      }
      if (this.closed) throw new Error(`the node closed the connection; unread: ${JSON.stringify(this.data.toString('latin1').slice(0, 200))}`);
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }

  /** The next answer's head only (the answer to a HEAD request has no body whatever it says). */
  async nextHead(): Promise<{ status: number; headers: Map<string, string> }> {
    for (;;) {
      const end = this.data.indexOf('\r\n\r\n');
      if (end !== -1) {
        const head = this.data.subarray(0, end).toString('latin1').split('\r\n');
        this.data = this.data.subarray(end + 4);
        const headers = new Map(head.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()] as [string, string]));
        return { status: Number(head[0].split(' ')[1]), headers };
      }
      if (this.closed) throw new Error(`the node closed the connection; unread: ${JSON.stringify(this.data.toString('latin1').slice(0, 300))}`);
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }

  close(): void {
    this.sock.destroy();
  }
}

const chatHead = (key: string, length: number) =>
  `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;

/** A chat body of `bytes`, large in bytes and small in tokens. */
function bigChat(bytes: number): string {
  const shell = JSON.stringify({ model: 'demo-chat', messages: [{ role: 'user', content: 'hi' }], user: '' });
  return shell.replace('"user":""', `"user":"${'y'.repeat(bytes - shell.length)}"`);
}

test('an early 413 reaches a client still writing its body, and the connection serves its next request', async () => {
  // Before the fix the node closed the connection right after answering, while the client was still
  // writing: the client's writes failed (EPIPE) and it could not count on reading the answer.
  const { key } = await keyOf('paid');
  const conn = new KeepAlive(node);
  const length = 33 * MIB; // over the 32 MiB cap of the path
  assert.ok(await conn.write(chatHead(key, length)));
  const answer = await conn.next();
  assert.equal(answer.status, 413);
  assert.equal(JSON.parse(answer.text).error.code, '413');
  assert.ok(await conn.write(Buffer.alloc(length, 0x20)), 'the node still reads the refused body');
  assert.ok(await conn.write(`GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`));
  const models = await conn.next();
  assert.equal(models.status, 200);
  conn.close();
});

test('a 503 refusal of a body that does not fit reaches fetch, the openai client and a raw client whole, with retry-after', async (t) => {
  // Before the fix the 503 closed the connection under the client's writes: fetch failed now and then
  // with "write EPIPE" instead of reading the 503 (test "one organisation holding slow bodies …").
  const small = await startDataPlane(cp, { extraArgs: ['--max-buffered-body-mib', '8'] });
  t.after(() => small.proc.kill('SIGKILL'));
  const { key } = await keyOf('paid', small);
  // 3 MiB: more than one organisation's share (a quarter of 8 MiB).
  const body = bigChat(3 * MIB);
  for (let i = 0; i < 5; i++) {
    const r = await fetch(`${small.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body });
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal((await r.json()).error.code, '503');
  }
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: key, baseURL: `${small.url}/v1`, maxRetries: 0 });
  await assert.rejects(
    client.chat.completions.create({ model: 'demo-chat', messages: [{ role: 'user', content: 'hi' }], user: 'y'.repeat(3 * MIB) }),
    (err: any) => err.status === 503 && err.headers.get('retry-after') === '1' && err.error?.code === '503',
  );
  const conn = new KeepAlive(small);
  assert.ok(await conn.write(chatHead(key, Buffer.byteLength(body))));
  assert.ok(await conn.write(body), 'the node reads the rest of the refused body');
  const refused = await conn.next();
  assert.equal(refused.status, 503);
  assert.equal(refused.headers.get('retry-after'), '1');
  const ok = bigChat(64 * KIB);
  assert.ok(await conn.write(chatHead(key, Buffer.byteLength(ok)) + ok));
  assert.equal((await conn.next()).status, 200);
  conn.close();
});

/** A node with an 8 MiB body budget: an organisation's share, and an account's, is 2 MiB. */
async function smallNode(t: { after(fn: () => void): void }, extraArgs: string[] = []): Promise<DataPlane> {
  const small = await startDataPlane(cp, { adminListen: true, extraArgs: ['--max-buffered-body-mib', '8', ...extraArgs] });
  t.after(() => small.proc.kill('SIGKILL'));
  return small;
}

async function bufferedBytes(on: DataPlane): Promise<number> {
  return (await scrapeMetrics(`${on.adminUrl}/metrics`)).value('tollgate_node_body_buffered_bytes')!;
}

/** A raw client that declares `length` bytes of chat body and sends `sent` of them. */
function trickle(on: DataPlane, key: string, length: number, sent: number) {
  const body = bigChat(length);
  const conn = new KeepAlive(on);
  void conn.write(chatHead(key, length) + body.slice(0, sent));
  return { conn, rest: () => conn.write(body.slice(sent)) };
}

function chatOf(on: DataPlane, key: string, bytes: number, model = 'demo-chat', signal?: AbortSignal) {
  const body = bigChat(bytes).replace('"demo-chat"', JSON.stringify(model));
  return fetch(`${on.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(key), 'content-type': 'application/json' }, body, signal });
}

test('a trickled body holds only the bytes it sent, not the length it declares', async (t) => {
  // Before the fix each body took its whole Content-Length from the budget before a byte arrived: four
  // slow 2 MiB bodies that had sent 1,000 bytes each spent the organisation's share, and its other
  // requests got 503 while the attacker had sent almost nothing.
  const small = await smallNode(t);
  const { key } = await keyOf('paid', small);
  const slow = [0, 1, 2, 3].map(() => trickle(small, key, 2 * MIB, 1000));
  await eventually(async () => (await bufferedBytes(small)) >= 4000, 'the node to hold the slow bodies');
  const r = await chatOf(small, key, 1 * MIB);
  assert.equal(r.status, 200, await r.text());
  for (const s of slow) s.conn.close();
  await eventually(async () => (await bufferedBytes(small)) === 0, 'the budget to be given back');
});

test('a body below the minimum rate after its grace gets 408 and gives its budget back', async (t) => {
  // Before the fix nothing bounded how long a trickled body could hold its budget, slot and connection.
  const small = await smallNode(t, ['--body-grace-seconds', '1', '--body-min-rate-kib', '16']);
  const { key } = await keyOf('paid', small);
  const slow = trickle(small, key, 64 * KIB, 100);
  let timer: NodeJS.Timeout | undefined;
  const answer = await Promise.race([slow.conn.next(), new Promise<null>((resolve) => (timer = setTimeout(resolve, 8000, null)))]);
  clearTimeout(timer);
  assert.ok(answer, 'the node answered the slow body');
  assert.equal(answer.status, 408);
  const err = JSON.parse(answer.text).error;
  assert.equal(err.code, '408');
  assert.equal(err.type, 'invalid_request_error');
  await eventually(async () => slow.conn.closed, 'the node to close the slow connection');
  assert.equal(await bufferedBytes(small), 0);
  const r = await chatOf(small, key, 64 * KIB);
  assert.equal(r.status, 200);
});

test("one account's organisations together hold at most one share of the body budget", async (t) => {
  // Before the fix each organisation had its own quarter: one account creating four organisations
  // could hold the whole budget.
  const small = await smallNode(t);
  const acct = (await admin.createAccount({ name: 'many-orgs' })).account!.id;
  const keys: string[] = [];
  for (let i = 0; i < 2; i++) {
    const org = await admin.createOrg({ name: `org-${i}`, ownerAccountId: acct, tier: 'paid' });
    await admin.creditOrg({ orgId: org.id, amountMicros: 10_000_000, note: 'test' });
    const k = await gw.fundedKey({ orgId: org.id, knownOn: [small] });
    keys.push(k.key);
  }
  const slow = trickle(small, keys[0], 1536 * KIB + 1000, 1536 * KIB);
  await eventually(async () => (await bufferedBytes(small)) >= 1536 * KIB, 'the node to hold the slow body');
  const refused = await chatOf(small, keys[1], 1 * MIB);
  assert.equal(refused.status, 503);
  assert.equal(refused.headers.get('retry-after'), '1');
  assert.match((await refused.json()).error.message, /account/);
  const { key: stranger } = await keyOf('paid', small);
  const served = await chatOf(small, stranger, 1 * MIB);
  assert.equal(served.status, 200);
  slow.conn.close();
});

test('a body forwarded upstream holds its budget until the request ends', async (t) => {
  // Before the fix the budget was given back once the body was parsed, while the body was still held
  // for forwarding: with a 16 MiB budget the node's memory grew by 57 MiB.
  const small = await smallNode(t);
  const { key } = await keyOf('paid', small);
  up.setMode('stall');
  t.after(() => up.setMode('normal'));
  const before = up.requests.length;
  const abort = new AbortController();
  const held = chatOf(small, key, 1536 * KIB, 'up-chat', abort.signal).catch(() => null);
  await up.waitForRequests(before + 1);
  assert.ok((await bufferedBytes(small)) >= 1500 * KIB, 'the forwarded body is still counted');
  const second = chatOf(small, key, 1536 * KIB, 'up-chat');
  const outcome = await Promise.race([second.then((r) => r.status), up.waitForRequests(before + 2).then(() => 'forwarded')]);
  assert.equal(outcome, 503, "the organisation's share is held by the body in flight");
  abort.abort();
  await held;
  await eventually(async () => (await bufferedBytes(small)) === 0, 'the budget to be given back when the request ended');
});

/** A transcription upload whose `file` part (`fileBytes`) comes before its model field. */
function fileUpload(fileBytes: number): Buffer {
  return Buffer.concat([
    Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n`),
    Buffer.alloc(fileBytes, 0x41),
    Buffer.from(`\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\nup-transcribe\r\n--${BOUNDARY}--\r\n`),
  ]);
}

test("upload spills are bounded node-wide and per organisation: past its share, 503 with retry-after", async (t) => {
  // Before the fix nothing bounded what uploads put in TMPDIR: five held 20 MiB uploads left 101 MB
  // there, and one key could hold 100 uploads of up to 200 MiB each.
  const small = await startDataPlane(cp, { adminListen: true, extraArgs: ['--max-spill-mib', '8'] });
  t.after(() => small.proc.kill('SIGKILL'));
  const m = await scrapeMetrics(`${small.adminUrl}/metrics`);
  assert.equal(m.value('tollgate_node_upload_spill_limit_bytes'), 8 * MIB);
  const { key } = await keyOf('paid', small);
  // Past its first MiB an upload goes to disk, where an organisation may hold a quarter of the 8 MiB.
  const refused = await upload(key, fileUpload(3 * MIB), small);
  assert.equal(refused.status, 503);
  assert.equal(refused.headers.get('retry-after'), '1');
  const err = (await refused.json()).error;
  assert.equal(err.code, '503');
  assert.match(err.message, /organisation/);
  const served = await upload(key, fileUpload(1536 * KIB), small);
  assert.equal(served.status, 200, await served.text());
  await eventually(async () => (await scrapeMetrics(`${small.adminUrl}/metrics`)).value('tollgate_node_upload_spill_bytes') === 0, 'the spill budget to be given back');
});

test("HEAD on a tool path answers the backend's head: its length, no body, and the connection goes on", async () => {
  // Before the fix the node ended a HEAD answer as an empty body: `Content-Length: 0` whatever the
  // backend said.
  const { key } = await keyOf('paid');
  const get = await fetch(`${node.url}/v1/files/file-1`, { headers: bearer(key) });
  const length = (await get.text()).length;
  assert.equal(get.headers.get('content-length'), String(length));
  const conn = new KeepAlive(node);
  await conn.write(`HEAD /v1/files/file-1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`);
  // A HEAD answer has no body: read its head alone, then the next answer on the same connection.
  const head = await conn.nextHead();
  assert.equal(head.status, 200);
  assert.equal(head.headers.get('content-length'), String(length));
  assert.equal(head.headers.get('content-type'), 'application/json');
  await conn.write(`GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`);
  assert.equal((await conn.next()).status, 200, 'the next answer follows the head at once: no body was sent');
  conn.close();
});
