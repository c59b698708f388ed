// Property-based fuzzing of a running node (fast-check): random methods, paths from a grammar of /v1
// paths plus mutations, hostile headers and bodies, sent as raw HTTP/1.1 so nothing normalises them.
// The properties: the node never crashes or hangs; every answer is a status the spec's table allows
// (or 200 and 503, the node's own "not now"), in the error shape of its path family; a normal request
// still succeeds afterwards. Shared by `npm test` (a bounded number of runs) and `npm run fuzz`.
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import fc from 'fast-check';
import { familyOf } from '../../data-plane/routing/path-families.js';
import { configYaml } from '../helpers/config.js';
import { consoleClient, createKey } from '../helpers/console.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { bearer, request, setClock } from '../helpers/http.js';
import { startRecordingBackend, type RecordingBackend } from '../helpers/recording-backend.js';
import { startControlPlane, startDataPlane, type DataPlane } from '../helpers/processes.js';

/** Statuses of the spec's table, plus 200 (success) and 503 (node not ready or out of body budget). */
export const ALLOWED_STATUSES = new Set([200, 400, 401, 404, 405, 413, 429, 500, 502, 503]);
/** Shape B codes the gateway answers on any path family (docs/design.md#error-shapes: 404 and bad_path are Shape B). */
const SHAPE_B_ANY_FAMILY = new Set(['bad_path', 'not_found']);

export interface FuzzStack {
  node: DataPlane;
  key: string;
  backend: RecordingBackend;
  close(): Promise<void>;
}

export async function startFuzzStack(): Promise<FuzzStack> {
  const backend = await startRecordingBackend();
  const cp = await startControlPlane({
    configYaml: configYaml((cfg) => {
      cfg.tool_backends = ['/v1/files', '/v1/pdf', '/v1/skills', '/v1/mcp', '/v1/vector_stores', '/v1/sandbox', '/v1/route'].map((prefix) => ({ prefix, base_url: backend.baseUrl, timeout_ms: 5000 }));
      // Each case comes "through a proxy" from its own address, so edge budgets do not swallow the run.
      cfg.trusted_proxies = ['127.0.0.1'];
    }),
  });
  const node = await startDataPlane(cp, { adminListen: true, env: { TOLLGATE_TEST_CLOCK: '1' } });
  const admin = consoleClient(cp.address, cp.secrets.operatorToken);
  const created = await createKey(admin, { tier: 'paid' });
  await admin.creditOrg({ orgId: created.orgId, amountMicros: 100_000_000, note: 'fuzz' });
  admin.close();
  await waitUntilKnown(node.url, created.key);
  return { node, key: created.key, backend, close: () => backend.close() };
}

interface FuzzCase {
  method: string;
  path: string;
  headers: Array<[string, string]>;
  body: Buffer | null;
  chunked: boolean;
  ip: string;
}

const PATHS = [
  '/v1/chat/completions',
  '/v1/embeddings',
  '/v1/models',
  '/v1/models/demo-chat',
  '/v1/audio/speech',
  '/v1/audio/transcriptions',
  '/v1/audio/voices',
  '/v1/files',
  '/v1/files/file-1/content',
  '/v1/pdf',
  '/v1/skills/s1',
  '/v1/mcp',
  '/v1/vector_stores/vs_1/files',
  '/v1/sandbox/run',
  '/v1/route',
  '/v1/realtime',
  '/v1/completions',
  '/v1/nope',
  '/v2/chat/completions',
  '/',
];
const SEGMENT_PIECES = ['a', 'b1', 'file.pdf', '..', '.', '', '%2e%2e', '%252e', '%c0%ae', '%2F', '%5c', '..;', ';x', '\\', '%00', '%zz', '%', '~', 'é', '%C3%A9', '%20'];

const segment = fc.array(fc.constantFrom(...SEGMENT_PIECES), { minLength: 1, maxLength: 3 }).map((xs) => xs.join(''));
const pathArb = fc
  .tuple(fc.constantFrom(...PATHS), fc.array(segment, { maxLength: 3 }), fc.option(fc.constantFrom('?a=1', '?purpose=x&b=%20', '?model=demo-chat', '?%zz'), { nil: undefined }))
  // Raw non-ASCII cannot be sent on a request line; it goes percent-encoded like a client would.
  .map(([base, extra, query]) => encodeURI((extra.length > 0 ? `${base}/${extra.join('/')}` : base)).replace(/%25/g, '%') + (query ?? ''));

