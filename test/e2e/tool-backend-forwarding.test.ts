// What reaches a tool backend, seen from the backend: path tricks never do (400 `bad_path`), legitimate
// tool paths do, byte for byte; client-sent forwarding headers never do, and exactly one
// X-Forwarded-For with the client's address as the node derived it does. Clients come from 127.0.0.1
// (inside the trusted range 127.0.0.0/31) or 127.0.0.2 (outside it), to a node on 127.0.0.1 and to a
// dual-stack node on [::], which sees them as IPv4-mapped addresses.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { configYaml } from '../helpers/config.js';
import { gatewayFixture } from '../helpers/gateway-fixture.js';
import { waitUntilKnown } from '../helpers/data-plane.js';
import { rawRequest } from '../helpers/http.js';
import { BAD_PATHS } from '../helpers/paths.js';
import { type DataPlane } from '../helpers/processes.js';
import { startRecordingBackend, type RecordingBackend } from '../helpers/recording-backend.js';

let backend: RecordingBackend;
let node: DataPlane;
let dualStackAddress: string;
let key: string;

const TRUSTED_PEER = '127.0.0.1';
const UNTRUSTED_PEER = '127.0.0.2';

gatewayFixture(
  async () => {
    backend = await startRecordingBackend();
    return {
      controlPlane: {
        configYaml: configYaml((cfg) => {
          cfg.tool_backends = ['/v1/files', '/v1/pdf', '/v1/route', '/v1/vector_stores'].map((prefix) => ({ prefix, base_url: backend.baseUrl, timeout_ms: 5000 }));
          // Room for every request below, and no money needed.
          cfg.tiers.tools = { rpm: 100_000, tpm: 100_000_000, max_parallel_requests: 100, monthly_cap_usd: null, free_grant_usd: '1000', models: [] };
          cfg.trusted_proxies = ['127.0.0.0/31'];
        }),
      },
      nodes: [{}, { listen: '[::]:0' }],
    };
  },
  async (g) => {
    const [n, dual] = g.nodes;
    node = n;
    dualStackAddress = `127.0.0.1:${dual.address.slice(dual.address.lastIndexOf(':') + 1)}`;
    key = (await g.fundedKey({ tier: 'tools', knownOn: [node] })).key;
    await waitUntilKnown(`http://${dualStackAddress}`, key);
  },
);
after(async () => {
  await backend?.close();
});

interface RawAnswer {
  status: number;
  headers: string;
  body: string;
}

// Requests that are not about client addresses each come from a client of their own behind the trusted
// proxy, so they never spend one another's edge budgets (60 per minute on /v1/files*).
let clients = 0;
function freshClient(): string[] {
  clients++;
  return [`X-Forwarded-For: 100.64.${clients >> 8}.${clients & 255}`];
}

interface SendOptions {
  method?: string;
  headers?: string[];
  body?: string;
  /** The client's own address (default 127.0.0.1, a trusted proxy). */
  from?: string;
  /** The node's address (default the node on 127.0.0.1). */
  to?: string;
  /** Send the key (default true). */
  auth?: boolean;
}

async function send(pathAndQuery: string, opts: SendOptions = {}): Promise<RawAnswer> {
  const body = opts.body === undefined ? undefined : Buffer.from(opts.body);
  const lines = [
    `${opts.method ?? 'GET'} ${pathAndQuery} HTTP/1.1`,
    'Host: gateway.test',
    ...(opts.auth === false ? [] : [`Authorization: Bearer ${key}`]),
    ...(opts.headers ?? []),
    ...(body ? [`Content-Length: ${body.length}`] : []),
    'Connection: close',
  ];
  const r = await rawRequest(opts.to ?? node.address, `${lines.join('\r\n')}\r\n\r\n`, body, { localAddress: opts.from ?? TRUSTED_PEER });
  const split = r.text.indexOf('\r\n\r\n');
  return { status: r.status, headers: split < 0 ? r.text : r.text.slice(0, split), body: split < 0 ? '' : r.text.slice(split + 4) };
}

// Raw controls and spaces never reach the node's handler: uWS's parser holds such a request unanswered
// and closes the connection at its idle timeout (about 12 s), so they are covered by the unit table only.
const unparseable = (p: string) => /[\x00-\x20]/.test(p);

