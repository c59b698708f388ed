// 256 MiB through `/v1/files` in each direction keeps the node's memory flat: the request body streams
// to the backend as it arrives and the response streams back with backpressure. A client that stops
// reading makes the node stop reading the backend, not buffer the download. Memory is the node
// process's peak resident set (VmHWM in /proc), compared with its peak before the transfer.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { startFastApiBackend, type FastApiBackend } from '../helpers/fastapi-backend.js';
import { startToolGateway } from '../helpers/tool-gateway.js';
import { stopAll, type DataPlane } from '../helpers/processes.js';

const MIB = 1024 * 1024;
const SIZE = 256 * MIB;
/**
 * "Well below the body size": under 3/8 of it. Copies of chunks that already went on are garbage until
 * V8 collects them, which its external-memory pressure does after some tens of MiB, so a streaming
 * node's peak can rise by that much on a loaded machine without holding anything.
 */
const MAX_GROWTH = 96 * MIB;

/**
 * What the kernel alone may hold between a backend and a client that reads nothing: the send and
 * receive buffers of both hops, at their autotuning maxima (tcp_wmem / tcp_rmem), plus some slack.
 */
function kernelBufferBytes(): number {
  const max = (f: string) => Number(readFileSync(`/proc/sys/net/ipv4/${f}`, 'utf8').trim().split(/\s+/)[2]);
  return 2 * (max('tcp_rmem') + max('tcp_wmem')) + 16 * MIB;
}

let backend: FastApiBackend;
let node: DataPlane;
let key: string;

before(async () => {
  backend = await startFastApiBackend();
  ({ node, key } = await startToolGateway([{ prefix: '/v1/files', base_urls: [backend.baseUrl], idle_timeout_ms: 60_000, header_timeout_ms: 120_000 }]));
  // Warm up both directions, so the baseline includes what any transfer allocates once.
  await upload(8 * MIB);
  await download(8 * MIB);
});
after(async () => {
  await stopAll();
  await backend?.close();
});

function memoryKiB(field: 'VmHWM' | 'VmRSS'): number {
  const status = readFileSync(`/proc/${node.proc.child.pid}/status`, 'utf8');
  return Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)![1]);
}
const peakBytes = () => memoryKiB('VmHWM') * 1024;

function target(): { host: string; port: number } {
  const u = new URL(node.url);
  return { host: u.hostname, port: Number(u.port) };
}

/** Uploads `size` bytes written as fast as the node takes them; resolves with the backend's answer and our hash. */
function upload(size: number): Promise<{ status: number; body: any; sha256: string }> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha256');
    const req = httpRequest({ ...target(), method: 'POST', path: '/v1/files/upload', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/octet-stream', 'content-length': size } }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text), sha256: hash.digest('hex') }));
    });
    req.on('error', reject);
    const chunk = Buffer.alloc(MIB);
    let sent = 0;
    const pump = () => {
      while (sent < size) {
        const n = Math.min(chunk.length, size - sent);
        // Bytes vary, so a reordered or repeated chunk would change the hash.
        chunk.fill(sent / MIB & 0xff);
        const part = chunk.subarray(0, n);
        hash.update(part);
        sent += n;
        if (!req.write(Buffer.from(part))) return void req.once('drain', pump);
      }
      req.end();
    };
    pump();
  });
}

function download(size: number): Promise<{ status: number; bytes: number }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ ...target(), method: 'GET', path: `/v1/files/file-1/content?bytes=${size}`, headers: { authorization: `Bearer ${key}` } }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

test('a 256 MiB upload streams to the backend whole, and the node peak memory grows far less than the body', { timeout: 180_000 }, async (t) => {
  const before = peakBytes();
  const r = await upload(SIZE);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.bytes, SIZE);
  assert.equal(r.body.sha256, r.sha256, 'the backend got the bytes we sent, in order');
  const growth = peakBytes() - before;
  t.diagnostic(`node peak memory growth: ${(growth / MIB).toFixed(1)} MiB`);
  assert.ok(growth < MAX_GROWTH, `node peak memory grew by ${(growth / MIB).toFixed(1)} MiB for a 256 MiB upload`);
});

test('a 256 MiB download streams to the client whole, and the node peak memory grows far less than the body', { timeout: 180_000 }, async (t) => {
  const before = peakBytes();
  const r = await download(SIZE);
  assert.equal(r.status, 200);
  assert.equal(r.bytes, SIZE);
  const growth = peakBytes() - before;
  t.diagnostic(`node peak memory growth: ${(growth / MIB).toFixed(1)} MiB`);
  assert.ok(growth < MAX_GROWTH, `node peak memory grew by ${(growth / MIB).toFixed(1)} MiB for a 256 MiB download`);
});

test('a client that stops reading makes the node stop reading the backend instead of buffering the download', { timeout: 180_000 }, async (t) => {
  const before = peakBytes();
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    const req = httpRequest({ ...target(), method: 'GET', path: `/v1/files/file-2/content?bytes=${SIZE}`, headers: { authorization: `Bearer ${key}` } }, resolve);
    req.on('error', reject);
    req.end();
  });
  assert.equal(res.statusCode, 200);
  res.pause();
  // Wait until the backend is blocked: what it wrote stops growing (sampled until steady, bounded).
  let last = -1;
  let steady = 0;
  for (let i = 0; i < 200 && steady < 5; i++) {
    await sleep(100);
    steady = backend.downloadWritten === last ? steady + 1 : 0;
    last = backend.downloadWritten;
  }
  assert.equal(steady, 5, 'the backend stopped being read');
  // The backend is held back: it wrote no more than the sockets' kernel buffers hold (far from all of it).
  const kernel = Math.min(kernelBufferBytes(), SIZE / 2);
  t.diagnostic(`the backend wrote ${(backend.downloadWritten / MIB).toFixed(1)} MiB; kernel buffers may hold ${(kernel / MIB).toFixed(0)} MiB`);
  assert.ok(backend.downloadWritten <= kernel, `the backend could write ${(backend.downloadWritten / MIB).toFixed(1)} MiB while the client read nothing`);
  const growth = peakBytes() - before;
  t.diagnostic(`node peak memory growth: ${(growth / MIB).toFixed(1)} MiB`);
  assert.ok(growth < MAX_GROWTH, `node peak memory grew by ${(growth / MIB).toFixed(1)} MiB while the client read nothing`);
  // Reading again, the rest arrives whole.
  let bytes = 0;
  await new Promise<void>((resolve, reject) => {
    res.on('data', (c: Buffer) => (bytes += c.length));
    res.on('end', resolve);
    res.on('error', reject);
    res.resume();
  });
  assert.equal(bytes, SIZE);
});
