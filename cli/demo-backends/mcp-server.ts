// The demo MCP backend `npm start` runs behind `/v1/mcp`: a real MCP server built with
// @modelcontextprotocol/sdk, speaking the streamable HTTP transport with sessions, serving three small
// tools. `countdown` reports progress while it runs, so its answer streams (SSE) through the gateway.
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, ListToolsRequestSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';

export const MCP_PATH = '/v1/mcp';
const MAX_SESSIONS = 1000;
const SESSION_IDLE_MS = 10 * 60_000;
const MAX_BODY_BYTES = 1024 * 1024;

const TOOLS = [
  {
    name: 'echo',
    description: 'Returns the text it is given.',
    inputSchema: { type: 'object' as const, properties: { text: { type: 'string' } }, required: ['text'] },
  },
  {
    name: 'add',
    description: 'Adds two numbers.',
    inputSchema: { type: 'object' as const, properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] },
  },
  {
    name: 'countdown',
    description: 'Counts down from n (at most 20), reporting progress at every step, then says "liftoff".',
    inputSchema: { type: 'object' as const, properties: { n: { type: 'integer', minimum: 1, maximum: 20 }, interval_ms: { type: 'integer', minimum: 0, maximum: 1000 } }, required: ['n'] },
  },
];

function text(t: string, isError = false): CallToolResult {
  return { content: [{ type: 'text', text: t }], isError };
}

/** One MCP server per session (the SDK's Server is bound to one transport). */
function newMcpServer(): Server {
  const server = new Server({ name: 'tollgate-demo-mcp', version: '1.0.0' }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (req, extra): Promise<CallToolResult> => {
    const args = (req.params.arguments ?? {}) as Record<string, unknown>;
    switch (req.params.name) {
      case 'echo':
        if (typeof args.text !== 'string') return text('echo needs a string argument "text".', true);
        return text(args.text);
      case 'add':
        if (typeof args.a !== 'number' || typeof args.b !== 'number') return text('add needs two numbers "a" and "b".', true);
        return text(String(args.a + args.b));
      case 'countdown': {
        const n = args.n;
        if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 20) return text('countdown needs an integer "n" from 1 to 20.', true);
        const interval = typeof args.interval_ms === 'number' ? Math.min(1000, Math.max(0, args.interval_ms)) : 50;
        const token = req.params._meta?.progressToken;
        for (let i = n; i > 0; i--) {
          if (extra.signal.aborted) return text('cancelled', true);
          if (token !== undefined) {
            await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: n - i + 1, total: n, message: String(i) } });
          }
          await new Promise((r) => setTimeout(r, interval));
        }
        return text('liftoff');
      }
      default:
        return text(`Unknown tool: ${req.params.name}`, true);
    }
  });
  return server;
}

interface Session {
  transport: StreamableHTTPServerTransport;
  server: Server;
  lastUsedMs: number;
}

function sendDetail(res: ServerResponse, status: number, detail: unknown): void {
  const body = JSON.stringify({ detail });
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > MAX_BODY_BYTES) throw Object.assign(new Error('too large'), { status: 413 });
    parts.push(c as Buffer);
  }
  try {
    return JSON.parse(Buffer.concat(parts).toString('utf8'));
  } catch {
    throw Object.assign(new Error('invalid JSON'), { status: 400 });
  }
}

export interface DemoMcpServer {
  url: string;
  close(): Promise<void>;
}

export async function startDemoMcpServer(host = '127.0.0.1', port = 0): Promise<DemoMcpServer> {
  const sessions = new Map<string, Session>();
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [id, s] of sessions) if (now - s.lastUsedMs > SESSION_IDLE_MS) void closeSession(id);
  }, 60_000);
  sweep.unref();

  async function closeSession(id: string): Promise<void> {
    const s = sessions.get(id);
    if (!s) return;
    sessions.delete(id);
    await s.transport.close().catch(() => {});
    await s.server.close().catch(() => {});
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '').split('?')[0];
    if (path !== MCP_PATH) return sendDetail(res, 404, 'Not Found');
    const sid = req.headers['mcp-session-id'];
    const id = typeof sid === 'string' ? sid : undefined;
    if (id !== undefined) {
      const s = sessions.get(id);
      if (!s) return sendDetail(res, 404, 'Unknown or expired MCP session; initialize again.');
      s.lastUsedMs = Date.now();
      const body = req.method === 'POST' ? await readJson(req) : undefined;
      await s.transport.handleRequest(req, res, body);
      return;
    }
    // No session: only an initialize request may open one.
    if (req.method !== 'POST') return sendDetail(res, 400, 'Missing mcp-session-id header; send an initialize request first.');
    const body = await readJson(req);
    if (sessions.size >= MAX_SESSIONS) return sendDetail(res, 503, 'Too many MCP sessions on the demo server; retry later.');
    const server = newMcpServer();
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (newId) => {
        sessions.set(newId, { transport, server, lastUsedMs: Date.now() });
      },
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  }

  const http: HttpServer = createServer((req, res) => {
    handle(req, res).catch((err: Error & { status?: number }) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      sendDetail(res, err.status ?? 500, err.status === 413 ? 'Request body too large.' : err.status === 400 ? 'Invalid JSON body.' : 'Internal Server Error');
    });
  });
  await new Promise<void>((resolve, reject) => {
    http.once('error', reject);
    http.listen(port, host, () => resolve());
  });
  const addr = http.address() as AddressInfo;
  return {
    url: `http://${host}:${addr.port}`,
    async close() {
      clearInterval(sweep);
      await Promise.all([...sessions.keys()].map((id) => closeSession(id)));
      http.closeAllConnections();
      await new Promise<void>((resolve) => http.close(() => resolve()));
    },
  };
}
