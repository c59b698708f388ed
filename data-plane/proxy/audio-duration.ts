// The seconds a transcription upload is billed when the upstream reports no `duration` (OpenAI's
// default `response_format: json` gives none): read from the uploaded file's own container by
// music-metadata, on the bytes as they are forwarded, or else from the file's size at a conservative
// rate per format. Nothing here waits on the forward: bytes are copied to the parser's stream, and a
// parser that falls behind by more than PARSER_BACKLOG_BYTES is given up (the size rate then bills).
//
//   seconds = max(container duration, bytes / highest bytes-per-second of the format)   when the container says
//   seconds = bytes / lowest bytes-per-second of any common encoding of the format      when it does not
//
// The floor keeps a header that lies about a short length (a WAV `data` size, an MP3 Xing frame
// count) from billing less than the bytes could hold; the rates are in docs/billing-endings.md.
import { Readable } from 'node:stream';
import { parseBuffer, parseStream } from 'music-metadata';

export type AudioFormat = 'wav' | 'mp3' | 'ogg' | 'flac' | 'm4a' | 'webm' | 'unknown';

/**
 * Lowest bytes per second of any common encoding of each format: billing the size at this rate is at
 * least the real length. WAV: 8 kHz 8-bit mono PCM; MP3: 8 kbit/s (MPEG-2.5's lowest); Ogg and WebM:
 * Opus at 6 kbit/s; M4A: HE-AAC at 8 kbit/s; FLAC: 8 kHz 8-bit mono at a 4:1 compression; anything
 * else: the lowest of these.
 */
export const MIN_BYTES_PER_SECOND: Readonly<Record<AudioFormat, number>> = { wav: 8000, mp3: 1000, ogg: 750, flac: 2000, m4a: 1000, webm: 750, unknown: 750 };

/**
 * Highest bytes per second a file of each format plausibly holds: a container duration is never
 * billed below size / this. WAV: 192 kHz 32-bit stereo; MP3: 320 kbit/s; Opus/Vorbis: 510 kbit/s;
 * FLAC: 192 kHz 24-bit stereo uncompressed; AAC: 512 kbit/s.
 */
export const MAX_BYTES_PER_SECOND: Readonly<Record<AudioFormat, number>> = { wav: 1_536_000, mp3: 40_000, ogg: 64_000, flac: 1_152_000, m4a: 64_000, webm: 64_000, unknown: 1_536_000 };

/** What the parser may lag behind the forward before it is given up. */
export const PARSER_BACKLOG_BYTES = 4 * 1024 * 1024;
/** A part head longer than this is not one (multipart-model.ts has the same bound). */
const MAX_HEAD_BYTES = 16 * 1024;
/** How long a finished upload waits for its parser before the size rate bills it. */
export const PARSER_SETTLE_MS = 2000;

/** The container format from a file's first bytes (magic numbers), or 'unknown'. */
export function sniffFormat(b: Buffer): AudioFormat {
  const ascii = (at: number, s: string) => b.length >= at + s.length && b.toString('latin1', at, at + s.length) === s;
  if (ascii(0, 'RIFF') && ascii(8, 'WAVE')) return 'wav';
  if (ascii(0, 'OggS')) return 'ogg';
  if (ascii(0, 'fLaC')) return 'flac';
  if (ascii(4, 'ftyp')) return 'm4a';
  if (b.length >= 4 && b[0] === 0x1a && b[1] === 0x45 && b[2] === 0xdf && b[3] === 0xa3) return 'webm';
  if (ascii(0, 'ID3') || (b.length >= 2 && b[0] === 0xff && (b[1] & 0xe0) === 0xe0)) return 'mp3';
  return 'unknown';
}

const CRLF2 = Buffer.from('\r\n\r\n');
type State = 'seek' | 'delimiter' | 'head' | 'file' | 'other' | 'done';

/**
 * Finds the `file` part of a multipart body fed in order, chunk by chunk, and hands its content on.
 * Memory: a delimiter's length of carry, and a part head (at most 16 KiB).
 */
export class MultipartFileReader {
  private readonly delimiter: Buffer;
  // The body's first delimiter has no CRLF before it: one is assumed.
  private carry: Buffer = Buffer.from('\r\n');
  private state: State = 'seek';
  private head: Buffer[] = [];
  private headBytes = 0;
  /** The file part's content ended (its closing delimiter was seen). */
  complete = false;
  /** The file part's head was seen. */
  found = false;

  constructor(
    boundary: string,
    private readonly onContent: (bytes: Buffer) => void,
  ) {
    this.delimiter = Buffer.from(`\r\n--${boundary}`, 'latin1');
  }

