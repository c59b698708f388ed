// Transcriptions without an upstream `duration` are billed the length the uploaded file's container
// says (data-plane/proxy/audio-duration.ts, music-metadata), read from the multipart body as it is
// forwarded. Before the fix they were billed bytes / 32,000 seconds: a 30 s Ogg/Opus file of 3 KB
// was billed 1 s.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AudioDurationProbe, MIN_BYTES_PER_SECOND, PARSER_BACKLOG_BYTES, preloadAudioParsers, sniffFormat } from '../../data-plane/proxy/audio-duration.js';
import { flacFile, m4aFile, mp3File, oggOpusFile, wavFile, webmFile } from '../helpers/audio-files.js';

const BOUNDARY = '----tollgate-test-7MA4YWxkTrZu0gW';

/** A transcription upload's multipart body: model, the file, response_format (file first when asked). */
function multipart(file: Buffer, name = 'file', fileFirst = false): Buffer {
  const field = (n: string, v: string) => `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${n}"\r\n\r\n${v}\r\n`;
  const filePart = Buffer.concat([Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"; filename="audio"\r\nContent-Type: application/octet-stream\r\n\r\n`), file, Buffer.from('\r\n')]);
  const parts = [Buffer.from(field('model', 'whisper-1')), filePart];
  if (fileFirst) parts.reverse();
  return Buffer.concat([...parts, Buffer.from(field('response_format', 'json')), Buffer.from(`--${BOUNDARY}--\r\n`)]);
}

/** Feeds a body in chunks of `size` (reused buffers, as the spill's are) and waits for the seconds. */
function probe(body: Buffer, size: number, boundary: string | null = BOUNDARY): Promise<{ seconds: number; p: AudioDurationProbe }> {
  const p = new AudioDurationProbe(boundary);
  const reused = Buffer.alloc(size);
  for (let i = 0; i < body.length; i += size) {
    const n = body.copy(reused, 0, i, i + size);
    p.feed(reused.subarray(0, n));
    reused.fill(0xee);
  }
  p.end();
  return new Promise((resolve) => p.whenSettled((seconds) => resolve({ seconds, p })));
}

const FILES: Array<[string, Buffer, string]> = [
  ['WAV', wavFile(30), 'wav'],
  ['MP3', mp3File(30), 'mp3'],
  ['Ogg/Opus', oggOpusFile(30), 'ogg'],
  ['FLAC', flacFile(30), 'flac'],
  ['M4A', m4aFile(30), 'm4a'],
  ['WebM', webmFile(30), 'webm'],
];

test('the container says how long the upload is: 30 s in every format, whatever the chunking', async () => {
  for (const [name, file, format] of FILES) {
    assert.equal(sniffFormat(file), format, name);
    for (const size of [7, 4096, 64 * 1024]) {
      for (const fileFirst of [false, true]) {
        const { seconds, p } = await probe(multipart(file, 'file', fileFirst), size);
        assert.equal(seconds, 30, `${name}, chunks of ${size}, file ${fileFirst ? 'first' : 'last'}: ${p.containerSeconds}`);
      }
    }
  }
});

test('without a length from the container, the size bills at the lowest bytes per second of the format', async () => {
  // Bytes that are no audio container: the lowest rate of all.
  const noise = Buffer.alloc(75_000, 0x5a);
  assert.equal((await probe(multipart(noise), 4096)).seconds, 75_000 / MIN_BYTES_PER_SECOND.unknown);
  // A body without a `file` part: all of it at that rate.
  const body = multipart(noise, 'audio');
  assert.equal((await probe(body, 4096)).seconds, Math.ceil(body.length / MIN_BYTES_PER_SECOND.unknown));
  // Not multipart at all.
  assert.equal((await probe(noise, 4096, null)).seconds, 100);
  // An MP3 cut before its first whole frame: no length; MP3's lowest rate.
  const cut = mp3File(1).subarray(0, 300);
  assert.equal((await probe(multipart(cut), 64)).seconds, 1);
});

test('a container that says less than its bytes can hold is billed by its bytes', async () => {
  // An Ogg file whose granule position says 1 s, padded with 640 KB of pages: at Opus's highest rate
  // (510 kbit/s, 64,000 bytes a second) that is at least 10 s.
  const liar = oggOpusFile(1, 64, 10_000);
  const { seconds, p } = await probe(multipart(liar), 64 * 1024);
  assert.equal(p.containerSeconds, 1);
  assert.equal(seconds, Math.ceil(liar.length / 64_000));
});

test('large files forwarded at network pace are read to their container length with a bounded backlog', async () => {
  await preloadAudioParsers();
  const files: Array<[string, Buffer, number]> = [
    ['WAV, 18 MiB', wavFile(600, 16000, 16), 600],
    ['MP3, 2 MiB', mp3File(120), 120],
    ['Ogg/Opus, 8 MiB', oggOpusFile(600, 2000, 4000), 600],
    ['M4A, 3 MiB', m4aFile(600, 3_000_000), 600],
    ['WebM, 3 MiB', webmFile(600, 3_000_000), 600],
  ];
  for (const [name, file, want] of files) {
    const body = multipart(file);
    const p = new AudioDurationProbe(BOUNDARY);
    // A chunk per turn of the event loop, as the upstream's socket takes them, but no further ahead of
    // the parser than a network would be (1 MiB): the parser's first read waits for music-metadata's
    // dynamic import of the format's parser, which under tsx goes through the loader thread, so on a
    // loaded machine 64 turns of 64 KiB could outrun it and the probe would (rightly) give up.
    let most = 0;
    for (let i = 0; i < body.length; i += 64 * 1024) {
      p.feed(body.subarray(i, i + 64 * 1024));
      most = Math.max(most, p.backlogBytes);
      do await new Promise((r) => setImmediate(r));
      while (p.backlogBytes > 1024 * 1024);
    }
    assert.ok(most <= PARSER_BACKLOG_BYTES, `${name}: backlog ${most}`);
    p.end();
    const seconds = await new Promise<number>((resolve) => p.whenSettled(resolve));
    assert.equal(Math.round(p.containerSeconds ?? 0), want, name);
    assert.equal(seconds, Math.ceil(p.containerSeconds!), name);
  }
});