// uWebSockets.js closes a connection whose request line names a method it does not know, before any
// handler runs (no answer is possible), so the fuzz draws from the methods it parses.
const methodArb = fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS', 'TRACE');

const headerValueArb = fc.stringMatching(/^[\x21-\x7e][\x20-\x7e]{0,60}$/);

function authArb(key: string): fc.Arbitrary<Array<[string, string]>> {
  return fc.oneof(
    fc.constant([]),
    fc.constant([['Authorization', `Bearer ${key}`]] as Array<[string, string]>),
    fc.constant([['Authorization', `Bearer ${key}`], ['Authorization', 'Bearer sk-tollgate-forged']] as Array<[string, string]>),
    fc.constant([['Authorization', `Bearer ${'a'.repeat(60_000)}`]] as Array<[string, string]>),
    headerValueArb.map((v) => [['Authorization', v]] as Array<[string, string]>),
    headerValueArb.map((v) => [['Authorization', `Bearer ${v}`]] as Array<[string, string]>),
    fc.constant([['x-api-key', key]] as Array<[string, string]>),
  );
}

const extraHeadersArb = fc.array(
  fc.oneof(
    fc.tuple(fc.constantFrom('Content-Type'), fc.constantFrom('application/json', 'application/json; charset=utf-8', 'text/plain', 'multipart/form-data; boundary=B', 'multipart/form-data', '')),
    fc.tuple(fc.constantFrom('X-Forwarded-For', 'Forwarded', 'X-Real-IP', 'Accept', 'User-Agent', 'X-Big'), headerValueArb),
    fc.tuple(fc.stringMatching(/^[A-Za-z][A-Za-z0-9-]{0,20}$/), headerValueArb),
    fc.constant(['X-Huge', 'h'.repeat(30_000)] as [string, string]),
  ),
  { maxLength: 4 },
);

const validChat = { model: 'demo-chat', messages: [{ role: 'user', content: 'hi' }] };
const bodyArb: fc.Arbitrary<Buffer | null> = fc.oneof(
  fc.constant(null),
  fc.constant(Buffer.from(JSON.stringify(validChat))),
  fc.json({ maxDepth: 4 }).map((s) => Buffer.from(s)),
  fc.jsonValue({ maxDepth: 3 }).map((v) => Buffer.from(JSON.stringify({ model: 'demo-chat', messages: v }))),
  fc.record({ model: fc.oneof(fc.string(), fc.integer(), fc.constant(null)), messages: fc.oneof(fc.string(), fc.array(fc.anything({ maxDepth: 2 }), { maxLength: 3 })) }).map((o) => Buffer.from(JSON.stringify(o))),
  fc.integer({ min: 1, max: 40 }).map((n) => Buffer.from(JSON.stringify(validChat).slice(0, n))),
  fc.integer({ min: 1000, max: 200_000 }).map((n) => Buffer.from('['.repeat(n) + ']'.repeat(n))),
  fc.uint8Array({ minLength: 1, maxLength: 200 }).map((b) => Buffer.from(b)),
  fc.constant(Buffer.from([0x7b, 0x22, 0x6d, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0xc0, 0xae, 0x22, 0x7d])),
  fc.constant(Buffer.from('{"model":"demo-chat","model":"demo-chat-pro","messages":[{"role":"user","content":"x"}]}')),
);

function caseArb(key: string): fc.Arbitrary<FuzzCase> {
  return fc.record({
    method: methodArb,
    path: pathArb,
    headers: fc.tuple(authArb(key), extraHeadersArb).map(([a, b]) => [...a, ...b]),
    body: bodyArb,
    chunked: fc.boolean(),
    ip: fc.tuple(fc.integer({ min: 1, max: 254 }), fc.integer({ min: 0, max: 255 }), fc.integer({ min: 0, max: 255 })).map(([a, b, c]) => `10.${a}.${b}.${c}`),
  });
}

class NoAnswer extends Error {}

function headBytesOf(c: FuzzCase): number {
  return c.headers.reduce((n, [k, v]) => n + k.length + v.length + 4, c.path.length + 64);
}

interface RawAnswer {
  status: number;
  headers: string;
  body: string;
}

