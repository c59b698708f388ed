// The multipart model finder: the pure scanner as tables (every chunk split, refusals, linear work),
// then findModelField with an UploadSpill in a temporary directory.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { test } from 'node:test';
import type { GatewayError } from '../../data-plane/errors.js';
import {
  boundaryOf,
  findModelField,
  MAX_MODEL_VALUE_BYTES,
  MAX_PART_HEAD_BYTES,
  ModelFieldScanner,
  type ModelField,
  type ScanStep,
  type UploadBody,
} from '../../data-plane/proxy/multipart-model.js';
import { UploadSpill } from '../../data-plane/proxy/upload-spill.js';

const B = 'XyZ123';

/** A multipart body; `filename` makes a file part. */
function multipart(boundary: string, parts: Array<[name: string, value: string | Buffer, filename?: string]>, closing = true): Buffer {
  const out: Buffer[] = [];
  for (const [name, value, filename] of parts) {
    let head = `--${boundary}\r\nContent-Disposition: form-data; name="${name}"${filename ? `; filename="${filename}"` : ''}\r\n`;
    if (filename) head += 'Content-Type: application/octet-stream\r\n';
    out.push(Buffer.from(`${head}\r\n`), Buffer.from(value), Buffer.from('\r\n'));
  }
  if (closing) out.push(Buffer.from(`--${boundary}--\r\n`));
  return Buffer.concat(out);
}

interface Scanned {
  step: ScanStep;
  /** Bytes pushed until the scan ended (or all of them). */
  pushed: number;
  settled: Buffer[];
  /** The most bytes the scanner held at once (pushed and not handed on), after a push. */
  maxHeldBytes: number;
  examinedBytes: number;
}

function scan(chunks: Buffer[], boundary = B, limits?: ConstructorParameters<typeof ModelFieldScanner>[2], endWhenDone = true): Scanned {
  const settled: Buffer[] = [];
  let settledBytes = 0;
  const s = new ModelFieldScanner(
    boundary,
    (bytes) => {
      // Valid only during the call.
      settled.push(Buffer.from(bytes));
      settledBytes += bytes.length;
    },
    limits,
  );
  let pushed = 0;
  let maxHeldBytes = 0;
  for (const c of chunks) {
    pushed += c.length;
    const step = s.push(c);
    if (step.kind !== 'more') return { step, pushed, settled, maxHeldBytes, examinedBytes: s.examinedBytes };
    maxHeldBytes = Math.max(maxHeldBytes, pushed - settledBytes);
  }
  const step: ScanStep = endWhenDone ? { kind: 'refused', error: s.end() } : { kind: 'more' };
  return { step, pushed, settled, maxHeldBytes, examinedBytes: s.examinedBytes };
}

function chunked(body: Buffer, size: number): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < body.length; i += size) out.push(body.subarray(i, i + size));
  return out;
}

function assertFound(r: Scanned, body: Buffer, model: string, what: string): void {
  assert.equal(r.step.kind, 'found', `${what}: ${JSON.stringify(r.step)}`);
  const f = r.step as Extract<ScanStep, { kind: 'found' }>;
  assert.equal(f.model, model, what);
  assert.equal(f.head.subarray(f.valueStart, f.valueEnd).toString().trim(), model, `${what}: value located in head`);
  // Nothing lost, duplicated or reordered: what was handed on, then the head, is what was pushed.
  assert.ok(Buffer.concat([...r.settled, f.head]).equals(body.subarray(0, r.pushed)), `${what}: settled bytes + head = bytes pushed`);
}

function refusal(r: Scanned): GatewayError {
  assert.equal(r.step.kind, 'refused', JSON.stringify(r.step));
  return (r.step as Extract<ScanStep, { kind: 'refused' }>).error;
}

test('boundaryOf reads the boundary parameter of a multipart content type', () => {
  const table: Array<[string, string | null]> = [
    ['multipart/form-data; boundary=----abc', '----abc'],
    ['multipart/form-data; boundary="q r"', 'q r'],
    ['Multipart/Form-Data;boundary=x;charset=utf-8', 'x'],
    ['multipart/form-data', null],
    ['application/json', null],
  ];
  for (const [ct, b] of table) assert.equal(boundaryOf(ct), b, ct);
});

