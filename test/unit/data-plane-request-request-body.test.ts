// BodyStream: chunks that arrived before the body was diverted to a sink (buffered while admission
// waited for a lease) reach the sink first, in order, and the socket paused meanwhile is read again.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { HttpResponse } from 'uWebSockets.js';
import { BodyStream } from '../../data-plane/request/request-body.js';
import type { Reply } from '../../data-plane/request/reply.js';

function fakes() {
  let onData: ((chunk: ArrayBuffer, isLast: boolean) => void) | null = null;
  const res = { onData: (cb: typeof onData) => void (onData = cb) } as unknown as HttpResponse;
  const reply = { done: false, paused: false, pause() { this.paused = true; }, resume() { this.paused = false; }, onFinish() {}, bodyArrived() {} };
  const send = (text: string, isLast = false) => {
    const b = Buffer.from(text);
    onData!(b.buffer.slice(b.byteOffset, b.byteOffset + b.length), isLast);
  };
  return { res, reply, send };
}

test('chunks buffered before divert reach the sink first, and the paused socket is read again', () => {
  // Before the fix, a transcription whose admission waited for a lease stalled: divert() left the
  // buffered chunks unread and the socket paused for good.
  const { res, reply, send } = fakes();
  const stream = new BodyStream(res, reply as unknown as Reply, 1 << 30);
  const early = Array.from({ length: 5 }, (_, i) => `${i}`.repeat(8 * 1024));
  for (const c of early) send(c);
  assert.equal(reply.paused, true, 'the Readable buffer filled and paused the socket');
  const got: Array<[string, boolean]> = [];
  stream.divert((chunk, isLast) => got.push([chunk.toString(), isLast]));
  assert.equal(reply.paused, false, 'the socket is read again');
  send('late', true);
  assert.equal(got.map(([c]) => c).join(''), early.join('') + 'late');
  assert.deepEqual(got.at(-1), ['late', true]);
});

test('a body that ended before divert is handed over whole, with its end', () => {
  const { res, reply, send } = fakes();
  const stream = new BodyStream(res, reply as unknown as Reply, 1 << 30);
  send('abc');
  send('def', true);
  const got: Array<[string, boolean]> = [];
  stream.divert((chunk, isLast) => got.push([chunk.toString(), isLast]));
  assert.equal(got.map(([c]) => c).join(''), 'abcdef');
  assert.equal(got.at(-1)![1], true);
  // Back to a Readable: it ends once, without a second end.
  stream.undivert();
});
