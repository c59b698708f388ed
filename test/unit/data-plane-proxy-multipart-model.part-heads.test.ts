// The field name of a multipart part, read from its head in one pass (multipart-model.ts partFieldName).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { partFieldName } from '../../data-plane/proxy/multipart-model.js';

test('a part head names its field as a form parser reads Content-Disposition', () => {
  const rows: Array<[string, string | null]> = [
    ['Content-Disposition: form-data; name="model"', 'model'],
    ['content-disposition:form-data;name=model', 'model'],
    ['CONTENT-DISPOSITION: form-data; name = "model" ', 'model'],
    ['Content-Disposition: form-data; filename="a.mp3"; name="file"', 'file'],
    ['Content-Disposition: form-data; filename="name=model"', null],
    ['Content-Disposition: form-data; filename="x;name=model"; name="file"', 'file'],
    ['Content-Type: text/plain\r\nContent-Disposition: form-data; name="mo\\"del"', 'mo"del'],
    ['X-Note: content-disposition: form-data; name="model"', null],
    ['Content-Disposition: form-data; name="a;b"; x=1', 'a;b'],
    ['Content-Disposition: form-data; name="first"\r\nContent-Disposition: form-data; name="model"', 'first'],
    ['Content-Disposition: form-data', null],
    ['Content-Disposition: form-data; name', null],
    ['', null],
  ];
  for (const [head, want] of rows) assert.equal(partFieldName(head), want, JSON.stringify(head));
});

test('hostile part heads are read in time linear in their length', () => {
  // Before the fix a regular expression took ~40 ms on one 15 KiB head of repeated
  // `content-disposition:`, so 64 of them (a MiB of upload) took seconds. Read in one pass, 64 take a
  // few milliseconds; the bound is generous for a loaded machine and still far below the old cost.
  const heads = [
    `X: ${'content-disposition:'.repeat(800)}`,
    `Content-Disposition: form-data${';'.repeat(16_000)}`,
    ';=\r\n'.repeat(4000),
    'a\r\n'.repeat(5000),
    `Content-Disposition: x${'; a="'.repeat(3000)}`,
    `Content-Disposition: x${'; a=b'.repeat(3000)}`,
  ];
  for (const head of heads) {
    const t0 = performance.now();
    for (let i = 0; i < 64; i++) partFieldName(head);
    const ms = performance.now() - t0;
    assert.ok(ms < 400, `${JSON.stringify(head.slice(0, 30))}…: ${ms.toFixed(1)} ms for 64 heads`);
  }
});
