// Multipart mode of the node fuzz (`npm run fuzz -- --mode multipart`): random transcription uploads,
// sent raw, with random boundaries, part heads (hostile Content-Disposition lines, long heads, bare LF
// line ends, quoting), part contents that carry pieces of the delimiter, preambles, missing or
// mismatched closing delimiters. The properties: the node never crashes or hangs, every answer is a
// permitted status in Shape A, and the node's event loop is never held up 250 ms or more by the cases:
// the CPU time of its main thread (the event loop's, /proc schedstat) over every few cases stays under
// it. Its event-loop gauge (wall time) read so on a loaded machine counted the time the machine gave
// other processes (0.336 s once at load average 10), which no input had caused.
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import fc from 'fast-check';
import { bearer, request, setClock } from '../helpers/http.js';
import { mainThreadCpuMicros } from '../bench/procstat.js';
import { ALLOWED_STATUSES, type FuzzStack } from './node-fuzz.js';

/** The most CPU the event loop may spend on a few cases (CASES_PER_CHECK): none may hold it up that long. */
export const MAX_LOOP_DELAY_SEC = 0.25;
/** Cases between two reads of the node's event-loop gauge. */
const CASES_PER_CHECK = 20;

interface MultipartCase {
  boundary: string;
  contentType: string;
  body: Buffer;
  chunked: boolean;
}

const BCHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789'()+_,-./:=? ";
const boundaryArb = fc.oneof(
  { weight: 6, arbitrary: fc.string({ unit: fc.constantFrom(...BCHARS.split('')), minLength: 1, maxLength: 70 }).map((s) => s.replace(/ +$/, 'x')) },
  { weight: 1, arbitrary: fc.constantFrom('-', '--', 'a', '\r\n', 'content-disposition', 'x'.repeat(300)) },
);

const crlfArb = fc.oneof({ weight: 8, arbitrary: fc.constant('\r\n') }, { weight: 1, arbitrary: fc.constant('\n') });
const textArb = fc.string({ unit: fc.constantFrom(...'abcXYZ09 ;=":\\-_/\t'.split('')), maxLength: 40 });

/** A Content-Disposition value, ordinary or built to make a parser backtrack or misread. */
const dispositionArb = fc.oneof(
  fc.constantFrom('form-data; name="model"', 'form-data; name=model', 'form-data;name="model"', 'form-data; name="file"; filename="a.wav"', 'form-data; filename="name=model"', 'form-data; name="mo\\"del"', 'form-data; name="model'),
  textArb.map((t) => `form-data; name="${t}"`),
  fc.tuple(fc.constantFrom('content-disposition:', ';', '; name="', '; a=b', '"', ';='), fc.integer({ min: 1, max: 1200 })).map(([piece, n]) => `form-data${piece.repeat(n)}`),
);

const headerLineArb = fc.oneof(
  { weight: 4, arbitrary: fc.tuple(fc.constantFrom('Content-Disposition', 'content-disposition', 'CONTENT-DISPOSITION', ' Content-Disposition'), dispositionArb).map(([k, v]) => `${k}: ${v}`) },
  { weight: 2, arbitrary: fc.tuple(fc.constantFrom('Content-Type', 'X-Note', 'Content-Transfer-Encoding'), textArb).map(([k, v]) => `${k}: ${v}`) },
  { weight: 1, arbitrary: textArb },
  { weight: 1, arbitrary: fc.integer({ min: 100, max: 17_000 }).map((n) => `X-Pad: ${'p'.repeat(n)}`) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 900 }).map((n) => `X-Pad: ${'content-disposition:'.repeat(n)}`) },
);

/** A part's content: the model's name, bytes, or bytes that carry pieces of the delimiter. */
function contentArb(boundary: string): fc.Arbitrary<Buffer> {
  return fc.oneof(
    fc.constantFrom('demo-transcribe', ' demo-transcribe ', 'no-such-model', '', 'x'.repeat(2000)).map((s) => Buffer.from(s)),
    fc.uint8Array({ maxLength: 4096 }).map((b) => Buffer.from(b)),
    fc.array(fc.constantFrom(`--${boundary}`, `\r\n--${boundary.slice(0, -1)}`, '\r\n--', '\r\n', '--', 'data'), { maxLength: 12 }).map((xs) => Buffer.from(xs.join(''))),
  );
}

function partArb(boundary: string): fc.Arbitrary<Buffer> {
  return fc.tuple(fc.array(headerLineArb, { maxLength: 4 }), crlfArb, contentArb(boundary)).map(([lines, eol, content]) =>
    Buffer.concat([Buffer.from(lines.map((l) => l + eol).join('') + eol), content]),
  );
}

