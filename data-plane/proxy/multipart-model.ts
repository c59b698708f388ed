// Finds the `model` field of a multipart/form-data upload while it streams in. Part boundaries are
// found by their delimiter, which the multipart format guarantees never occurs inside a part, so file
// content cannot fake a field.
//
// The scan is linear in the bytes received: every search resumes where the last one stopped, and the
// scanner keeps only the bytes a search may still need (a delimiter's worth, one part's head, the
// model's value). Everything before them, usually the whole audio file (the openai SDK sends `file`
// before `model`), is handed on as soon as it is settled, to an UploadSpill that keeps memory flat.
import type { Readable } from 'node:stream';
import { GatewayError } from '../errors.js';
import type { UploadSpill } from './upload-spill.js';

/** One part's head (the rest of its delimiter line, its headers, the blank line) at most. */
export const MAX_PART_HEAD_BYTES = 16 * 1024;
/** The model field's value at most: it is held in memory, and model names are short. */
export const MAX_MODEL_VALUE_BYTES = 1024;

export function boundaryOf(contentType: string): string | null {
  if (!/^multipart\/form-data\s*;/i.test(contentType)) return null;
  const m = /;\s*boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType);
  return m ? (m[1] ?? m[2]) : null;
}

export type ScanStep =
  | { kind: 'more' }
  /** `head` is every byte received and not handed on; the model's value is at [valueStart, valueEnd). */
  | { kind: 'found'; model: string; head: Buffer; valueStart: number; valueEnd: number }
  | { kind: 'refused'; error: GatewayError };

const CRLF = Buffer.from('\r\n');
/** Bytes scanned per step (a uWS chunk can be 512 KiB). */
const SLICE_BYTES = 64 * 1024;
const CRLF2 = Buffer.from('\r\n\r\n');
const DASH_DASH = 0x2d2d;

function missingModel(): GatewayError {
  return new GatewayError('INVALID_REQUEST', 'Missing required parameter: model.', { param: 'model' });
}

/**
 * The scan as a pure state machine: `push` chunks in, get the settled bytes out through `settle` (in
 * order; the receiver copies what it keeps), until the model field is found or the body is refused.
 * Offsets below are stream offsets (bytes since the body's first byte).
 */
export class ModelFieldScanner {
  /** Bytes searched so far, counting re-searched ones again: the scan's work, linear in the input. */
  examinedBytes = 0;
  private readonly dash: Buffer;
  private readonly delim: Buffer;
  private readonly maxPartHeadBytes: number;
  private readonly maxModelValueBytes: number;
  private store = Buffer.allocUnsafe(2 * SLICE_BYTES);
  /** Stream offset of store[0]. */
  private base = 0;
  /** Stream offset of the end of what was received. */
  private len = 0;
  /** Everything before this stream offset has been handed to `settle`. */
  private given = 0;
  private phase: 'start' | 'preamble' | 'delimiter' | 'head' | 'value' | 'done' = 'start';
  /** Where the current search resumes. */
  private from = 0;
  /** Start of what the phase reads: the end of the delimiter (delimiter, head) or the part's value. */
  private mark = 0;
  /** Start of the part's header lines (head phase). */
  private headersStart = 0;
  private isModel = false;

  constructor(
    boundary: string,
    private readonly settle: (bytes: Buffer) => void,
    limits: { maxPartHeadBytes?: number; maxModelValueBytes?: number } = {},
  ) {
    this.dash = Buffer.from(`--${boundary}`);
    this.delim = Buffer.from(`\r\n--${boundary}`);
    this.maxPartHeadBytes = limits.maxPartHeadBytes ?? MAX_PART_HEAD_BYTES;
    this.maxModelValueBytes = limits.maxModelValueBytes ?? MAX_MODEL_VALUE_BYTES;
  }