/** Sends one case and reads the whole answer (Connection: close), failing after `timeoutMs`. */
function send(address: string, c: FuzzCase, timeoutMs: number): Promise<RawAnswer> {
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
      if (!m || end === -1) return reject(new NoAnswer(`no HTTP answer: ${JSON.stringify(text.slice(0, 200))}`));
      resolve({ status: Number(m[1]), headers: text.slice(0, end), body: Buffer.from(text.slice(end + 4), 'latin1').toString('utf8') });
    });
    let head = `${c.method} ${c.path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\nX-Forwarded-For: ${c.ip}\r\n`;
    for (const [k, v] of c.headers) if (k.toLowerCase() !== 'x-forwarded-for' && k.toLowerCase() !== 'connection') head += `${k}: ${v}\r\n`;
    if (c.body && c.chunked) {
      sock.write(`${head}Transfer-Encoding: chunked\r\n\r\n`);
      sock.write(Buffer.concat([Buffer.from(`${c.body.length.toString(16)}\r\n`), c.body, Buffer.from('\r\n0\r\n\r\n')]));
    } else if (c.body) {
      sock.write(`${head}Content-Length: ${c.body.length}\r\n\r\n`);
      sock.write(c.body);
    } else {
      sock.write(`${head}\r\n`);
    }
  });
}

/** The answer is a permitted status in the shape of its path family. */
export function checkAnswer(c: FuzzCase, a: RawAnswer): void {
  const what = `${c.method} ${c.path} → ${a.status} ${a.body.slice(0, 300)}`;
  // uWebSockets.js itself answers 431, before any handler runs, a request head over its buffer
  // (UWS_HTTP_MAX_HEADERS_SIZE, 4 KiB) that did not arrive in one read.
  if (a.status === 431 && headBytesOf(c) > 4096) return;
  assert.ok(ALLOWED_STATUSES.has(a.status), `status not in the spec's table: ${what}`);
  if (a.status < 400 || c.method === 'HEAD') return;
  let body: any;
  try {
    body = JSON.parse(a.body);
  } catch {
    assert.fail(`error body is not JSON: ${what}`);
  }
  const err = body?.error;
  assert.equal(typeof err, 'object', `no error object: ${what}`);
  assert.equal(typeof err.message, 'string', what);
  const shapeA = () => {
    assert.equal(typeof err.type, 'string', `Shape A type: ${what}`);
    assert.equal(err.code, String(a.status), `Shape A code: ${what}`);
    const keys = Object.keys(err).sort().join(',');
    assert.ok(keys === 'code,message,param,type' || (a.status === 429 && keys === 'code,message,type'), `Shape A keys ${keys}: ${what}`);
  };
  const shapeB = () => assert.deepEqual(Object.keys(err).sort(), ['code', 'message'], `Shape B: ${what}`);
  if (a.status === 429) return shapeA();
  if (typeof err.code === 'string' && SHAPE_B_ANY_FAMILY.has(err.code)) return shapeB();
  const pathOnly = c.path.split('?')[0];
  if (familyOf(pathOnly).shape === 'openai') shapeA();
  else shapeB();
  // Nothing internal leaks into a message.
  assert.doesNotMatch(a.body, /127\.0\.0\.1:\d+|at [\w.]+ \(|node_modules|sk-tollgate-[A-Za-z0-9]{20}/, `leak: ${what}`);
}

/** Runs `numRuns` cases against the stack, then checks the node is alive and serves a normal request. */
export async function fuzzNode(stack: FuzzStack, numRuns: number, seed?: number): Promise<void> {
  const started = Date.now();
  await fc.assert(
    fc.asyncProperty(caseArb(stack.key), async (c) => {
      let answer: RawAnswer | null;
      try {
        answer = await send(stack.node.address, c, 10_000);
      } catch (err) {
        // uWebSockets.js closes, unanswered, a connection whose request head outgrew its buffer.
        if (!(err instanceof NoAnswer) || headBytesOf(c) <= 4096) throw err;
        answer = null;
      }
      if (answer) checkAnswer(c, answer);
      assert.equal(stack.node.proc.child.exitCode, null, 'the node is still running');
    }),
    { numRuns, seed, endOnFailure: true },
  );
  assert.equal(stack.node.proc.child.exitCode, null, 'the node is still running');
  // A new minute and edge window: the run's own budgets are behind it.
  await setClock(stack.node.adminUrl!, { advance_ms: 120_000 });
  const r = await request(`${stack.node.url}/v1/chat/completions`, { method: 'POST', headers: bearer(stack.key), json: validChat });
  assert.equal(r.status, 200, `a normal request after ${numRuns} fuzz cases (${Date.now() - started} ms): ${r.text}`);
}