  feed(chunk: Buffer): void {
    if (this.state === 'done') return;
    let buf = this.carry.length > 0 ? Buffer.concat([this.carry, chunk]) : chunk;
    this.carry = EMPTY;
    while (buf.length > 0 && (this.state as State) !== 'done') {
      if (this.state === 'seek' || this.state === 'file' || this.state === 'other') {
        const at = buf.indexOf(this.delimiter);
        if (at === -1) {
          // Keep what may be the start of a delimiter; the rest is content.
          const keep = Math.min(buf.length, this.delimiter.length - 1);
          if (this.state === 'file' && buf.length > keep) this.onContent(buf.subarray(0, buf.length - keep));
          this.carry = Buffer.from(buf.subarray(buf.length - keep));
          return;
        }
        if (this.state === 'file') {
          if (at > 0) this.onContent(buf.subarray(0, at));
          this.complete = true;
          this.state = 'done';
          return;
        }
        buf = buf.subarray(at + this.delimiter.length);
        this.state = 'delimiter';
      } else if (this.state === 'delimiter') {
        if (buf.length < 2) {
          this.carry = Buffer.from(buf);
          return;
        }
        // `--` after a delimiter closes the body; otherwise a part head follows its line end.
        if (buf[0] === 0x2d && buf[1] === 0x2d) {
          this.state = 'done';
          return;
        }
        this.head = [];
        this.headBytes = 0;
        this.state = 'head';
      } else if (this.state === 'head') {
        const joined = this.head.length > 0 ? Buffer.concat([...this.head, buf]) : buf;
        const end = joined.indexOf(CRLF2);
        if (end === -1) {
          this.headBytes = joined.length;
          if (this.headBytes > MAX_HEAD_BYTES) {
            this.state = 'done';
            return;
          }
          this.head = [Buffer.from(joined)];
          return;
        }
        const isFile = isFilePart(joined.toString('latin1', 0, end));
        buf = joined.subarray(end + CRLF2.length);
        this.head = [];
        // The content starts right after the head's blank line; a delimiter ends it (CRLF included).
        this.carry = EMPTY;
        if (isFile) this.found = true;
        this.state = isFile ? 'file' : 'other';
      }
    }
  }
}

const EMPTY = Buffer.alloc(0);

/** Whether a part head is the `file` field's (`Content-Disposition: form-data; name="file"`). */
function isFilePart(head: string): boolean {
  for (const line of head.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon === -1 || line.slice(0, colon).trim().toLowerCase() !== 'content-disposition') continue;
    for (const param of line.slice(colon + 1).split(';')) {
      const eq = param.indexOf('=');
      if (eq === -1 || param.slice(0, eq).trim().toLowerCase() !== 'name') continue;
      return param.slice(eq + 1).trim().replace(/^"(.*)"$/, '$1') === 'file';
    }
  }
  return false;
}

/**
 * Watches a transcription upload go to the upstream (`feed` every body byte, in order) and works out
 * the seconds to bill when the upstream gives none. One per request.
 */
export class AudioDurationProbe {
  private readonly reader: MultipartFileReader | null;
  private stream: Readable | null = null;
  private first: Buffer[] = [];
  private firstBytes = 0;
  /** Bytes of the file part seen so far (all the body's when no file part was found). */
  fileBytes = 0;
  private bodyBytes = 0;
  format: AudioFormat = 'unknown';
  /** The container's duration in seconds, once the parser found one. */
  containerSeconds: number | null = null;
  private settled = false;
  private ended = false;
  private waiters: Array<() => void> = [];

  constructor(boundary: string | null) {
    this.reader = boundary ? new MultipartFileReader(boundary, (b) => this.onFileBytes(b)) : null;
    if (!this.reader) this.settle();
  }

  /** Bytes handed to the parser that it has not read yet. */
  get backlogBytes(): number {
    return this.stream?.readableLength ?? 0;
  }

  /** Every byte of the request body as it goes to the upstream (copied if kept: callers reuse buffers). */
  feed(chunk: Buffer): void {
    this.bodyBytes += chunk.length;
    const r = this.reader;
    if (!r || r.complete) return;
    r.feed(chunk);
    // The file part ended: the parser gets the end of its stream.
    if (r.complete) this.end();
  }

