// The headers of an upstream's answer as undici hands them over (a flat raw list): the one value a
// model answer needs, and the end-to-end headers a tool answer passes on (hop-by-hop ones dropped,
// RFC 9110 7.6.1).
import type { HeaderList } from './response-sink.js';

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'content-length',
  'date',
  'uwebsockets',
]);

/** The first value of a header in undici's raw header list (name lower-case), or undefined. */
export function headerValue(raw: Buffer[], name: string): string | undefined {
  for (let i = 0; i < raw.length; i += 2) if (raw[i].length === name.length && raw[i].toString('latin1').toLowerCase() === name) return raw[i + 1].toString('latin1');
  return undefined;
}

/** `content-type` alone, as a header list (the last one is reused: answers of a model share theirs; the Reply only reads it). */
export function contentTypeHeader(contentType: string): HeaderList {
  if (contentType !== lastContentType) {
    lastContentType = contentType;
    lastContentTypeHeaders = contentType ? Object.freeze([Object.freeze(['content-type', contentType] as const)]) : NO_HEADERS;
  }
  return lastContentTypeHeaders;
}

const NO_HEADERS: HeaderList = Object.freeze([]);
let lastContentType = '';
let lastContentTypeHeaders: HeaderList = NO_HEADERS;

/** The response's end-to-end headers (lower-case names, each name's lines together, in order of first appearance). */
export function endToEndHeaders(raw: Buffer[]): Array<[string, string]> {
  const byName = new Map<string, string[]>();
  let named: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toString('latin1').toLowerCase();
    const value = raw[i + 1].toString('latin1');
    if (name === 'connection') named = connectionNames(value, named);
    if (HOP_BY_HOP.has(name)) continue;
    const list = byName.get(name);
    if (list) list.push(value);
    else byName.set(name, [value]);
  }
  const out: Array<[string, string]> = [];
  for (const [name, values] of byName) {
    // Headers the upstream's Connection header names are for that connection only.
    if (named?.has(name)) continue;
    for (const v of values) out.push([name, v]);
  }
  return out;
}

/**
 * The header names a `Connection` header lists (RFC 9110 7.6.1): hop-by-hop for that connection only,
 * never passed on. `close` and `keep-alive` are options, not names. Null when it lists none; names
 * are added to `into` when given.
 */
export function connectionNames(values: string | readonly string[], into: Set<string> | null = null): Set<string> | null {
  let out = into;
  for (const v of typeof values === 'string' ? [values] : values) {
    for (const t of v.split(',')) {
      const name = t.trim().toLowerCase();
      if (name && name !== 'close' && name !== 'keep-alive') (out ??= new Set()).add(name);
    }
  }
  return out;
}
