// Request bodies rewritten on their text (model renamed, include_usage added): the result parses to
// what re-serialising would give, and everything else stays byte for byte.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { rewriteChatBody, setTopLevelStrings, topLevelStringSpan } from '../../data-plane/proxy/json-splice.js';

test('the top-level model is found, never a nested one or one inside a string', () => {
  const table: Array<[string, string | null]> = [
    ['{"model":"a","messages":[]}', '"a"'],
    ['{ "messages": [{"model":"inner"}], "model" : "b\\"c" }', '"b\\"c"'],
    ['{"x":"\\"model\\":\\"no\\"","model":"yes"}', '"yes"'],
    ['{"meta":{"model":"inner"}}', null],
    ['{"model":1}', null],
    ['{"mod\\u0065l":"escaped key"}', null],
    ['[{"model":"in array"}]', null],
  ];
  for (const [text, want] of table) {
    const span = topLevelStringSpan(text, 'model');
    assert.equal(span ? text.slice(span[0], span[1]) : null, want, text);
  }
});

test('rewriting equals re-serialising, and keeps number formats', () => {
  assert.equal(rewriteChatBody('{"model":"m","n":1.50,"big":12345678901234567890}', 'up', false), '{"model":"up","n":1.50,"big":12345678901234567890}');
  assert.equal(rewriteChatBody(' {"model":"m","stream":true}', null, true), ' {"stream_options":{"include_usage":true},"model":"m","stream":true}');
  const json = fc.jsonValue({ maxDepth: 3 }).filter((v) => v === null || typeof v !== 'object' || Array.isArray(v) || Object.keys(v).length < 8);
  fc.assert(
    fc.property(fc.dictionary(fc.string().filter((k) => k !== 'model' && k !== 'stream_options'), json), fc.string(), fc.string(), fc.boolean(), (rest, model, upstream, addUsage) => {
      // What the client sends is JSON text: -0 and the like are compared as that text says.
      const body = JSON.parse(JSON.stringify({ ...rest, model })) as Record<string, unknown>;
      const text = JSON.stringify(body);
      const out = rewriteChatBody(text, upstream, addUsage);
      assert.notEqual(out, null);
      const want: Record<string, unknown> = { ...body, model: upstream };
      if (addUsage) want.stream_options = { include_usage: true };
      assert.deepEqual(JSON.parse(out!), want);
    }),
    // A fixed seed: the same 500 cases on every run (a property that found a case once keeps it).
    { numRuns: 500, seed: 20261123 },
  );
});

test('top-level strings set on the text: replaced where present, added first where absent, the rest byte for byte', () => {
  const has = (text: string) => (k: string) => k in JSON.parse(text);
  const table: Array<[string, Record<string, string>, string | null]> = [
    ['{"model":"m","user":"bob"}', { user: 'X', safety_identifier: 'S' }, '{"safety_identifier":"S","model":"m","user":"X"}'],
    ['{"safety_identifier":"a\\"b", "n": 1.50}', { safety_identifier: 'S' }, '{"safety_identifier":"S", "n": 1.50}'],
    ['{}', { safety_identifier: 'S' }, '{"safety_identifier":"S"}'],
    [' { } ', { safety_identifier: 'S' }, ' {"safety_identifier":"S" } '],
    // Not a plain string where present: the caller re-serialises.
    ['{"user":null}', { user: 'X' }, null],
    ['{"user":{"id":1}}', { user: 'X' }, null],
  ];
  for (const [text, set, want] of table) {
    const got = setTopLevelStrings(text, set, has(text));
    assert.equal(got, want, text);
    if (got !== null) JSON.parse(got);
  }
});