  /** The file part (or the upload, however it ended) ended: the parser gets the end of its stream. Idempotent. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    if (this.stream) {
      if (!this.stream.destroyed) this.stream.push(null);
    } else if (this.first.length > 0) {
      // A file shorter than the sniffing needs: parsed as it is.
      const head = Buffer.concat(this.first);
      this.first = [];
      this.format = sniffFormat(head);
      this.startParser(head);
    } else this.settle();
  }

  private onFileBytes(b: Buffer): void {
    this.fileBytes += b.length;
    if (this.settled) return;
    if (!this.stream) {
      // The format is sniffed from the first bytes; the parser starts with them.
      this.first.push(Buffer.from(b));
      this.firstBytes += b.length;
      if (this.firstBytes < 16 && !this.reader?.complete) return;
      const head = Buffer.concat(this.first);
      this.first = [];
      this.format = sniffFormat(head);
      this.startParser(head);
      return;
    }
    if (this.ended) return;
    if (this.stream.readableLength > PARSER_BACKLOG_BYTES) {
      // The parser lags: given up, the size rate bills (never slow the forward down).
      this.giveUp();
      return;
    }
    this.stream.push(Buffer.from(b));
  }

  private startParser(head: Buffer): void {
    const stream = new Readable({ read() {} });
    this.stream = stream;
    stream.push(head);
    if (this.ended) stream.push(null);
    if (this.settled) return;
    parseStream(stream, { mimeType: MIME[this.format] }, { duration: true, skipCovers: true, skipPostHeaders: true }).then(
      (m) => {
        const d = m.format.duration;
        if (typeof d === 'number' && Number.isFinite(d) && d > 0) this.containerSeconds = d;
        this.giveUp();
      },
      () => this.giveUp(),
    );
  }

  private giveUp(): void {
    const s = this.stream;
    this.stream = null;
    if (s && !s.destroyed) s.destroy();
    this.settle();
  }

  private settle(): void {
    if (this.settled) return;
    this.settled = true;
    for (const w of this.waiters.splice(0)) w();
  }

  /** Whole seconds to bill (at least 1), by the rule at the top of this file. */
  seconds(): number {
    const bytes = this.reader?.found ? this.fileBytes : this.bodyBytes;
    const format = this.reader?.found ? this.format : 'unknown';
    const complete = this.reader?.complete ?? false;
    let s: number;
    if (this.containerSeconds !== null && complete) s = Math.max(this.containerSeconds, bytes / MAX_BYTES_PER_SECOND[format]);
    else s = bytes / MIN_BYTES_PER_SECOND[format];
    return Math.max(1, Math.ceil(s));
  }

  /** Calls `cb` with the seconds once the parser is done with what it was given (bounded by PARSER_SETTLE_MS). */
  whenSettled(cb: (seconds: number) => void): void {
    if (this.settled) return cb(this.seconds());
    let called = false;
    const go = () => {
      if (called) return;
      called = true;
      clearTimeout(timer);
      cb(this.seconds());
    };
    const timer = setTimeout(() => {
      this.giveUp();
      go();
    }, PARSER_SETTLE_MS);
    timer.unref();
    this.waiters.push(go);
  }
}

/**
 * Loads music-metadata's parser of each format now, at start: it imports a parser the first time a
 * format is seen, and a parser still loading reads nothing while the upload streams on (the first
 * large upload of a format would then be billed by its size). Each parse fails on the few bytes given;
 * only the loading matters.
 */
export function preloadAudioParsers(): Promise<void> {
  const samples: Array<[string, Buffer]> = [
    ['audio/wav', Buffer.from('RIFF\0\0\0\0WAVEfmt ', 'latin1')],
    ['audio/mpeg', Buffer.from([0x49, 0x44, 0x33, 4, 0, 0, 0, 0, 0, 0, 0xff, 0xfb, 0x90, 0xc0])],
    ['audio/ogg', Buffer.from('OggS\0\x02', 'latin1')],
    ['audio/flac', Buffer.from('fLaC', 'latin1')],
    ['audio/mp4', Buffer.from('\0\0\0\x10ftypM4A \0\0\0\0', 'latin1')],
    ['audio/webm', Buffer.from([0x1a, 0x45, 0xdf, 0xa3, 0x80])],
  ];
  return Promise.allSettled(samples.map(([mimeType, b]) => parseBuffer(b, { mimeType }, { duration: true }))).then(() => undefined);
}
void preloadAudioParsers();

const MIME: Readonly<Record<AudioFormat, string | undefined>> = {
  wav: 'audio/wav',
  mp3: 'audio/mpeg',
  ogg: 'audio/ogg',
  flac: 'audio/flac',
  m4a: 'audio/mp4',
  webm: 'audio/webm',
  unknown: undefined,
};
