// Finds the `model` field of a multipart/form-data upload while it streams in, holding only the bytes
// before it (bounded by the path's body cap). Part boundaries are found by their delimiter, which the
// multipart format guarantees never occurs inside a part, so file content cannot fake a field.
import type { Readable } from 'node:stream';
import { GatewayError } from '../errors.js';

export interface ModelField {
  model: string;
  /** Every byte read so far. */
  prefix: Buffer;
  modelValueStart: number;
  modelValueEnd: number;
  /** The same stream, paused, positioned right after `prefix`. */
  rest: Readable;
}

export function boundaryOf(contentType: string): string | null {
  if (!/^multipart\/form-data\s*;/i.test(contentType)) return null;
  const m = /;\s*boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType);
  return m ? (m[1] ?? m[2]) : null;
}

const CRLF2 = Buffer.from('\r\n\r\n');

export function findModelField(stream: Readable, boundary: string, cb: (err: unknown, field: ModelField | null) => void): void {
  const dash = Buffer.from(`--${boundary}`);
  const delim = Buffer.from(`\r\n--${boundary}`);
  let data = Buffer.allocUnsafe(64 * 1024);
  let len = 0;
  // Start of the next part's headers; -1 until the first delimiter is seen.
  let partStart = -1;
  let searchFrom = 0;
  let settled = false;

  const finish = (err: unknown, field: ModelField | null) => {
    if (settled) return;
    settled = true;
    stream.off('data', onData);
    stream.off('end', onEnd);
    stream.off('error', onError);
    if (field) stream.pause();
    cb(err, field);
  };

  const scan = (): void => {
    for (;;) {
      if (partStart === -1) {
        const i = data.subarray(0, len).indexOf(dash, searchFrom);
        if (i === -1) {
          searchFrom = Math.max(0, len - dash.length);
          return;
        }
        partStart = i + dash.length + 2;
        searchFrom = partStart;
      }
      if (len < partStart) return;
      const view = data.subarray(0, len);
      const hdrEnd = view.indexOf(CRLF2, partStart);
      if (hdrEnd === -1) return;
      const valueStart = hdrEnd + 4;
      const next = view.indexOf(delim, Math.max(valueStart, searchFrom));
      if (next === -1) {
        searchFrom = Math.max(valueStart, len - delim.length);
        return;
      }
      const headers = view.subarray(partStart, hdrEnd).toString('latin1');
      const name = /content-disposition:[^\r\n]*;\s*name="([^"]*)"/i.exec(headers)?.[1];
      if (name === 'model') {
        const model = view.subarray(valueStart, next).toString('utf8').trim();
        finish(null, { model, prefix: Buffer.from(view), modelValueStart: valueStart, modelValueEnd: next, rest: stream });
        return;
      }
      const after = next + delim.length;
      if (len < after + 2) {
        // Need two more bytes to know whether this was the closing delimiter.
        partStart = -1;
        searchFrom = next + 2;
        return;
      }
      if (view[after] === 45 && view[after + 1] === 45) {
        finish(new GatewayError('INVALID_REQUEST', 'Missing required parameter: model.', { param: 'model' }), null);
        return;
      }
      partStart = after + 2;
      searchFrom = partStart;
    }
  };

  const onData = (chunk: Buffer) => {
    if (len + chunk.length > data.length) {
      const bigger = Buffer.allocUnsafe(Math.max(data.length * 2, len + chunk.length));
      data.copy(bigger, 0, 0, len);
      data = bigger;
    }
    chunk.copy(data, len);
    len += chunk.length;
    scan();
  };
  const onEnd = () => finish(new GatewayError('INVALID_REQUEST', 'Missing required parameter: model.', { param: 'model' }), null);
  const onError = (err: unknown) => finish(err, null);
  stream.on('data', onData);
  stream.on('end', onEnd);
  stream.on('error', onError);
}
