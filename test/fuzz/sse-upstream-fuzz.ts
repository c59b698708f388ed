// Property-based fuzzing (fast-check) of a node's model proxy from the other side: a hostile
// OpenAI-compatible upstream answering streamed chat completions with random SSE framing (LF, CRLF and
// lone CR line ends, comments, unknown fields, multi-line data, events of up to 2 MiB without a blank
// line, invalid UTF-8, usage chunks with bogus counts, a reset mid-stream), cut into chunks at random
// offsets (inside a CRLF, inside a UTF-8 sequence). The properties: the node answers every request and
// never crashes; a stream with nothing for the gateway to read or strip reaches the client byte for
// byte; the node's own work never holds its event loop for 250 ms or more over the whole run
// (loop-block.mjs: lateness counted as far as the node used CPU meanwhile, so a machine busy with
// other work does not fail the run); a normal request is served afterwards. Shared by `npm test` (bounded) and `npm run fuzz -- --mode sse-upstream`.
import assert from 'node:assert/strict';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import fc from 'fast-check';
import { addUpstreamModel, configYaml } from '../helpers/config.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer } from '../helpers/http.js';
import { ROOT, startControlPlane, startDataPlane, type DataPlane } from '../helpers/processes.js';

/** The longest the node's event loop may run late at any moment of a run. */
export const MAX_LOOP_DELAY_MS = 250;

export interface SseFuzzStack {
  node: DataPlane;
  key: string;
  close(): Promise<void>;
  /** Starts watching the node's event-loop delay (loop-block.mjs, preloaded). */
  watchLoop(): void;
  /** Stops watching and returns the longest delays seen. */
  loopDelay(): Promise<LoopDelay>;
}

/**
 * The longest the node's event loop ran late: on the wall clock, and counted only as far as the node
 * used CPU meanwhile (its own work; waiting for a core on a shared machine is not).
 */
export interface LoopDelay {
  maxLateMs: number;
  maxBlockedMs: number;
}

/** One hostile answer: the bytes, how they are cut into writes, and how the answer ends. */
interface SseCase {
  id: number;
  bytes: Buffer;
  cuts: number[];
  /** Destroy the connection after this many bytes instead of ending it; -1: end cleanly. */
  resetAfter: number;
  /** The client asked for usage itself (the gateway then strips nothing). */
  clientUsage: boolean;
}

const cases = new Map<number, SseCase>();