test('path tricks answer 400 bad_path and never reach a tool backend', async () => {
  // Before: `..;`, double-encoded dots, overlong UTF-8 and invalid UTF-8 were forwarded to the backend.
  backend.clear();
  for (const [path, why] of BAD_PATHS) {
    if (unparseable(path) || !path.startsWith('/')) continue;
    const r = await send(path, { headers: freshClient() });
    assert.equal(r.status, 400, `${why}: ${JSON.stringify(path.slice(0, 60))} answered ${r.status} ${r.body.slice(0, 200)}`);
    assert.deepEqual(JSON.parse(r.body), { error: { code: 'bad_path', message: JSON.parse(r.body).error.message } }, why);
  }
  assert.deepEqual(backend.requests.map((q) => q.path), [], 'the backend saw none of them');
});

// Legitimate tool paths: dots inside names, encoded spaces and unicode, queries, sub-delimiters.
const GOOD_TOOL_PATHS = [
  '/v1/files/file.v2.pdf',
  '/v1/files/a%20b.pdf?purpose=assistants',
  '/v1/files/caf%C3%A9.pdf',
  '/v1/files/%E2%82%AC?q=caf%C3%A9&path=%2Fetc%2F..&empty=',
  '/v1/files/a%2520b',
  '/v1/files/.well-known/x',
  '/v1/files/a...b',
  "/v1/files/-_~!$&'()*+,=:@",
  '/v1/files/',
  '/v1/files',
  '/v1/filesystem',
  '/v1/pdf/render?format=a4&scale=1.5',
  '/v1/route',
  '/v1/route/model.v2/chat?x=1',
  '/v1/vector_stores/vs_1/files/file-1',
];

test('legitimate tool paths reach the backend unchanged, with their queries', async () => {
  backend.clear();
  for (const path of GOOD_TOOL_PATHS) {
    const r = await send(path, { headers: freshClient() });
    assert.equal(r.status, 200, `${path}: ${r.body.slice(0, 200)}`);
    assert.equal(JSON.parse(r.body).path, path);
  }
  assert.deepEqual(
    backend.requests.map((q) => q.path),
    GOOD_TOOL_PATHS,
  );
});

test('a tool request keeps its method and body', async () => {
  backend.clear();
  const r = await send('/v1/files/upload.v2?x=%20', { method: 'POST', headers: ['Content-Type: application/json', ...freshClient()], body: '{"name":"a b"}' });
  assert.equal(r.status, 200);
  assert.equal(backend.requests.length, 1);
  const got = backend.requests[0];
  assert.equal(got.method, 'POST');
  assert.equal(got.path, '/v1/files/upload.v2?x=%20');
  assert.equal(got.body, '{"name":"a b"}');
  assert.equal(got.headers['content-type'], 'application/json');
  assert.equal(got.headers.authorization, undefined, "the gateway's credential is not forwarded");
});

const CLIENT_ADDRESS_HEADERS = ['X-Forwarded-For: 198.51.100.1', 'Forwarded: for=198.51.100.2;proto=https', 'X-Real-IP: 198.51.100.3', 'X-Client-IP: 198.51.100.5', 'True-Client-IP: 198.51.100.6'];

test('a tool backend never sees client-sent forwarding headers, and gets exactly one X-Forwarded-For with the derived client address', async (t) => {
  // Before: the client's X-Forwarded-For, Forwarded and X-Real-IP were passed on beside ours, only the
  // first X-Forwarded-For line was read, and trusted_proxies matched exact strings only.
  const rows: Array<[string, SendOptions, string]> = [
    ['an untrusted peer: its own address, whatever it claims', { from: UNTRUSTED_PEER, headers: CLIENT_ADDRESS_HEADERS }, '127.0.0.2'],
    ['a trusted peer: the right-most hop it forwards', { from: TRUSTED_PEER, headers: CLIENT_ADDRESS_HEADERS }, '198.51.100.1'],
    ['a trusted peer, no X-Forwarded-For: the peer', { from: TRUSTED_PEER, headers: ['Forwarded: for=198.51.100.2', 'X-Real-IP: 198.51.100.3'] }, '127.0.0.1'],
    [
      'a trusted peer, several X-Forwarded-For lines: all of them, right-most untrusted hop',
      { from: TRUSTED_PEER, headers: ['X-Forwarded-For: 203.0.113.9', 'X-Forwarded-For: 198.51.100.7, 127.0.0.0'] },
      '198.51.100.7',
    ],
    ['a trusted peer forwarding an IPv6 hop with a port: canonical text', { from: TRUSTED_PEER, headers: ['X-Forwarded-For: [2001:DB8:0::7]:443'] }, '2001:db8::7'],
    ['a dual-stack node: an IPv4-mapped peer in the trusted range is trusted', { to: 'dual', from: TRUSTED_PEER, headers: CLIENT_ADDRESS_HEADERS }, '198.51.100.1'],
    ['a dual-stack node: an IPv4-mapped untrusted peer, in canonical text', { to: 'dual', from: UNTRUSTED_PEER, headers: CLIENT_ADDRESS_HEADERS }, '127.0.0.2'],
  ];
  for (const [name, opts, want] of rows) {
    await t.test(name, async () => {
      backend.clear();
      const r = await send('/v1/files/file-1', { ...opts, to: opts.to === 'dual' ? dualStackAddress : undefined });
      assert.equal(r.status, 200, r.body);
      assert.equal(backend.requests.length, 1);
      const got = backend.requests[0];
      assert.deepEqual(backend.headerLines(got, 'x-forwarded-for'), [want]);
      for (const h of ['forwarded', 'x-real-ip', 'x-client-ip', 'true-client-ip']) assert.deepEqual(backend.headerLines(got, h), [], h);
    });
  }
});

