// A client that goes away in the middle of an upload to a tool backend: the backend never sees a
// complete request (its upload ends in an error, never in a clean end), whether the body was chunked
// or had a Content-Length, and the node keeps serving.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { eventually } from '../helpers/data-plane.js';
import { startToolGateway } from '../helpers/tool-gateway.js';
import { stopAll, type DataPlane } from '../helpers/processes.js';

interface Upload {
  bytes: number;
  outcome: 'open' | 'complete' | 'broken';
}

let node: DataPlane;
let key: string;
let backend: Server;
const uploads: Upload[] = [];

before(async () => {
  backend = createServer((req, res) => {
    const u: Upload = { bytes: 0, outcome: 'open' };
    uploads.push(u);
    req.on('data', (c: Buffer) => (u.bytes += c.length));
    req.on('end', () => {
      u.outcome = 'complete';
      res.end('{"ok":true}');
    });
    req.on('error', () => (u.outcome = u.outcome === 'open' ? 'broken' : u.outcome));
    req.on('close', () => (u.outcome = u.outcome === 'open' ? 'broken' : u.outcome));
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const port = (backend.address() as net.AddressInfo).port;
  ({ node, key } = await startToolGateway([{ prefix: '/v1/files', base_url: `http://127.0.0.1:${port}`, timeout_ms: 10_000 }]));
});
after(async () => {
  await stopAll();
  backend?.close();
});

async function abortMidUpload(framing: 'chunked' | 'length'): Promise<Upload> {
  const before = uploads.length;
  const [host, port] = [node.address.slice(0, node.address.lastIndexOf(':')), Number(node.address.slice(node.address.lastIndexOf(':') + 1))];
  const sock = net.connect({ host, port });
  sock.on('error', () => {});
  await new Promise<void>((r) => sock.once('connect', () => r()));
  const part = Buffer.alloc(256 * 1024, 0x61);
  const framingHeader = framing === 'chunked' ? 'Transfer-Encoding: chunked' : `Content-Length: ${10 * part.length}`;
  sock.write(`POST /v1/files/upload HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer ${key}\r\n${framingHeader}\r\n\r\n`);
  for (let i = 0; i < 3; i++) sock.write(framing === 'chunked' ? Buffer.concat([Buffer.from(`${part.length.toString(16)}\r\n`), part, Buffer.from('\r\n')]) : part);
  await eventually(async () => uploads.length > before && uploads[before].bytes > 0, 'the upload reached the backend');
  sock.destroy();
  const u = uploads[before];
  await eventually(async () => u.outcome !== 'open', 'the backend saw the upload end');
  return u;
}

test('a client that disconnects mid-upload: the backend sees a broken upload, never a complete one', async () => {
  for (const framing of ['chunked', 'length'] as const) {
    const u = await abortMidUpload(framing);
    assert.equal(u.outcome, 'broken', `${framing}: the backend got ${u.bytes} bytes and a clean end`);
  }
  // The node still serves.
  const res = await fetch(`${node.url}/v1/files/upload`, { method: 'POST', headers: { authorization: `Bearer ${key}` }, body: 'whole' });
  assert.equal(res.status, 200);
  assert.equal(uploads.at(-1)?.outcome, 'complete');
});