function caseArb(): fc.Arbitrary<MultipartCase> {
  return boundaryArb.chain((boundary) =>
    fc
      .record({
        preamble: fc.oneof({ weight: 5, arbitrary: fc.constant('') }, { weight: 1, arbitrary: textArb.map((t) => `${t}\r\n`) }),
        parts: fc.oneof(
          { weight: 9, arbitrary: fc.array(partArb(boundary), { maxLength: 5 }) },
          // Many parts with the same head near its 16 KiB cap: a MiB of heads, where a parser slower
          // than linear shows.
          { weight: 1, arbitrary: fc.tuple(partArb(boundary), fc.integer({ min: 8, max: 64 })).map(([p, n]) => Array<Buffer>(n).fill(p)) },
        ),
        withModel: fc.boolean(),
        closing: fc.constantFrom(`\r\n--${boundary}--\r\n`, `\r\n--${boundary}--`, `\r\n--${boundary}`, '', '\r\n--'),
        typeOf: fc.constantFrom('plain', 'quoted', 'missing', 'other', 'not-multipart'),
        chunked: fc.boolean(),
      })
      .map(({ preamble, parts, withModel, closing, typeOf, chunked }) => {
        const all = [...parts];
        if (withModel) all.push(Buffer.from('Content-Disposition: form-data; name="model"\r\n\r\ndemo-transcribe'));
        const pieces: Buffer[] = [Buffer.from(preamble)];
        all.forEach((p, i) => pieces.push(Buffer.from(`${i === 0 ? '' : '\r\n'}--${boundary}\r\n`), p));
        pieces.push(Buffer.from(closing));
        const contentTypes: Record<string, string> = {
          plain: `multipart/form-data; boundary=${boundary}`,
          quoted: `multipart/form-data; boundary="${boundary}"`,
          missing: 'multipart/form-data',
          other: 'multipart/form-data; boundary=something-else',
          'not-multipart': 'application/octet-stream',
        };
        const body = Buffer.concat(pieces);
        // fast-check prints a failing case with this: a summary and the body's start, not the whole body.
        const show = () => `${typeOf} boundary ${JSON.stringify(boundary)}, ${all.length} parts, ${body.length} bytes${chunked ? ' chunked' : ''}: ${JSON.stringify(body.subarray(0, 300).toString('latin1'))}…`;
        return { boundary, contentType: contentTypes[typeOf], body, chunked, [fc.toStringMethod]: show };
      }),
  );
}

interface RawAnswer {
  status: number;
  body: string;
}

/** Sends one upload (Connection: close) and reads the whole answer, failing after `timeoutMs`. */
function send(address: string, key: string, c: MultipartCase, timeoutMs: number): Promise<RawAnswer> {
  const port = Number(address.slice(address.lastIndexOf(':') + 1));
  return new Promise((resolve, reject) => {
    const sock = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
      if (!m || end === -1) return reject(new Error(`no HTTP answer: ${JSON.stringify(text.slice(0, 200))}`));
      resolve({ status: Number(m[1]), body: Buffer.from(text.slice(end + 4), 'latin1').toString('utf8') });
    });
    const head = `POST /v1/audio/transcriptions HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\nAuthorization: Bearer ${key}\r\nContent-Type: ${c.contentType.replace(/[\r\n]/g, ' ')}\r\n`;
    if (c.chunked) {
      sock.write(`${head}Transfer-Encoding: chunked\r\n\r\n`);
      // In a few chunks, so part heads and delimiters straddle reads.
      const step = Math.max(1, Math.ceil(c.body.length / 3));
      for (let at = 0; at < c.body.length; at += step) {
        const piece = c.body.subarray(at, at + step);
        sock.write(Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]));
      }
      sock.write('0\r\n\r\n');
    } else {
      sock.write(`${head}Content-Length: ${c.body.length}\r\n\r\n`);
      sock.write(c.body);
    }
  });
}

function checkAnswer(c: MultipartCase, a: RawAnswer): void {
  const what = `${c.contentType} (${c.body.length} bytes) → ${a.status} ${a.body.slice(0, 300)}`;
  assert.ok(ALLOWED_STATUSES.has(a.status), `status not in the spec's table: ${what}`);
  if (a.status < 400) return;
  const err = JSON.parse(a.body)?.error;
  assert.equal(typeof err?.message, 'string', what);
  assert.equal(typeof err.type, 'string', `Shape A type: ${what}`);
  assert.equal(err.code, String(a.status), `Shape A code: ${what}`);
}

/** CPU seconds the node's main thread (its event loop) has used so far. */
function loopCpuSec(stack: FuzzStack): number {
  const micros = mainThreadCpuMicros(stack.node.proc.child.pid!);
  assert.ok(micros !== null, 'the node\'s CPU time is readable (/proc)');
  return micros / 1e6;
}

/** Runs `numRuns` multipart cases against the stack, reading the node's event-loop CPU as it goes. */
export async function fuzzMultipart(stack: FuzzStack, numRuns: number, seed?: number): Promise<void> {
  let since = loopCpuSec(stack);
  let cases = 0;
  let worstSec = 0;
  const heldUp = () => {
    const now = loopCpuSec(stack);
    const sec = now - since;
    since = now;
    worstSec = Math.max(worstSec, sec);
    return sec;
  };
  await fc.assert(
    fc.asyncProperty(caseArb(), async (c) => {
      const answer = await send(stack.node.address, stack.key, c, 10_000);
      checkAnswer(c, answer);
      assert.equal(stack.node.proc.child.exitCode, null, 'the node is still running');
      if (++cases % CASES_PER_CHECK === 0) {
        const busy = heldUp();
        assert.ok(busy < MAX_LOOP_DELAY_SEC, `the node's event loop ran ${busy.toFixed(3)} s of CPU over ${CASES_PER_CHECK} cases`);
        // A new minute now and then: the key's rpm does not end the run early in 429s.
        if (cases % 200 === 0) await setClock(stack.node.adminUrl!, { advance_ms: 60_000 });
      }
    }),
    { numRuns, seed, endOnFailure: true },
  );
  const last = heldUp();
  assert.ok(last < MAX_LOOP_DELAY_SEC, `the node's event loop ran ${last.toFixed(3)} s of CPU over the last cases`);
  await setClock(stack.node.adminUrl!, { advance_ms: 120_000 });
  const r = await request(`${stack.node.url}/v1/models`, { headers: bearer(stack.key) });
  assert.equal(r.status, 200, `a normal request after ${numRuns} multipart cases (the event loop's most CPU over ${CASES_PER_CHECK} cases ${worstSec.toFixed(3)} s)`);
}