  /**
   * Takes the next chunk, which need only be valid during the call: what the scan keeps is copied, and
   * the bytes handed on may be slices of it, valid only during `settle`.
   */
  push(chunk: Buffer): ScanStep {
    if (this.phase === 'done') throw new Error('ModelFieldScanner: push after the scan ended');
    // In slices, so the store holds one slice besides what the searches need, whatever uWS reads.
    for (let at = 0; at === 0 || at < chunk.length; at += SLICE_BYTES) {
      const slice = chunk.subarray(at, at + SLICE_BYTES);
      const sliceStart = this.len;
      this.append(slice);
      const step = this.scan();
      if (step.kind === 'more') {
        this.handOn(slice, sliceStart);
        continue;
      }
      this.phase = 'done';
      const unscanned = chunk.subarray(at + SLICE_BYTES);
      if (step.kind === 'found' && unscanned.length > 0) step.head = Buffer.concat([step.head, unscanned]);
      return step;
    }
    return { kind: 'more' };
  }

  /** The body ended without a model field. */
  end(): GatewayError {
    this.phase = 'done';
    return missingModel();
  }

  private append(chunk: Buffer): void {
    if (this.len - this.base + chunk.length > this.store.length) {
      // Drop what was handed on; grow only if what is still needed does not fit.
      const live = this.len - this.given;
      const needed = live + chunk.length;
      const target = needed > this.store.length ? Buffer.allocUnsafe(Math.max(2 * this.store.length, needed)) : this.store;
      this.store.copy(target, 0, this.given - this.base, this.len - this.base);
      this.store = target;
      this.base = this.given;
    }
    chunk.copy(this.store, this.len - this.base);
    this.len += chunk.length;
  }

  /** First stream offset at or after `from` where `needle` starts, or -1; counts the bytes searched. */
  private search(needle: Buffer, from: number): number {
    const i = this.store.subarray(0, this.len - this.base).indexOf(needle, from - this.base);
    this.examinedBytes += i === -1 ? this.len - from : i - (from - this.base) + needle.length;
    return i === -1 ? -1 : i + this.base;
  }

  /** Runs the phases as far as the bytes received allow. */
  private scan(): ScanStep {
    for (;;) {
      switch (this.phase) {
        case 'start': {
          // The first delimiter may open the body without the CRLF that precedes every later one.
          const n = Math.min(this.len, this.dash.length);
          if (this.store.compare(this.dash, 0, n, 0, n) === 0) {
            if (n < this.dash.length) return { kind: 'more' };
            this.toDelimiter(this.dash.length);
          } else {
            this.phase = 'preamble';
            this.from = 0;
          }
          break;
        }
        case 'preamble': {
          const i = this.search(this.delim, this.from);
          if (i === -1) {
            this.from = Math.max(this.from, this.len - this.delim.length + 1);
            return { kind: 'more' };
          }
          this.toDelimiter(i + this.delim.length);
          break;
        }
        case 'delimiter': {
          // `--` closes the body; anything else is transport padding up to the end of the line.
          if (this.len < this.mark + 2) return { kind: 'more' };
          if (this.store.readUInt16BE(this.mark - this.base) === DASH_DASH) return { kind: 'refused', error: missingModel() };
          const i = this.search(CRLF, this.from);
          if (i === -1) {
            this.from = Math.max(this.from, this.len - 1);
            return this.headTooLong(this.len) ?? { kind: 'more' };
          }
          this.phase = 'head';
          this.headersStart = i + 2;
          // From the line's own CRLF: a part with no header lines ends its head right there.
          this.from = i;
          break;
        }
        case 'head': {
          const i = this.search(CRLF2, this.from);
          if (i === -1) {
            this.from = Math.max(this.from, this.len - 3);
            return this.headTooLong(this.len) ?? { kind: 'more' };
          }
          const tooLong = this.headTooLong(i + 4);
          if (tooLong) return tooLong;
          const headers = i > this.headersStart ? this.store.toString('latin1', this.headersStart - this.base, i - this.base) : '';
          this.isModel = partFieldName(headers) === 'model';
          this.phase = 'value';
          this.mark = i + 4;
          this.from = this.mark;
          break;
        }
        case 'value': {
          const i = this.search(this.delim, this.from);
          if (i === -1) {
            this.from = Math.max(this.from, this.len - this.delim.length + 1);
            if (this.isModel && this.from - this.mark > this.maxModelValueBytes) return this.modelTooLong();
            return { kind: 'more' };
          }
          if (!this.isModel) {
            this.toDelimiter(i + this.delim.length);
            break;
          }
          if (i - this.mark > this.maxModelValueBytes) return this.modelTooLong();
          const head = Buffer.from(this.store.subarray(this.given - this.base, this.len - this.base));
          const model = this.store.toString('utf8', this.mark - this.base, i - this.base).trim();
          return { kind: 'found', model, head, valueStart: this.mark - this.given, valueEnd: i - this.given };
        }
        case 'done':
          throw new Error('ModelFieldScanner: scan after the end');
      }
    }
  }

