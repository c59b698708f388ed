// The X-Forwarded-For lines a trusted peer sent are read either by walking the request (headerLines,
// one shared callback rather than a closure per request) or from the headers a tool path has copied
// already (copiedHeaderLines): both must give every line, in order, joined with commas, as before.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { copiedHeaderLines, headerLines } from '../../data-plane/request/client-ip.js';

/** What headerLines returned before: a closure collecting the named lines. */
function reference(headers: Array<[string, string]>, name: string): string {
  let out = '';
  for (const [k, v] of headers) if (k === name) out = out === '' ? v : `${out},${v}`;
  return out;
}
const asRequest = (headers: Array<[string, string]>) => ({ forEach: (cb: (k: string, v: string) => void) => headers.forEach(([k, v]) => cb(k, v)) });

test('X-Forwarded-For lines: several, none, empty ones, other headers between', () => {
  const rows: Array<[Array<[string, string]>, string]> = [
    [[], ''],
    [[['host', 'x']], ''],
    [[['x-forwarded-for', '203.0.113.9'], ['host', 'x'], ['x-forwarded-for', '198.51.100.7, 127.0.0.0']], '203.0.113.9,198.51.100.7, 127.0.0.0'],
    [[['x-forwarded-for', ''], ['x-forwarded-for', '198.51.100.7']], '198.51.100.7'],
    [[['x-forwarded-for', '1.1.1.1'], ['x-forwarded-for', '']], '1.1.1.1,'],
  ];
  for (const [headers, want] of rows) {
    assert.equal(headerLines(asRequest(headers), 'x-forwarded-for'), want);
    assert.equal(copiedHeaderLines(headers, 'x-forwarded-for'), want);
  }
});

test('X-Forwarded-For lines: both readings equal the closure they replace, request after request', () => {
  const name = fc.constantFrom('x-forwarded-for', 'host', 'forwarded', 'x-real-ip');
  const value = fc.oneof(fc.constantFrom('', '1.2.3.4', ' 10.0.0.1 , 2001:db8::1', ','), fc.string({ maxLength: 12 }));
  fc.assert(
    fc.property(fc.array(fc.array(fc.tuple(name, value), { maxLength: 8 }), { minLength: 1, maxLength: 4 }), (requests) => {
      for (const headers of requests) {
        assert.equal(headerLines(asRequest(headers), 'x-forwarded-for'), reference(headers, 'x-forwarded-for'));
        assert.equal(copiedHeaderLines(headers, 'x-forwarded-for'), reference(headers, 'x-forwarded-for'));
      }
    }),
    { numRuns: 1000 },
  );
});
