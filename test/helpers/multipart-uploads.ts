// Multipart transcription uploads written by hand, for tests of how a node reads them: a raw
// keep-alive connection spoken to byte by byte, and uploads as the openai SDK sends them (the file part
// first, then `model`), written with backpressure, whole or piece by piece.
import assert from 'node:assert/strict';
import { request as httpRequest, type ClientRequest } from 'node:http';
import { connect, type Socket } from 'node:net';
import { bearer } from './http.js';
import type { DataPlane } from './processes.js';
import { quiesce, rssBytes, sampleRss } from './process-usage.js';

const KIB = 1024;
const MIB = 1024 * KIB;
export const PATH = '/v1/audio/transcriptions';

export interface RawResponse {
  status: number;
  body: any;
}

/** One keep-alive connection spoken to byte by byte: writes with backpressure, reads content-length responses. */
export class RawConnection {
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

// Multipart uploads as the openai SDK sends them: the file part first, then `model`.
export const BOUNDARY = '----tollgate-test-boundary-7MA4YWxkTrZu0gW';
const FILE_CHUNK = Buffer.alloc(64 * KIB, 'RIFF-audio-bytes');

export function fileHead(): string {
  return `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n`;
}

export function field(name: string, value: string): string {
  return `\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}`;
}

const CLOSING = `\r\n--${BOUNDARY}--\r\n`;

export interface UploadPlan {
  fileBytes: number;
  model: string;
  /** Chunked transfer encoding instead of a content-length. */
  chunked?: boolean;
}

export function uploadBytes(p: UploadPlan): number {
  return Buffer.byteLength(fileHead()) + p.fileBytes + Buffer.byteLength(field('model', p.model)) + Buffer.byteLength(CLOSING);
}

export interface OpenUpload {
  req: ClientRequest;
  response: Promise<RawResponse>;
  write(bytes: Buffer | string): Promise<void>;
  /** Writes `n` bytes of file content; `onProgress` runs between writes with the bytes written so far. */
  writeFile(n: number, onProgress?: (sent: number) => Promise<void> | void): Promise<void>;
}

/** Starts an upload to the node at `baseUrl`; the test writes its parts. */
export function openUpload(baseUrl: string, key: string, contentLength: number | null): OpenUpload {
  const headers: Record<string, string> = { ...bearer(key), 'content-type': `multipart/form-data; boundary=${BOUNDARY}` };
  if (contentLength !== null) headers['content-length'] = String(contentLength);
  const req = httpRequest(`${baseUrl}${PATH}`, { method: 'POST', headers, agent: false });
  const response = new Promise<RawResponse>((resolve, reject) => {
    req.on('error', reject);
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(parts).toString('utf8');
        let body: any;
        try {
          body = JSON.parse(text);
        } catch {
          body = text;
        }
        resolve({ status: res.statusCode ?? 0, body });
      });
    });
  });
  response.catch(() => {});
  const write = (bytes: Buffer | string) =>
    new Promise<void>((resolve) => {
      if (req.destroyed || req.write(bytes)) return resolve();
      const done = () => {
        req.off('drain', done);
        req.off('close', done);
        resolve();
      };
      req.on('drain', done);
      req.on('close', done);
    });
  const writeFile = async (n: number, onProgress?: (sent: number) => Promise<void> | void) => {
    let sent = 0;
    while (sent < n && !req.destroyed) {
      const piece = FILE_CHUNK.subarray(0, Math.min(FILE_CHUNK.length, n - sent));
      await write(piece);
      sent += piece.length;
      if (onProgress) await onProgress(sent);
    }
  };
  return { req, response, write, writeFile };
}

/** Sends a whole upload, file first; returns the node's answer. */
export async function upload(baseUrl: string, key: string, p: UploadPlan): Promise<RawResponse> {
  const u = openUpload(baseUrl, key, p.chunked ? null : uploadBytes(p));
  await u.write(fileHead());
  await u.writeFile(p.fileBytes);
  await u.write(field('model', p.model));
  u.req.end(CLOSING);
  return u.response;
}

/**
 * Warms up the path with a small upload, then runs `p` while sampling the node's RSS; returns the
 * answer and the peak's growth over the baseline taken between the two.
 */
export async function measuredUpload(dp: DataPlane, key: string, p: UploadPlan): Promise<{ res: RawResponse; growthBytes: number }> {
  const pid = dp.proc.child.pid!;
  assert.equal((await upload(dp.url, key, { ...p, fileBytes: 2 * MIB })).status, 200, 'warm-up');
  await quiesce(pid);
  const baseline = rssBytes(pid);
  const sampler = sampleRss(pid);
  const res = await upload(dp.url, key, p);
  const peak = await sampler.stop();
  return { res, growthBytes: peak - baseline };
}