test('edge budgets count by the derived client address', async () => {
  // Before: trusted_proxies entries were compared as exact strings, so a range trusted nobody and every
  // client behind the proxy shared the proxy's budget.
  const anonymous = (from: string, xff: string) => send('/v1/chat/completions', { method: 'POST', auth: false, from, headers: [`X-Forwarded-For: ${xff}`] });
  // Behind the trusted proxy: two clients, two budgets of 12 without a credential.
  for (let i = 0; i < 12; i++) assert.equal((await anonymous(TRUSTED_PEER, '198.51.100.21')).status, 401, `request ${i + 1}`);
  assert.equal((await anonymous(TRUSTED_PEER, '198.51.100.21')).status, 429);
  assert.equal((await anonymous(TRUSTED_PEER, '::ffff:198.51.100.21')).status, 429, 'the same client written IPv4-mapped');
  assert.equal((await anonymous(TRUSTED_PEER, '198.51.100.22')).status, 401, 'another client has its own budget');
  // From an untrusted peer the header is ignored: both "clients" are the peer, sharing one budget.
  for (let i = 0; i < 12; i++) assert.equal((await anonymous(UNTRUSTED_PEER, '198.51.100.31')).status, 401, `request ${i + 1}`);
  assert.equal((await anonymous(UNTRUSTED_PEER, '198.51.100.32')).status, 429);
});

test('headers the client names in Connection are hop-by-hop and never reach a tool backend', async () => {
  // Before: a header listed in `Connection` (meant for the gateway's connection only, RFC 9110 7.6.1)
  // was forwarded to the backend. (Header names with underscores, e.g. `X_Tollgate_Key_Id`, never get
  // this far: uWS refuses the request while parsing it.)
  backend.clear();
  const r = await send('/v1/files/file-1', { headers: ['X-Hop-Only: drop me', 'X-Hop-Too: drop me', 'Connection: X-Hop-Only, x-hop-too', 'X-Kept: kept', ...freshClient()] });
  assert.equal(r.status, 200, r.body);
  assert.equal(backend.requests.length, 1);
  const got = backend.requests[0];
  assert.deepEqual(backend.headerLines(got, 'x-hop-only'), []);
  assert.deepEqual(backend.headerLines(got, 'x-hop-too'), []);
  assert.deepEqual(backend.headerLines(got, 'x-kept'), ['kept'], 'an ordinary end-to-end header still does');
});

test('a tool backend never sees client-sent X-Forwarded-Host/Proto/Port/Prefix or URL-override headers', async () => {
  // Before: only X-Forwarded-For, Forwarded and the client-address headers were dropped, so a client
  // could tell a backend that trusts its gateway's forwarding headers another host, scheme or prefix
  // (links and redirects it builds), or another path (X-Original-URL, X-Rewrite-URL).
  backend.clear();
  const forged = [
    'X-Forwarded-Host: evil.example',
    'X-Forwarded-Proto: https',
    'X-Forwarded-Port: 8443',
    'X-Forwarded-Prefix: /admin',
    'X-Forwarded-Server: evil.example',
    'X-Original-URL: /admin/secrets',
    'X-Rewrite-URL: /admin/secrets',
    'X-Original-Host: evil.example',
  ];
  const r = await send('/v1/files/file-1', { headers: [...forged, 'X-Kept: kept', ...freshClient()] });
  assert.equal(r.status, 200, r.body);
  const got = backend.requests[0];
  for (const line of forged) {
    const name = line.slice(0, line.indexOf(':')).toLowerCase();
    assert.deepEqual(backend.headerLines(got, name), [], name);
  }
  assert.deepEqual(backend.headerLines(got, 'x-kept'), ['kept']);
  assert.equal(backend.headerLines(got, 'x-forwarded-for').length, 1, 'ours, once');
});
