// The MCP SDK's own client, over the streamable HTTP transport with the key in an Authorization
// header, talks through the gateway to a real MCP SDK server (the demo MCP backend `npm start` runs):
// initialize (a session is opened and its id passes both ways), list tools, call tools, and a call
// whose answer streams as SSE with progress notifications arriving while the tool runs.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { startDemoMcpServer, type DemoMcpServer } from '../../cli/demo-backends/mcp-server.js';
import { startToolGateway } from '../helpers/tool-gateway.js';
import { stopAll, type DataPlane } from '../helpers/processes.js';

let mcp: DemoMcpServer;
let node: DataPlane;
let key: string;

before(async () => {
  mcp = await startDemoMcpServer();
  ({ node, key } = await startToolGateway([{ prefix: '/v1/mcp', base_urls: [mcp.url], header_timeout_ms: 10_000, idle_timeout_ms: 30_000 }]));
});
after(async () => {
  await stopAll();
  await mcp?.close();
});

interface Seen {
  method: string;
  status: number;
  contentType: string;
}

/** A client of the gateway's /v1/mcp with the key; `seen` records what each HTTP exchange answered. */
function mcpClient(authorization: string | null, seen: Seen[] = []): { client: Client; transport: StreamableHTTPClientTransport } {
  const transport = new StreamableHTTPClientTransport(new URL(`${node.url}/v1/mcp`), {
    requestInit: { headers: authorization ? { Authorization: authorization } : {} },
    fetch: async (url, init) => {
      const res = await fetch(url, init);
      seen.push({ method: init?.method ?? 'GET', status: res.status, contentType: res.headers.get('content-type') ?? '' });
      return res;
    },
  });
  return { client: new Client({ name: 'tollgate-test', version: '1.0.0' }), transport };
}

test('the MCP SDK client initializes, lists tools and calls them through the gateway, with a streamed answer', { timeout: 60_000 }, async () => {
  const seen: Seen[] = [];
  const { client, transport } = mcpClient(`Bearer ${key}`, seen);
  await client.connect(transport);
  try {
    assert.equal(client.getServerVersion()?.name, 'tollgate-demo-mcp');
    assert.match(String(transport.sessionId), /^[0-9a-f-]{36}$/, 'the session id came back through the gateway');

    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ['add', 'countdown', 'echo']);

    const sum = await client.callTool({ name: 'add', arguments: { a: 2, b: 40 } });
    assert.deepEqual(sum.content, [{ type: 'text', text: '42' }]);
    const echo = await client.callTool({ name: 'echo', arguments: { text: 'héllo through the gateway' } });
    assert.deepEqual(echo.content, [{ type: 'text', text: 'héllo through the gateway' }]);

    // Streamed: progress notifications arrive while the tool still runs, before its result.
    const n = 5;
    const intervalMs = 100;
    const progressAt: number[] = [];
    const before = seen.length;
    const result = await client.callTool({ name: 'countdown', arguments: { n, interval_ms: intervalMs } }, undefined, {
      onprogress: (p) => {
        assert.equal(p.total, n);
        progressAt.push(Date.now());
      },
    });
    const resultAt = Date.now();
    assert.deepEqual(result.content, [{ type: 'text', text: 'liftoff' }]);
    assert.equal(progressAt.length, n, 'every progress notification arrived');
    // The server waits intervalMs after each notification, so a stream passed through as it is written
    // delivers the first one at least (n - 1) intervals before the result; a buffered one, together.
    assert.ok(resultAt - progressAt[0] >= (n - 1) * intervalMs * 0.8, `first progress ${resultAt - progressAt[0]} ms before the result`);
    const call = seen.slice(before).find((s) => s.method === 'POST');
    assert.ok(call, 'the call was one POST');
    assert.equal(call.status, 200);
    assert.match(call.contentType, /^text\/event-stream/, 'the answer was an SSE stream');
  } finally {
    await transport.terminateSession().catch(() => {});
    await client.close();
  }
});

test('an MCP client without the key, or with a wrong one, is refused with 401 before the MCP server sees it', { timeout: 60_000 }, async () => {
  for (const auth of [null, 'Bearer sk-tollgate-wrong']) {
    const seen: Seen[] = [];
    const { client, transport } = mcpClient(auth, seen);
    await assert.rejects(client.connect(transport));
    assert.equal(seen[0]?.status, 401);
    assert.match(seen[0].contentType, /application\/json/);
    await client.close().catch(() => {});
  }
});