  private toDelimiter(end: number): void {
    this.phase = 'delimiter';
    this.mark = end;
    this.from = end;
  }

  /** A part's head runs from the end of its delimiter to the end of its blank line. */
  private headTooLong(end: number): ScanStep | null {
    if (end - this.mark <= this.maxPartHeadBytes) return null;
    return {
      kind: 'refused',
      error: new GatewayError('INVALID_REQUEST', `A multipart part's headers are longer than ${this.maxPartHeadBytes} bytes.`, { param: null }),
    };
  }

  private modelTooLong(): ScanStep {
    return {
      kind: 'refused',
      error: new GatewayError('INVALID_REQUEST', `The model field is longer than ${this.maxModelValueBytes} bytes.`, { param: 'model' }),
    };
  }

  /**
   * Hands on every byte no search still needs: those from earlier slices as a copy out of the store
   * (a few bytes, usually), those of `slice` as a part of it, so a file part costs no copy here.
   */
  private handOn(slice: Buffer, sliceStart: number): void {
    let keep: number;
    if (this.phase === 'preamble') keep = this.from;
    else if (this.phase === 'value') keep = this.isModel ? this.mark : this.from;
    else if (this.phase === 'start') keep = 0;
    else keep = this.mark;
    if (keep <= this.given) return;
    const split = Math.min(keep, sliceStart);
    if (split > this.given) this.settle(Buffer.from(this.store.subarray(this.given - this.base, split - this.base)));
    if (keep > sliceStart) this.settle(slice.subarray(Math.max(this.given, sliceStart) - sliceStart, keep - sliceStart));
    this.given = keep;
  }
}

const CONTENT_DISPOSITION = 'content-disposition';

/**
 * The field name of a part, from its header lines (CRLF-separated, latin1): the `name` parameter of its
 * first Content-Disposition header, quoted or not, as a form parser reads it; null when there is none.
 * One pass over the text: a hostile head (16 KiB of `content-disposition:` or of `;`) costs as much as
 * any other head of its size. (A regular expression did this before, and backtracked quadratically.)
 */
export function partFieldName(headers: string): string | null {
  const n = headers.length;
  // Every search resumes past the last one's find, so no byte is searched twice per character sought.
  let colon = -2;
  for (let line = 0; line < n; ) {
    let eol = headers.indexOf('\r\n', line);
    if (eol === -1) eol = n;
    colon = after(headers, ':', line, colon);
    if (colon !== -1 && colon < eol && headers.slice(line, colon).trim().toLowerCase() === CONTENT_DISPOSITION) {
      return dispositionName(headers, colon + 1, eol);
    }
    line = eol + 2;
  }
  return null;
}

/** The first index of `ch` at or after `from`, given `last`, a previous answer for an earlier `from` (-2: none). */
function after(s: string, ch: string, from: number, last: number): number {
  if (last === -1 || last >= from) return last;
  return s.indexOf(ch, from);
}

