// Large transcription uploads against a real node: the multipart scan costs CPU linear in the bytes
// received and leaves the node answering others.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { consoleClient, createKey, type Console } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer } from '../helpers/http.js';
import { startControlPlane, startDataPlane, stopAll, type DataPlane } from '../helpers/processes.js';

const KIB = 1024;
const MIB = 1024 * KIB;
const PATH = '/v1/audio/transcriptions';

let dp: DataPlane;
let c: Console;

before(async () => {
  const cp = await startControlPlane();
  dp = await startDataPlane(cp);
  c = consoleClient(cp.address, cp.secrets.operatorToken);
});
after(async () => {
  c.close();
  await stopAll();
});

async function newKey(allowedModels: string[] = []): Promise<string> {
  const k = await createKey(c, { allowedModels });
  await waitUntilKnown(dp.url, k.key);
  return k.key;
}

/** User plus system CPU seconds the process has used (/proc/PID/stat fields 14 and 15, in 1/100 s). */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

interface RawResponse {
  status: number;
  body: any;
}

/** One keep-alive connection spoken to byte by byte: writes with backpressure, reads content-length responses. */
class RawConnection {
  private readonly sock: Socket;
  private data = Buffer.alloc(0);
  private waiters: Array<() => void> = [];
  closed = false;

  constructor(hostPort: string) {
    const i = hostPort.lastIndexOf(':');
    this.sock = connect(Number(hostPort.slice(i + 1)), hostPort.slice(0, i));
    this.sock.setNoDelay(true);
    this.sock.on('data', (chunk: Buffer) => {
      this.data = Buffer.concat([this.data, chunk]);
      this.wake();
    });
    this.sock.on('error', () => {});
    this.sock.on('close', () => {
      this.closed = true;
      this.wake();
    });
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Resolves once the bytes are handed to the socket and it has room again; false if it closed. */
  write(bytes: Buffer | string): Promise<boolean> {
    if (this.closed) return Promise.resolve(false);
    if (this.sock.write(bytes)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = () => {
        this.sock.off('drain', done);
        this.sock.off('close', done);
        resolve(!this.closed);
      };
      this.sock.on('drain', done);
      this.sock.on('close', done);
    });
  }

  /** The next complete response (status line, headers, content-length body). */
  async nextResponse(timeoutMs = 20_000): Promise<RawResponse> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const headEnd = this.data.indexOf('\r\n\r\n');
      if (headEnd !== -1) {
        const head = this.data.subarray(0, headEnd).toString('latin1');
        const len = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (this.data.length >= headEnd + 4 + len) {
          const text = this.data.subarray(headEnd + 4, headEnd + 4 + len).toString('utf8');
          this.data = this.data.subarray(headEnd + 4 + len);
          let body: any;
          try {
            body = JSON.parse(text);
          } catch {
            body = text;
          }
          return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), body };
        }
      }
      if (this.closed) throw new Error(`connection closed before a complete response; got ${JSON.stringify(this.data.toString('latin1').slice(0, 300))}`);
      if (Date.now() > deadline) throw new Error(`no complete response within ${timeoutMs} ms; got ${JSON.stringify(this.data.toString('latin1').slice(0, 300))}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, deadline - Date.now());
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  close(): void {
    this.sock.destroy();
  }
}

test('a part header that never ends is refused at its cap, costs the node linear CPU, and others are served meanwhile', async () => {
  // Before the fix each chunk re-scanned the whole header from its start for CRLF CRLF: a 48 MiB header
  // sent in 8 KiB writes cost the node 3 s of CPU and stalled every other request on it.
  const key = await newKey();
  const total = 64 * MIB;
  const start = Buffer.from('--B\r\nX: ');
  const filler = Buffer.alloc(8 * KIB, 'a');
  const pid = dp.proc.child.pid!;

  const latenciesMs: number[] = [];
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const t0 = performance.now();
      const r = await fetch(`${dp.url}/v1/models`, { headers: bearer(key) });
      await r.arrayBuffer();
      const ms = performance.now() - t0;
      assert.equal(r.status, 200);
      latenciesMs.push(ms);
      await sleep(Math.max(0, 50 - ms));
    }
  })();

  const cpuBefore = cpuSeconds(pid);
  const conn = new RawConnection(dp.address);
  await conn.write(
    `POST ${PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n` +
      `Content-Type: multipart/form-data; boundary=B\r\nContent-Length: ${total}\r\n\r\n`,
  );
  let sent = 0;
  if (await conn.write(start)) sent += start.length;
  // Paced like a client on a real network (24 MiB/s, a few 8 KiB writes per millisecond): at loopback
  // speed the node's reads coalesce into 512 KiB, which hides a quadratic scan.
  const bytesPerMs = 24 * KIB;
  const t0 = performance.now();
  while (sent < total) {
    const due = Math.min(total, (performance.now() - t0) * bytesPerMs);
    while (sent < due) {
      const piece = filler.subarray(0, Math.min(filler.length, total - sent));
      if (!(await conn.write(piece))) break;
      sent += piece.length;
    }
    if (conn.closed) break;
    await sleep(1);
  }
  const refused = await conn.nextResponse();
  // A request after the body shows when the node has read all of it: uWS answers it, or closes a
  // connection whose previous request was answered before its body ended.
  await conn.write(`GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`);
  const next = await conn.nextResponse().catch((err: Error) => err);
  const cpu = cpuSeconds(pid) - cpuBefore;
  conn.close();
  polling = false;
  await poller;

  const sorted = [...latenciesMs].sort((a, b) => a - b);
  const p99 = sorted[Math.ceil(sorted.length * 0.99) - 1];
  console.log(`# 64 MiB header: node CPU ${cpu.toFixed(2)} s; /v1/models p99 ${p99?.toFixed(1)} ms over ${sorted.length} polls`);
  assert.ok(cpu < 1, `the node spent ${cpu.toFixed(2)} s of CPU on a 64 MiB body`);
  assert.ok(sorted.length > 0);
  assert.ok(p99 < 100, `GET /v1/models p99 ${p99.toFixed(1)} ms over ${sorted.length} polls`);
  assert.equal(refused.status, 400, JSON.stringify(refused.body));
  assert.equal(refused.body.error.type, 'invalid_request_error');
  assert.equal(refused.body.error.code, '400');
  assert.match(refused.body.error.message, /16384/);
  assert.equal(sent, total, 'the whole body was sent');
  if (!(next instanceof Error)) assert.equal(next.status, 200);
});
