// Runs the demo tool backends as one process (started by `npm start`): the MCP server and the demo
// backend of the other tool families, on free loopback ports. Prints one line per backend:
//   demo backend mcp listening on http://127.0.0.1:PORT
//   demo backend tools listening on http://127.0.0.1:PORT
import { startDemoMcpServer } from './mcp-server.js';
import { startDemoToolBackend } from './tool-backend.js';

async function main(): Promise<void> {
  const host = process.env.TOLLGATE_DEMO_BACKENDS_HOST ?? '127.0.0.1';
  // Fixed ports for container deployments (compose.yaml); 0, a free port, otherwise.
  const port = (name: string) => Number(process.env[name] ?? 0);
  const [mcp, tools] = await Promise.all([startDemoMcpServer(host, port('TOLLGATE_DEMO_MCP_PORT')), startDemoToolBackend(host, port('TOLLGATE_DEMO_TOOLS_PORT'))]);
  console.log(`demo backend mcp listening on ${mcp.url}`);
  console.log(`demo backend tools listening on ${tools.url}`);
  const stop = () => {
    Promise.allSettled([mcp.close(), tools.close()]).finally(() => process.exit(0));
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

main().catch((err: Error) => {
  console.error(`demo backends failed: ${err.message}`);
  process.exit(1);
});
