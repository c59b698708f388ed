// `npm start` also starts the demo tool backends, so every tool family answers offline with the key it
// prints: the MCP family is a real MCP server (reached with the SDK's client), the others a demo
// backend answering plausible JSON and FastAPI-style errors; the PDF guard sits in front of /v1/pdf.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ROOT, startOnFreePorts, startProcess, stopAll, tempDir } from '../helpers/processes.js';

after(stopAll);

test('npm start: every tool family answers offline through the gateway with the printed key', { timeout: 120_000 }, async () => {
  const cwd = tempDir('tollgate-start-tools-');
  const { proc, dpPort } = await startOnFreePorts((cpPort, dpPort) =>
    startProcess(
      [join(ROOT, 'cli', 'start.ts')],
      { TOLLGATE_CONTROL_PLANE_LISTEN: `127.0.0.1:${cpPort}`, TOLLGATE_DATA_PLANE_LISTEN: `127.0.0.1:${dpPort}`, TOLLGATE_PEPPER: '', TOLLGATE_OPERATOR_TOKEN: '', TOLLGATE_NODE_TOKEN: '' },
      { cwd },
    ),
  );
  assert.match(proc.output(), /demo backend mcp listening on http:\/\/127\.0\.0\.1:\d+/);
  const key = (proc.output().match(/sk-tollgate-[0-9A-Za-z]{43}/) ?? [])[0];
  assert.ok(key, proc.output());
  const base = `http://127.0.0.1:${dpPort}`;
  const auth = { authorization: `Bearer ${key}` };

  // MCP, with the SDK's client.
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/v1/mcp`), { requestInit: { headers: { Authorization: `Bearer ${key}` } } });
  const client = new Client({ name: 'embedded-test', version: '1.0.0' });
  await client.connect(transport);
  const { tools } = await client.listTools();
  assert.ok(tools.some((t) => t.name === 'add'));
  const sum = await client.callTool({ name: 'add', arguments: { a: 1, b: 2 } });
  assert.deepEqual(sum.content, [{ type: 'text', text: '3' }]);
  await transport.terminateSession().catch(() => {});
  await client.close();

  const json = async (path: string, init: RequestInit = {}) => {
    const res = await fetch(`${base}${path}`, { ...init, headers: { ...auth, ...(init.body ? { 'content-type': 'application/json' } : {}), ...(init.headers as Record<string, string>) } });
    return { status: res.status, type: res.headers.get('content-type') ?? '', body: res.headers.get('content-type')?.includes('json') ? await res.json() : Buffer.from(await res.arrayBuffer()) };
  };
  const up = await json('/v1/files?filename=notes.txt', { method: 'POST', body: 'hello files', headers: { 'content-type': 'text/plain' } });
  assert.equal(up.status, 200);
  assert.equal(up.body.object, 'file');
  assert.equal(up.body.bytes, 11);
  const listed = await json('/v1/files');
  assert.equal(listed.status, 200);
  assert.deepEqual(listed.body.data.map((f: { id: string }) => f.id), [up.body.id]);
  assert.equal((await json('/v1/skills')).body.object, 'list');
  const vs = await json('/v1/vector_stores', { method: 'POST', body: JSON.stringify({ name: 'docs' }) });
  assert.equal(vs.status, 200);
  assert.match(vs.body.id, /^vs-/);
  const missing = await json('/v1/vector_stores', { method: 'POST', body: '{}' });
  assert.equal(missing.status, 422, 'FastAPI-style validation error');
  assert.deepEqual(missing.body.detail[0].loc, ['body', 'name']);
  assert.equal((await json('/v1/sandbox/run', { method: 'POST', body: JSON.stringify({ code: 'print(1)' }) })).body.status, 'completed');
  assert.equal((await json('/v1/route', { method: 'POST', body: JSON.stringify({ input: 'hi' }) })).body.model, 'demo-chat');
  const pdf = await json('/v1/pdf', { method: 'POST', body: JSON.stringify({ html: '<h1>Invoice</h1><img src="data:image/png;base64,AAAA">' }) });
  assert.equal(pdf.status, 200);
  assert.equal(pdf.type, 'application/pdf');
  assert.equal((pdf.body as Buffer).subarray(0, 5).toString(), '%PDF-');
  const guarded = await json('/v1/pdf', { method: 'POST', body: JSON.stringify({ html: '<img src="https://tracker.example/p.gif">' }) });
  assert.equal(guarded.status, 400);
  assert.match(guarded.body.detail, /https:\/\/tracker\.example\/p\.gif/);
  const typo = await json('/v1/files/nope/nope');
  assert.deepEqual({ status: typo.status, body: typo.body }, { status: 404, body: { detail: 'Not Found' } });

  proc.child.kill('SIGINT');
  const code = await new Promise<number | null>((resolve) => proc.child.on('exit', (c) => resolve(c)));
  assert.equal(code, 0);
});