test('the model field is found wherever the body is split, with no byte lost or reordered', () => {
  // Near-boundaries in the file's content: not after a CRLF, or a CRLF and a prefix of the boundary.
  const content = `audio--${B} x\r\n--XyZ12 not a boundary\r\n-${B}\r\n\r\n${'a'.repeat(40)}`;
  const bodies: Array<[string, Buffer]> = [
    ['file then model', multipart(B, [['file', content, 'a.wav'], ['model', 'demo-transcribe'], ['language', 'en']])],
    ['model first', multipart(B, [['model', 'demo-transcribe'], ['file', content, 'a.wav']])],
    ['preamble and a part without headers', Buffer.from(`ignored preamble\r\n--${B}\r\n\r\nno headers\r\n--${B}\r\nContent-Disposition: form-data; name="model"\r\n\r\ndemo-transcribe\r\n--${B}--\r\n`)],
    ['padding after the delimiter', Buffer.from(`--${B}  \t\r\nContent-Disposition: form-data; name="model"\r\n\r\n demo-transcribe \r\n--${B}--`)],
  ];
  for (const [what, body] of bodies) {
    for (let i = 0; i <= body.length; i++) {
      assertFound(scan([body.subarray(0, i), body.subarray(i)]), body, 'demo-transcribe', `${what}, split at ${i}`);
    }
    for (let i = 0; i + 7 <= body.length; i += 3) {
      assertFound(scan([body.subarray(0, i), body.subarray(i, i + 7), body.subarray(i + 7)]), body, 'demo-transcribe', `${what}, 7 bytes at ${i}`);
    }
    assertFound(scan(chunked(body, 1)), body, 'demo-transcribe', `${what}, byte by byte`);
  }
  // Found early in a chunk larger than what is scanned at a time: the head carries the unscanned rest.
  const large = multipart(B, [['model', 'demo-transcribe'], ['file', Buffer.alloc(300_000, 'a'), 'a.wav']]);
  const r = scan([large]);
  assertFound(r, large, 'demo-transcribe', 'model first in one 300 kB chunk');
  assert.equal(r.pushed, large.length);
});

test('refusals: missing model, closing delimiter, part head and model value over their caps', () => {
  const model = (v: string) => multipart(B, [['file', 'x', 'a.wav'], ['model', v]]);
  // A part whose head (rest of the delimiter line, headers, blank line) is exactly `bytes` long.
  const headOf = (bytes: number) => {
    const fixed = `\r\nContent-Disposition: form-data; name="model"\r\nX-Pad: \r\n\r\n`;
    return Buffer.from(`--${B}\r\nContent-Disposition: form-data; name="model"\r\nX-Pad: ${'p'.repeat(bytes - fixed.length)}\r\n\r\ndemo-transcribe\r\n--${B}--\r\n`);
  };
  const table: Array<{ what: string; body: Buffer; end?: boolean; param?: string | null; message?: RegExp; beforeEnd?: boolean }> = [
    { what: 'no model field, closing delimiter', body: multipart(B, [['file', 'x', 'a.wav'], ['language', 'en']]), param: 'model', beforeEnd: true },
    { what: 'closing delimiter first', body: Buffer.from(`--${B}--\r\n`), param: 'model', beforeEnd: true },
    { what: 'body ends without a closing delimiter', body: multipart(B, [['file', 'x', 'a.wav']], false), param: 'model' },
    { what: 'empty body', body: Buffer.alloc(0), param: 'model' },
    { what: 'no delimiter at all', body: Buffer.from('model=demo-transcribe'), param: 'model' },
    { what: 'part head one byte over the cap', body: headOf(MAX_PART_HEAD_BYTES + 1), param: null, message: /16384 bytes/, beforeEnd: true },
    { what: 'part head that never ends', body: Buffer.concat([Buffer.from(`--${B}\r\nX: `), Buffer.alloc(64 * 1024, 'a')]), param: null, message: /headers are longer/, beforeEnd: true },
    { what: 'delimiter line that never ends', body: Buffer.concat([Buffer.from(`--${B}`), Buffer.alloc(64 * 1024, ' ')]), param: null, beforeEnd: true },
    { what: 'model value over its cap', body: model('m'.repeat(MAX_MODEL_VALUE_BYTES + 1)), param: 'model', message: /1024 bytes/, beforeEnd: true },
  ];
  for (const row of table) {
    for (const size of [1, 5, 4096, 1 << 20]) {
      const r = scan(chunked(row.body, size));
      const err = refusal(r);
      assert.equal(err.code, 'INVALID_REQUEST', row.what);
      assert.equal(err.param, row.param, row.what);
      if (row.message) assert.match(err.message, row.message, row.what);
      if (row.beforeEnd) assert.ok(r.step.kind === 'refused' && r.pushed <= row.body.length, `${row.what}: refused while pushing`);
    }
  }
  // Exactly at the caps is accepted.
  assertFound(scan(chunked(headOf(MAX_PART_HEAD_BYTES), 1000)), headOf(MAX_PART_HEAD_BYTES), 'demo-transcribe', 'part head at the cap');
  const longest = 'm'.repeat(MAX_MODEL_VALUE_BYTES);
  assertFound(scan(chunked(model(longest), 100)), model(longest), longest, 'model value at the cap');
  // A head that never ends is refused as soon as it passes the cap, not at the end of the body.
  const endless = Buffer.concat([Buffer.from(`--${B}\r\nX: `), Buffer.alloc(1 << 20, 'a')]);
  assert.ok(scan(chunked(endless, 8192)).pushed <= MAX_PART_HEAD_BYTES + 2 * 8192);
});

