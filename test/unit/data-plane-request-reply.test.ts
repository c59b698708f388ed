// Reply against a scripted uWS HttpResponse: the lifetime rules, and the drain callback of a known-length
// answer whose last bytes go out inside onWritable.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { HttpResponse } from 'uWebSockets.js';
import { openReplies, Reply } from '../../data-plane/request/reply.js';

/** A fake HttpResponse whose tryEnd answers are scripted: [ok, finished] per call. */
class FakeRes {
  tryEndAnswers: Array<[boolean, boolean]> = [];
  written = 0;
  offset = 0;
  writable: ((offset: number) => boolean) | null = null;
  aborted: (() => void) | null = null;
  ended = false;
  cork(fn: () => void) {
    fn();
    return this;
  }
  writeStatus() {
    return this;
  }
  writeHeader() {
    return this;
  }
  getWriteOffset() {
    return this.offset;
  }
  tryEnd(data: Uint8Array, total: number): [boolean, boolean] {
    const [ok, finished] = this.tryEndAnswers.shift() ?? [true, false];
    // What uWS took: everything when ok, nothing otherwise (the simplest honest script).
    if (ok) this.offset += data.length;
    if (finished) this.ended = this.offset >= total || true;
    return [ok, finished];
  }
  onWritable(cb: (offset: number) => boolean) {
    this.writable = cb;
    return this;
  }
  onAborted(cb: () => void) {
    this.aborted = cb;
    return this;
  }
  write() {
    return true;
  }
  end() {
    this.ended = true;
    return this;
  }
  close() {
    this.aborted?.();
    return this;
  }
  pause() {}
  resume() {}
}

test('a known-length answer that finishes inside onWritable still calls the drain callback', () => {
  // Before the fix, the producer (a paused upstream) waited for a drain that never came, so the
  // request was never completed by its provider and was recorded as a 500 with cost 0.
  const fake = new FakeRes();
  const reply = new Reply(fake as unknown as HttpResponse);
  let finished = 0;
  reply.onFinish(() => finished++);
  reply.startStream(200, [['content-type', 'audio/mpeg']], 10);
  fake.tryEndAnswers.push([true, false], [false, false]);
  assert.equal(reply.write(Buffer.alloc(4)), true);
  assert.equal(reply.write(Buffer.alloc(6)), false, 'backpressure: the producer pauses');
  let drained = 0;
  reply.onDrain(() => drained++);
  fake.tryEndAnswers.push([true, true]);
  assert.equal(fake.writable!(fake.offset), true);
  assert.equal(finished, 1, 'the response finished');
  assert.equal(drained, 1, 'the paused producer is resumed so it can end');
  assert.equal(reply.done, true);
});

test('after an abort nothing touches the response and cleanups run once', () => {
  const fake = new FakeRes();
  const reply = new Reply(fake as unknown as HttpResponse);
  let cleanups = 0;
  reply.onFinish((aborted) => {
    assert.equal(aborted, true);
    cleanups++;
  });
  fake.aborted!();
  fake.cork = () => {
    throw new Error('touched after abort');
  };
  reply.send(200, null, 'x');
  reply.sendError(new Error('x'));
  assert.equal(reply.write('x'), false);
  reply.end();
  reply.close();
  assert.equal(cleanups, 1);
  // A cleanup registered after the end runs at once.
  reply.onFinish(() => cleanups++);
  assert.equal(cleanups, 2);
});

test('endEarly ends an event stream with a last chunk and runs the cleanups as an abort', () => {
  const res = new FakeRes();
  const chunks: string[] = [];
  res.end = function (this: FakeRes, chunk?: unknown) {
    chunks.push(String(chunk ?? ''));
    this.ended = true;
    return this;
  } as FakeRes['end'];
  const reply = new Reply(res as unknown as HttpResponse);
  const seen: boolean[] = [];
  reply.onFinish((aborted) => seen.push(aborted));
  reply.startStream(200, [['Content-Type', 'text/event-stream; charset=utf-8']]);
  assert.equal(reply.isEventStream, true);
  reply.write('data: {"x":1}\n\n');
  reply.endEarly('data: {"error":{}}\n\n');
  assert.deepEqual(chunks, ['data: {"error":{}}\n\n']);
  assert.equal(reply.done, true);
  assert.deepEqual(seen, [true], 'cleanups ran once, as an abort (the upstream is stopped)');
  reply.endEarly('again');
  assert.equal(chunks.length, 1, 'a finished reply is never touched again');
});

test('isEventStream is false for other streams and for known-length answers', () => {
  const json = new Reply(new FakeRes() as unknown as HttpResponse);
  json.startStream(200, [['content-type', 'application/octet-stream']]);
  assert.equal(json.isEventStream, false);
  const sized = new Reply(new FakeRes() as unknown as HttpResponse);
  sized.startStream(200, [['content-type', 'text/event-stream']], 10);
  assert.equal(sized.isEventStream, false);
  assert.equal(new Reply(new FakeRes() as unknown as HttpResponse).isEventStream, false);
});

test('an upgraded reply is no longer counted as an open response', () => {
  // Before the fix markUpgraded left the Reply in the set of open responses for good, so a drain
  // after N realtime sessions waited for N responses that could never end.
  const before = openReplies();
  const reply = new Reply(new FakeRes() as unknown as HttpResponse);
  assert.equal(openReplies(), before + 1);
  reply.markUpgraded();
  assert.equal(openReplies(), before);
  assert.equal(reply.done, true);
});
