// The usage readers and the price math as tables: realtime event types as JSON.parse reads them,
// usage read from JSON and SSE answers of any size in bounded memory, and cost from usage details.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { eventTypeOf } from '../../data-plane/realtime/session.js';

test('realtime events are told apart by their parsed top-level type only', () => {
  const cases: Array<[string, string | undefined]> = [
    ['{"type":"response.done","response":{"metadata":{"note":"response.created"}}}', 'response.done'],
    ['{"event_id":"e1","response":{"type":"response.created"},"type":"response.done"}', 'response.done'],
    ['{"response":{"metadata":{"x":"\\"type\\":\\"response.created\\""}},"type":"response.done"}', 'response.done'],
    ['{"type":"response.created","type":"response.done"}', 'response.done'],
    ['{"ty\\u0070e":"response.done"}', 'response.done'],
    ['{"type":"response.d\\u006fne"}', 'response.done'],
    [' { "type" : "response.created" , "n" : 1 , "b" : true , "z" : null } ', 'response.created'],
    ['{"delta":"' + 'A'.repeat(100_000) + '","type":"response.output_audio.delta"}', 'response.output_audio.delta'],
    ['{"note":"response.done"}', undefined],
    ['{"type":7}', undefined],
    ['{"type":"response.done"', undefined],
    ['{"type":"response.done"} x', undefined],
    ['["type","response.done"]', undefined],
    ['{}', undefined],
    ['', undefined],
  ];
  for (const [text, want] of cases) {
    assert.equal(eventTypeOf(Buffer.from(text)), want, text.slice(0, 80));
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    const viaParse = parsed && typeof parsed === 'object' && !Array.isArray(parsed) && typeof (parsed as any).type === 'string' ? (parsed as any).type : undefined;
    assert.equal(viaParse, want, `JSON.parse agrees: ${text.slice(0, 80)}`);
  }
});