test('the scanner holds only what its searches still need; the file part is handed on as it arrives', () => {
  for (const [fileBytes, size] of [[64 * 1024, 1], [4 << 20, 8192], [4 << 20, 65536]]) {
    const body = multipart('----WebKitFormBoundary7MA4YWxkTrZu0gW', [['file', Buffer.alloc(fileBytes, 'RIFF-data '), 'a.wav'], ['model', 'demo-transcribe']]);
    const r = scan(chunked(body, size), '----WebKitFormBoundary7MA4YWxkTrZu0gW');
    assertFound(r, body, 'demo-transcribe', `chunks of ${size}`);
    // A delimiter's worth (or one part's head) and the chunk being scanned, never the file.
    assert.ok(r.maxHeldBytes <= MAX_PART_HEAD_BYTES + size, `chunks of ${size}: held up to ${r.maxHeldBytes} bytes`);
  }
});

test('the scan is linear: every search resumes where the last stopped', () => {
  const d = '----WebKitFormBoundary7MA4YWxkTrZu0gW';
  // Inputs that made a restarting search quadratic: each reaches its end without a match.
  const inputs: Array<[string, (n: number) => Buffer]> = [
    ['part head without its blank line', (n) => Buffer.concat([Buffer.from(`--${d}\r\nX: `), Buffer.alloc(n, 'a')])],
    ['header lines without a blank line', (n) => Buffer.concat([Buffer.from(`--${d}\r\n`), Buffer.alloc(n, 'X: a\r\n')])],
    ['file content of near-delimiters', (n) => Buffer.concat([Buffer.from(`--${d}\r\nContent-Disposition: form-data; name="file"\r\n\r\n`), Buffer.alloc(n, `\r\n--${d.slice(0, -1)}`)])],
    ['preamble without a delimiter', (n) => Buffer.alloc(n, `\r\n-`)],
  ];
  const MIB = 1 << 20;
  for (const [what, make] of inputs) {
    const work = (n: number, chunk: number) => {
      const body = make(n);
      const r = scan(chunked(body, chunk), d, { maxPartHeadBytes: Infinity }, false);
      assert.equal(r.step.kind, 'more', what);
      return r.examinedBytes / body.length;
    };
    // Bytes examined per byte of input: about one, and the same for 1 MiB as for 8 MiB.
    const small = work(MIB, 8192);
    const large = work(8 * MIB, 8192);
    assert.ok(large < 1.1, `${what}: ${large.toFixed(3)} bytes examined per byte at 8 MiB`);
    assert.ok(Math.abs(large - small) < 0.05, `${what}: ${small.toFixed(3)} at 1 MiB vs ${large.toFixed(3)} at 8 MiB`);
    // Byte by byte, at most a needle's length of re-examination per chunk.
    assert.ok(work(64 * 1024, 1) <= d.length + 5, `${what}: byte by byte`);
  }
});

/** A request body as BodyStream plays it, fed by the test: chunks go to a diverted sink or are pushed. */
class TestBody extends Readable implements UploadBody {
  held = false;
  private sink: ((chunk: Buffer, isLast: boolean) => void) | null = null;
  private ended = false;
  override _read(): void {}
  divert(sink: (chunk: Buffer, isLast: boolean) => void): void {
    this.sink = sink;
  }
  undivert(): void {
    if (!this.sink) return;
    this.sink = null;
    if (this.ended) this.push(null);
  }
  hold(): void {
    this.held = true;
  }
  release(): void {
    this.held = false;
  }
  /** Feeds chunks as a socket would, waiting while held; each chunk's bytes are overwritten after use. */
  async feed(chunks: Buffer[], last = true): Promise<void> {
    for (let i = 0; i < chunks.length && !this.destroyed; i++) {
      while (this.held) await sleep(1);
      const isLast = last && i === chunks.length - 1;
      // As uWS's buffer is: valid only during the call.
      const view = Buffer.from(chunks[i]);
      if (this.sink) {
        if (isLast) this.ended = true;
        this.sink(view, isLast);
        view.fill(0xee);
      } else {
        this.push(view);
        if (isLast) this.push(null);
      }
    }
  }
}