/** The `name` parameter of a Content-Disposition value in s[from, to): `form-data; name="x"`. */
function dispositionName(s: string, from: number, to: number): string | null {
  let eq = -2;
  let semi = after(s, ';', from, -2);
  // Skip the disposition type; parameters follow, each after a `;`.
  for (let i = semi; i !== -1 && i < to; ) {
    i++;
    while (i < to && (s[i] === ' ' || s[i] === '\t')) i++;
    eq = after(s, '=', i, eq);
    semi = after(s, ';', i, semi);
    if (eq === -1 || eq >= to || (semi !== -1 && semi < eq)) {
      i = semi;
      continue;
    }
    const key = s.slice(i, eq).trim().toLowerCase();
    let v = eq + 1;
    while (v < to && (s[v] === ' ' || s[v] === '\t')) v++;
    let value: string;
    if (s[v] === '"') {
      // A quoted string: a backslash escapes the next character.
      let out = '';
      let j = v + 1;
      for (; j < to && s[j] !== '"'; j++) out += s[j] === '\\' && j + 1 < to ? s[++j] : s[j];
      value = out;
      v = j;
    } else {
      const end = semi === -1 || semi > to ? to : semi;
      value = s.slice(v, end).trim();
    }
    if (key === 'name') return value;
    semi = after(s, ';', v, semi);
    i = semi;
  }
  return null;
}

/** What findModelField reads: a request body whose chunks can be diverted to the scan (BodyStream). */
export interface UploadBody extends Readable {
  /** Chunks go to `sink` as they arrive (views valid during the call only), until `undivert()`. */
  divert(sink: (chunk: Buffer, isLast: boolean) => void): void;
  /** Back to a Readable for what follows. */
  undivert(): void;
  /** Stops / restarts reading the client (backpressure while diverted). */
  hold(): void;
  release(): void;
}

export interface ModelField {
  model: string;
  /** Holds the bytes before `head`: on disk when the upload was large, else nothing. Owned by the caller. */
  spill: UploadSpill;
  /** The bytes after the spilled ones, up to where the stream stands; they contain the model's value. */
  head: Buffer;
  modelValueStart: number;
  modelValueEnd: number;
  /** Bytes of the body read so far: the spilled ones and `head`. */
  prefixBytes: number;
  /**
   * The same stream, positioned right after `head`, not flowing. It may have ended already (its
   * 'end' fired unheard while the spill was being completed): read it with for-await.
   */
  rest: Readable;
}

const CLOSED = 'the request body closed before its model field';

/**
 * Reads `body` up to its model field, handing the bytes before it to `spill` with backpressure.
 * `cb` is called once. The spill belongs to the caller, who removes it however the request ends.
 */
export function findModelField(body: UploadBody, boundary: string, spill: UploadSpill, cb: (err: unknown, field: ModelField | null) => void): void {
  let settled = false;
  let waitingForSpill = false;
  const scanner = new ModelFieldScanner(boundary, (bytes) => {
    if (spill.write(bytes) || waitingForSpill) return;
    // The disk is behind: stop reading the client until it caught up.
    waitingForSpill = true;
    body.hold();
    spill.onDrain(() => {
      waitingForSpill = false;
      if (!settled) body.release();
    });
  });

  const detach = () => {
    body.undivert();
    body.off('error', onError);
    body.off('close', onClose);
    spill.onError(null);
  };
  const fail = (err: unknown) => {
    if (settled) return;
    settled = true;
    detach();
    cb(err, null);
  };

  const onChunk = (chunk: Buffer, isLast: boolean) => {
    if (settled) return;
    const step = scanner.push(chunk);
    if (step.kind === 'more') {
      if (isLast) fail(scanner.end());
      return;
    }
    if (step.kind === 'refused') return fail(step.error);
    settled = true;
    detach();
    spill.finish((err, held) => {
      // The body may have failed (over its cap) while the spill was being completed.
      if (err || body.errored) return cb(err ?? body.errored, null);
      const head = held.length > 0 ? Buffer.concat([held, step.head]) : step.head;
      cb(null, {
        model: step.model,
        spill,
        head,
        modelValueStart: held.length + step.valueStart,
        modelValueEnd: held.length + step.valueEnd,
        prefixBytes: spill.fileBytes + head.length,
        rest: body,
      });
    });
  };
  const onError = (err: unknown) => fail(err);
  const onClose = () => fail(new Error(CLOSED));
  body.on('error', onError);
  body.on('close', onClose);
  spill.onError(fail);
  body.divert(onChunk);
}