function startHostileUpstream(): Promise<{ server: Server; baseUrl: string }> {
  const server = createServer((req, res: ServerResponse) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      let id = -1;
      try {
        id = Number(JSON.parse(Buffer.concat(parts).toString('utf8')).messages[0].content);
      } catch {
        id = -1;
      }
      const c = cases.get(id);
      if (!c) {
        res.writeHead(200, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify({ id: 'ok', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
      }
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      res.flushHeaders();
      const end = c.resetAfter >= 0 ? Math.min(c.resetAfter, c.bytes.length) : c.bytes.length;
      const cuts = [...new Set(c.cuts.map((x) => x % (end + 1)))].sort((a, b) => a - b);
      let from = 0;
      for (const at of [...cuts, end]) {
        if (at > from) res.write(c.bytes.subarray(from, at));
        from = Math.max(from, at);
      }
      if (c.resetAfter >= 0) res.destroy();
      else res.end();
    });
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve({ server, baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1` })),
  );
}

export async function startSseFuzzStack(): Promise<SseFuzzStack> {
  const upstream = await startHostileUpstream();
  const cp = await startControlPlane({
    env: { TOLLGATE_TEST_UPSTREAM_KEY: 'sk-upstream-fuzz' },
    configYaml: configYaml((cfg) => {
      cfg.tiers.fuzz = { rpm: 1_000_000, tpm: 1_000_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000000.00', models: [] };
      addUpstreamModel(cfg, 'fuzz-sse', upstream.baseUrl, ['fuzz']);
    }),
  });
  const node = await startDataPlane(cp, { nodeArgs: ['--import', join(ROOT, 'test', 'fuzz', 'loop-block.mjs')] });
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const created = await createKey(admin, { tier: 'fuzz' });
  admin.close();
  await waitUntilKnown(node.url, created.key);
  let from = 0;
  return {
    node,
    key: created.key,
    close: () => new Promise<void>((resolve) => upstream.server.close(() => resolve())),
    watchLoop() {
      from = node.proc.output().length;
      node.proc.child.kill('SIGUSR2');
    },
    async loopDelay() {
      node.proc.child.kill('SIGUSR2');
      const m = await node.proc.waitFor(new RegExp(`^[\\s\\S]{${from}}[\\s\\S]*?loop-block (\\{.*\\})`), 10_000);
      if (process.env.TOLLGATE_FUZZ_VERBOSE) console.log(m[1]);
      return JSON.parse(m[1]) as LoopDelay;
    },
  };
}

const EOL = fc.constantFrom('\n', '\r\n', '\r');

const chunkJson = (content: string, usageNull = false) =>
  JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: null }], ...(usageNull ? { usage: null } : {}) });
const badCount = fc.oneof(fc.integer({ min: -5, max: 5_000 }), fc.constant(1e300), fc.constant(-0.5), fc.constant('12'), fc.constant(null), fc.constant({ n: 1 }), fc.double());

/** A data payload: content chunks, usage chunks (good and bogus), [DONE], junk, big. */
const payloadArb: fc.Arbitrary<string> = fc.oneof(
  { weight: 12, arbitrary: fc.string({ maxLength: 40 }).map((t) => chunkJson(t)) },
  { weight: 1, arbitrary: fc.string({ maxLength: 40 }).map((t) => chunkJson(t, true)) },
  { weight: 1, arbitrary: fc.record({ prompt_tokens: badCount, completion_tokens: badCount, total_tokens: fc.option(badCount, { nil: undefined }), prompt_tokens_details: fc.option(fc.record({ cached_tokens: badCount, audio_tokens: badCount }), { nil: undefined }) }).map((usage) => JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [], usage })) },
  { weight: 1, arbitrary: fc.constant('[DONE]') },
  { weight: 1, arbitrary: fc.json({ maxDepth: 3 }) },
  { weight: 1, arbitrary: fc.string({ maxLength: 60 }) },
  { weight: 1, arbitrary: fc.constant('{"usage":') },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 300_000 }).map((n) => chunkJson('x'.repeat(n))) },
);

/** One SSE event's lines. */
const eventArb: fc.Arbitrary<string[]> = fc.tuple(
  fc.array(fc.oneof(fc.constant(': keep-alive'), fc.constant('event: message'), fc.constant('id: 7'), fc.constant('retry: 1000'), fc.constant('data'), fc.string({ maxLength: 20 }).map((s) => `x-unknown:${s.replace(/[\r\n]/g, '')}`)), { maxLength: 2 }),
  payloadArb,
  fc.boolean(),
).map(([extra, payload, split]) => {
  // A payload on one data line, or cut over two (SSE joins them with a newline).
  const lines = payload.split(/\r\n|\r|\n/);
  const data = split && lines.length === 1 && payload.length > 2 ? [`data: ${payload.slice(0, 2)}`, `data:${payload.slice(2)}`] : lines.map((l) => `data: ${l}`);
  return [...extra, ...data];
});

/** A value one time in `n`, else undefined. */
function sometimes<T>(arb: fc.Arbitrary<T>, n: number): fc.Arbitrary<T | undefined> {
  return fc.oneof({ weight: n - 1, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: arb });
}

function sseCaseArb(): fc.Arbitrary<Omit<SseCase, 'id'>> {
  return fc
    .record({
      events: fc.array(fc.tuple(eventArb, EOL), { minLength: 1, maxLength: 8 }),
      bom: fc.boolean(),
      invalidUtf8: fc.nat(4).map((n) => n === 0),
      noBlankLine: sometimes(fc.integer({ min: 1024 * 1024, max: 2 * 1024 * 1024 }), 8),
      cuts: fc.array(fc.nat(), { maxLength: 8 }),
      reset: sometimes(fc.nat(), 5),
      clientUsage: fc.boolean(),
    })
    .map(({ events, bom, invalidUtf8, noBlankLine, cuts, reset, clientUsage }) => {
      let text = (bom ? '\ufeff' : '') + events.map(([lines, eol]) => lines.join(eol) + eol + eol).join('');
      if (noBlankLine !== undefined) text += `data: ${'y'.repeat(noBlankLine)}`;
      let bytes = Buffer.from(text);
      // A broken UTF-8 sequence in the middle.
      if (invalidUtf8) bytes = Buffer.concat([bytes.subarray(0, bytes.length >> 1), Buffer.from([0xe2, 0x82, 0xff, 0xc0]), bytes.subarray(bytes.length >> 1)]);
      // Cut points inside the first bytes too (the head of a stream is where framing is decided).
      return { bytes, cuts: [...cuts, 1, 2, 3], resetAfter: reset === undefined ? -1 : reset % (bytes.length + 1), clientUsage };
    });
}

function isValidUtf8(b: Buffer): boolean {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(b);
    return true;
  } catch {
    return false;
  }
}

let nextId = 1;

/** Runs `numRuns` hostile streams through the node; asserts the properties above. */
export async function fuzzSseUpstream(stack: SseFuzzStack, numRuns: number, seed?: number): Promise<{ loop: LoopDelay; exact: number; resets: number }> {
  let exact = 0;
  let resets = 0;
  stack.watchLoop();
  await fc.assert(
    fc.asyncProperty(sseCaseArb(), async (spec) => {
      const c: SseCase = { id: nextId++, ...spec };
      cases.set(c.id, c);
      try {
        const body: Record<string, unknown> = { model: 'fuzz-sse', stream: true, messages: [{ role: 'user', content: String(c.id) }] };
        if (c.clientUsage) body.stream_options = { include_usage: true };
        const ac = AbortSignal.timeout(20_000);
        const r = await fetch(`${stack.node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(stack.key), 'content-type': 'application/json' }, body: JSON.stringify(body), signal: ac });
        // A reset before any byte is a 502 in Shape A; anything else streams with the upstream's status.
        if (c.resetAfter >= 0) resets++;
        if (r.status === 502) {
          assert.ok(c.resetAfter >= 0, 'a 502 only for an upstream that reset');
          const err = (await r.json()) as { error: Record<string, unknown> };
          assert.deepEqual(Object.keys(err.error).sort(), ['code', 'message', 'param', 'type']);
          return;
        }
        assert.equal(r.status, 200);
        assert.match(r.headers.get('content-type') ?? '', /^text\/event-stream/);
        let received: Buffer;
        try {
          received = Buffer.from(await r.arrayBuffer());
        } catch (err) {
          // The upstream reset mid-stream: the node closes the stream (or ends it with an error event).
          assert.ok(c.resetAfter >= 0, `the stream broke though the upstream ended cleanly: ${(err as Error).message}`);
          return;
        }
        const sent = c.resetAfter >= 0 ? c.bytes.subarray(0, c.resetAfter) : c.bytes;
        if (c.resetAfter < 0 && !sent.includes('"usage"') && isValidUtf8(sent)) {
          assert.ok(received.equals(sent), `a stream with nothing to read passes unchanged (${sent.length} bytes sent, ${received.length} received)`);
          exact++;
        }
      } finally {
        cases.delete(c.id);
      }
      assert.equal(stack.node.proc.child.exitCode, null, 'the node is still running');
    }),
    { numRuns, seed, endOnFailure: true },
  );
  const loop = await stack.loopDelay();
  assert.ok(loop.maxBlockedMs < MAX_LOOP_DELAY_MS, `the node's own work held its event loop ${loop.maxBlockedMs} ms (late by ${loop.maxLateMs} ms on the wall clock)`);
  assert.doesNotMatch(stack.node.proc.output(), /data plane bug/, 'no bug was logged');
  const ok = await fetch(`${stack.node.url}/v1/chat/completions`, { method: 'POST', headers: { ...bearer(stack.key), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'fuzz-sse', messages: [{ role: 'user', content: 'normal' }] }) });
  assert.equal(ok.status, 200, `a normal request after ${numRuns} hostile streams`);
  // Most cases must be checked byte for byte, or the property checks little.
  assert.ok(exact >= numRuns / 10, `only ${exact} of ${numRuns} streams were compared byte for byte`);
  return { loop, exact, resets };
}