/** Runs findModelField over `body` in chunks through a spill in `dir`. */
function find(body: Buffer, dir: string, chunk = 65536): { spill: UploadSpill; result: Promise<{ err: unknown; field: ModelField | null }> } {
  const stream = new TestBody();
  const spill = new UploadSpill(dir, 1 << 20);
  const result = new Promise<{ err: unknown; field: ModelField | null }>((resolve) => findModelField(stream, B, spill, (err, field) => resolve({ err, field })));
  void stream.feed(chunked(body, chunk));
  return { spill, result };
}

async function readAll(r: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of r) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

async function emptied(dir: string): Promise<void> {
  const deadline = Date.now() + 5000;
  while (readdirSync(dir).length > 0) {
    if (Date.now() > deadline) throw new Error(`${dir} still holds ${readdirSync(dir).join(', ')}`);
    await sleep(10);
  }
}

test('an upload past the memory threshold spills the bytes before model to a file that reads back exactly', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-spill-unit-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = Buffer.alloc(3 << 20);
  for (let i = 0; i < file.length; i++) file[i] = (i * 7 + (i >> 10)) & 0xff;
  const body = multipart(B, [['file', file, 'a.wav'], ['model', 'demo-transcribe'], ['language', 'en']]);
  const { spill, result } = find(body, dir);
  const { err, field } = await result;
  assert.equal(err, null);
  assert.equal(field!.model, 'demo-transcribe');
  assert.ok(spill.spilled);
  assert.equal(readdirSync(dir).length, 1);
  assert.ok(spill.fileBytes > 2 << 20, 'the file part went to disk');
  assert.ok(field!.head.length < 128 * 1024, `head of ${field!.head.length} bytes`);
  assert.equal(field!.head.subarray(field!.modelValueStart, field!.modelValueEnd).toString(), 'demo-transcribe');
  const rest = await readAll(field!.rest);
  // Copies: the spill reuses its read buffers a few chunks later.
  const spilled: Buffer[] = [];
  for await (const chunk of spill.chunks()) spilled.push(Buffer.from(chunk));
  const whole = Buffer.concat([...spilled, field!.head, rest]);
  assert.ok(whole.equals(body), 'spilled bytes + head + rest = the body');
  assert.equal(field!.prefixBytes + rest.length, body.length);
  spill.remove();
  await emptied(dir);
});

test('a small upload stays in memory: no file is made', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-spill-unit-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const body = multipart(B, [['file', Buffer.alloc(500_000, 1), 'a.wav'], ['model', 'demo-transcribe']]);
  const { spill, result } = find(body, dir, 4096);
  const { field } = await result;
  assert.equal(spill.spilled, false);
  assert.equal(readdirSync(dir).length, 0);
  assert.ok(Buffer.concat([field!.head, await readAll(field!.rest)]).equals(body));
});

test('remove() while the spill is being written deletes the file, and the finder reports the body closing', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-spill-unit-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const stream = new TestBody();
  const spill = new UploadSpill(dir, 1 << 20);
  const result = new Promise<unknown>((resolve) => findModelField(stream, B, spill, (err) => resolve(err)));
  await stream.feed([Buffer.from(`--${B}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n`)], false);
  const chunk = Buffer.alloc(256 * 1024, 'a');
  for (let i = 0; i < 12 && readdirSync(dir).length === 0; i++) await stream.feed([chunk, chunk], false);
  assert.equal(readdirSync(dir).length, 1, 'spilling');
  // As the request's end does: the client went away.
  spill.remove();
  stream.destroy();
  assert.match(String((await result) as Error), /closed before its model field/);
  await emptied(dir);
});

test('a spill that cannot be written fails the upload with a 500, not a hang', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-spill-unit-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const body = multipart(B, [['file', Buffer.alloc(3 << 20, 1), 'a.wav'], ['model', 'demo-transcribe']]);
  // A directory that does not exist: opening the file fails.
  const { err } = await find(body, join(dir, 'missing')).result;
  assert.equal((err as GatewayError).code, 'INTERNAL');
  assert.equal(readdirSync(dir).length, 0);
});
